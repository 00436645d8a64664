package client

// Hand-written helpers beside the generated code: authentication, errors, and the live
// evaluation stream, which the generator leaves as a raw *http.Response.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// WithKey authenticates every request with an API key (`Authorization: Bearer KEY`).
// An empty key sends none: the keyless allowance of POST /eval and /bestmove.
func WithKey(key string) ClientOption {
	return WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		return nil
	})
}

// ServerURL is the API's base address from what a user typed: a scheme and host alone
// ("localhost:8080", "http://localhost:8080/") get http:// and /v1 added.
func ServerURL(s string) string {
	s = strings.TrimRight(strings.TrimSpace(s), "/")
	if s == "" {
		return ""
	}
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	if u, err := url.Parse(s); err == nil && u.Path == "" {
		s += "/v1"
	}
	return s
}

// Error makes a problem document an error: "402 Payment required: detail", then each
// invalid field the detail does not already name ("field: reason").
func (p *Problem) Error() string {
	s := fmt.Sprintf("%d %s", p.Status, p.Title)
	if p.Detail != "" {
		s += ": " + p.Detail
	}
	if p.Errors != nil {
		for _, e := range *p.Errors {
			// the server's detail is the first field's "field: reason" (and how many more)
			if fault := e.Field + ": " + e.Reason; !strings.Contains(p.Detail, fault) {
				s += "; " + fault
			}
		}
	}
	return s
}

// RetryProblem is a problem answered with a Retry-After header (429, 503): its message
// says the delay, which the detail only refers to ("retry after the Retry-After
// delay"). errors.As finds its *Problem.
type RetryProblem struct {
	*Problem
	RetryAfter time.Duration
}

func (e *RetryProblem) Error() string {
	return fmt.Sprintf("%s (Retry-After: %d s)", e.Problem.Error(), int64(e.RetryAfter.Round(time.Second)/time.Second))
}

func (e *RetryProblem) Unwrap() error { return e.Problem }

// Check is nil for a 2xx answer, else the answer's problem as an error (*Problem when
// the body is one, inside a *RetryProblem when the answer says Retry-After: errors.As
// finds the *Problem either way). Pass a generated response's HTTPResponse and Body.
func Check(res *http.Response, body []byte) error {
	if res == nil {
		return errors.New("no response")
	}
	if res.StatusCode >= 200 && res.StatusCode < 300 {
		return nil
	}
	var p Problem
	if err := json.Unmarshal(body, &p); err == nil && p.Status != 0 {
		if d, ok := RetryAfter(res.Header.Get("Retry-After")); ok {
			return &RetryProblem{Problem: &p, RetryAfter: d}
		}
		return &p
	}
	return fmt.Errorf("%s: %.200s", res.Status, body)
}

// RetryAfter reads a Retry-After header, seconds or an HTTP date; false when there is
// none or it is neither.
func RetryAfter(h string) (time.Duration, bool) {
	if h == "" {
		return 0, false
	}
	if n, err := strconv.Atoi(h); err == nil {
		return time.Duration(max(n, 0)) * time.Second, true
	}
	if t, err := http.ParseTime(h); err == nil {
		return max(time.Until(t), 0), true
	}
	return 0, false
}

// Media types of the live evaluation stream (docs/API.md, "Live evaluation"): ask for
// one in Accept.
const (
	MediaNDJSON = "application/x-ndjson"
	MediaSSE    = "text/event-stream"
)

// Accept sets the Accept header of a request: Accept(MediaNDJSON) streams POST /eval
// and /bestmove.
func Accept(media string) RequestEditorFn {
	return func(_ context.Context, req *http.Request) error {
		req.Header.Set("Accept", media)
		return nil
	}
}

// StreamEvent is one event of a live evaluation: `depth` (Data is a DepthProgress),
// `result` (the plain answer: Evaluation or BestMove) or `error` (a Problem); or of a
// job's events (GET /jobs/{id}/events), whose ID is what Last-Event-ID resumes after.
type StreamEvent struct {
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data"`
	ID    string          `json:"-"` // SSE's last event id ("" when none was sent)
}

