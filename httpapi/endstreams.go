package httpapi

import (
	"context"
	"net/http"
	"strings"
)

// EndingStreams ends, once streams is done (the server stops), every GET whose response
// is a stream (text/event-stream, application/x-ndjson: a job's event stream) by
// cancelling its request's context, so that it does not hold the server's stop. A
// costed call's stream (POST /v1/eval) is a search: it finishes and is charged. Other
// requests pass untouched.
func EndingStreams(streams context.Context, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			h.ServeHTTP(w, r)
			return
		}
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		var ending func() bool
		sw := &streamWatch{ResponseWriter: w, streaming: func() { ending = context.AfterFunc(streams, cancel) }}
		h.ServeHTTP(sw, r.WithContext(ctx))
		if ending != nil {
			ending()
		}
	})
}

// streamWatch tells, as the response's header is written, whether it starts a stream.
type streamWatch struct {
	http.ResponseWriter
	streaming func()
	checked   bool
}

func (w *streamWatch) check() {
	if w.checked {
		return
	}
	w.checked = true
	switch ct, _, _ := strings.Cut(w.Header().Get("Content-Type"), ";"); strings.TrimSpace(ct) {
	case "text/event-stream", "application/x-ndjson":
		w.streaming()
	}
}

func (w *streamWatch) WriteHeader(code int) {
	if code >= 200 {
		w.check()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *streamWatch) Write(b []byte) (int, error) {
	w.check()
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (flush, deadlines).
func (w *streamWatch) Unwrap() http.ResponseWriter { return w.ResponseWriter }
