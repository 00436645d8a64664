package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"time"

	"chessd/analysis"
	"chessd/engine"
	"chessd/ledger"
)

// Live evaluation (docs/API.md): POST /eval and /bestmove with Accept:
// text/event-stream or application/x-ndjson stream one `depth` event per depth the
// search completes, then the `result` event, whose data is byte for byte the plain
// answer's body. Everything else is the plain call's path (costed): the same price
// reserved before the search, the same settle once the answer exists; a client that
// leaves stops the search and is not charged.
//
// The response starts with the first event: what fails before it (validation, auth,
// 402, 503 while waiting for an engine) is an ordinary problem+json with its status;
// what fails after it is an `error` event carrying the problem document, and ends the
// stream.

// keepAliveEvery is how often an SSE stream that has started but has nothing to say
// sends a comment, so that proxies do not close it during a long depth.
const keepAliveEvery = 15 * time.Second

// eventStream writes one streamed answer.
type eventStream struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	media   string // mediaSSE or mediaNDJSON
	started bool   // the 200 and its headers are sent
	gone    bool   // a write failed: the client left
}

// newEventStream is the request's stream, or nil when it asked for plain JSON.
func newEventStream(w http.ResponseWriter, r *http.Request) *eventStream {
	media := streamMedia(acceptOf(r))
	if media == "" {
		return nil
	}
	return &eventStream{w: w, rc: http.NewResponseController(w), media: media}
}

func (st *eventStream) live() bool { return st != nil && st.started }

func (st *eventStream) start() {
	if st.started {
		return
	}
	st.started = true
	h := st.w.Header()
	h.Set("Content-Type", st.media)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // nginx would buffer the stream otherwise
	st.w.WriteHeader(http.StatusOK)
}

// event sends one event and flushes it. data is compact JSON (no newline): in SSE one
// `data:` line, in NDJSON the line {"event": name, "data": data}.
func (st *eventStream) event(name string, data []byte) error {
	if st.gone {
		return context.Canceled
	}
	st.start()
	b := make([]byte, 0, len(data)+32)
	if st.media == mediaSSE {
		b = append(b, "event: "...)
		b = append(b, name...)
		b = append(b, "\ndata: "...)
		b = append(b, data...)
		b = append(b, "\n\n"...)
	} else {
		b = append(b, `{"event":"`...)
		b = append(b, name...)
		b = append(b, `","data":`...)
		b = append(b, data...)
		b = append(b, "}\n"...)
	}
	if _, err := st.w.Write(b); err != nil {
		st.gone = true
		return err
	}
	if err := st.rc.Flush(); err != nil {
		st.gone = true
		return err
	}
	return nil
}

// keepAlive sends an SSE comment (NDJSON has none).
func (st *eventStream) keepAlive() {
	if !st.started || st.gone || st.media != mediaSSE {
		return
	}
	if _, err := st.w.Write([]byte(": keep-alive\n\n")); err != nil {
		st.gone = true
		return
	}
	if err := st.rc.Flush(); err != nil {
		st.gone = true
	}
}

// fail answers err: a problem+json response before the stream started, an `error`
// event after (nothing when the client has left).
func (s *Server) fail(w http.ResponseWriter, r *http.Request, st *eventStream, err error) {
	if !st.live() {
		s.writeError(w, r, err)
		return
	}
	if st.gone || r.Context().Err() != nil {
		return
	}
	var pw problemWriter
	s.writeError(&pw, r, err)
	st.event("error", bytes.TrimSpace(pw.body.Bytes())) //nolint:errcheck // the stream ends here anyway
}

// replayTo answers a repeated Idempotency-Key: a stream gets the stored answer as its
// only event.
func (s *Server) replayTo(w http.ResponseWriter, st *eventStream, first ledger.Stored) {
	if st == nil || first.Status != http.StatusOK {
		s.replay(w, first)
		return
	}
	w.Header().Set("Idempotent-Replayed", "true")
	st.event("result", first.Response) //nolint:errcheck // the client went away
}

// search runs the costed call's search; with a stream, it sends each completed depth
// as it arrives, and stops the search (stop) when the client can no longer be written to.
func (s *Server) search(ctx context.Context, stop context.CancelFunc, spec analysis.Spec, st *eventStream) (*analysis.Result, error) {
	if st == nil {
		return s.analysis.Analyse(ctx, spec, engine.Interactive, false)
	}
	// A search reports at most one event per depth, and its depth is bounded: with room
	// for them all, the engine's reader never waits for this client.
	progress := make(chan *analysis.Progress, spec.Depth+1)
	type outcome struct {
		res *analysis.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := s.analysis.AnalyseProgress(ctx, spec, engine.Interactive, false, func(p *analysis.Progress) {
			select {
			case progress <- p:
			default: // cannot happen (see above); never block the engine
			}
		})
		done <- outcome{res, err}
	}()
	send := func(p *analysis.Progress) {
		data, err := json.Marshal(p)
		if err == nil {
			err = st.event("depth", data)
		}
		if err != nil {
			stop() // the client left: stop the search, nothing is charged
		}
	}
	keepAlive := time.NewTicker(keepAliveEvery)
	defer keepAlive.Stop()
	for {
		select {
		case p := <-progress:
			send(p)
		case <-keepAlive.C:
			st.keepAlive()
		case o := <-done:
			// The engine reports every depth before it returns: send what is left.
			for {
				select {
				case p := <-progress:
					send(p)
				default:
					if o.err == nil && st.gone {
						return nil, context.Canceled
					}
					return o.res, o.err
				}
			}
		}
	}
}

// problemWriter captures a problem+json answer to send it as an event.
type problemWriter struct {
	header http.Header
	body   bytes.Buffer
}

func (p *problemWriter) Header() http.Header {
	if p.header == nil {
		p.header = http.Header{}
	}
	return p.header
}

func (p *problemWriter) Write(b []byte) (int, error) { return p.body.Write(b) }
func (p *problemWriter) WriteHeader(int)             {}