// ReadStream reads the answer of a streamed POST /eval or /bestmove (or the SSE of GET
// /jobs/{id}/events) and calls fn with each event, in order, until the stream ends or fn
// returns an error (which ReadStream returns). It closes res.Body. An answer that is not
// a stream (a problem, or plain JSON) is returned as an error or as a single `result`
// event; a 204 (an event stream with nothing left to send) calls fn with nothing. An
// `error` event is passed to fn like the others.
//
// SSE is read as the standard has it: an event is dispatched at the blank line that
// ends it, its data lines joined by newlines, with the id last set; an event the
// stream was cut in the middle of is dropped, so its id is never reported as seen (a
// reconnect with Last-Event-ID then gets it again). An NDJSON line cut before its
// newline is an error.
func ReadStream(res *http.Response, fn func(StreamEvent) error) error {
	defer res.Body.Close()
	if res.StatusCode == http.StatusNoContent {
		return nil
	}
	media := res.Header.Get("Content-Type")
	if i := strings.IndexByte(media, ';'); i >= 0 {
		media = media[:i]
	}
	media = strings.TrimSpace(media)
	if res.StatusCode != http.StatusOK || (media != MediaNDJSON && media != MediaSSE) {
		body, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		if err != nil {
			return fmt.Errorf("reading the answer: %w", err)
		}
		if err := Check(res, body); err != nil {
			return err
		}
		return fn(StreamEvent{Event: "result", Data: body})
	}
	lines := &lineReader{r: bufio.NewReaderSize(res.Body, 64<<10)}
	if media == MediaNDJSON {
		for {
			line, err := lines.next()
			if err != nil {
				return streamEnd(err)
			}
			if len(line) == 0 {
				continue
			}
			var ev StreamEvent
			if err := json.Unmarshal(line, &ev); err != nil {
				return fmt.Errorf("stream: bad line %.80q: %w", line, err)
			}
			if err := fn(ev); err != nil {
				return err
			}
		}
	}
	var name, id string // the pending event's name; the last id set (kept until another, as EventSource does)
	var data []byte
	pending := false // a data line since the last dispatch
	for {
		line, err := lines.next()
		if errors.Is(err, io.EOF) && pending {
			err = io.ErrUnexpectedEOF // the stream ended inside an event: dropped, said
		}
		if err != nil {
			return streamEnd(err)
		}
		if len(line) == 0 { // the event's end: dispatch it
			if pending {
				if err := fn(StreamEvent{Event: name, Data: json.RawMessage(data), ID: id}); err != nil {
					return err
				}
			}
			name, data, pending = "", nil, false
			continue
		}
		field, value, _ := strings.Cut(string(line), ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "": // a comment (keep-alive)
		case "event":
			name = value
		case "data":
			if pending {
				data = append(data, '\n')
			}
			data, pending = append(data, value...), true
		case "id":
			if !strings.ContainsRune(value, 0) {
				id = value
			}
		}
	}
}

// streamEnd is ReadStream's outcome when its reader stops: nil at the stream's end.
func streamEnd(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return fmt.Errorf("stream: %w", err)
}

// maxStreamLine bounds one line of a stream (a depth with 10 long lines is a few KiB).
const maxStreamLine = 4 << 20

// lineReader reads a stream's lines, each ended by LF (or CRLF), which it drops.
type lineReader struct{ r *bufio.Reader }

// next returns the next whole line. io.EOF: the stream ended cleanly between lines; a
// line cut before its end (the connection dropped) is io.ErrUnexpectedEOF, or the
// read's own error.
func (l *lineReader) next() ([]byte, error) {
	var line []byte
	for {
		chunk, err := l.r.ReadSlice('\n')
		line = append(line, chunk...)
		switch {
		case err == nil:
			line = line[:len(line)-1]
			return bytes.TrimSuffix(line, []byte{'\r'}), nil
		case errors.Is(err, bufio.ErrBufferFull):
			if len(line) > maxStreamLine {
				return nil, fmt.Errorf("a line longer than %d bytes", maxStreamLine)
			}
		case errors.Is(err, io.EOF) && len(line) > 0:
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}
