package client

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// cutBody yields s, then fails as a dropped connection does.
type cutBody struct{ r io.Reader }

func (b *cutBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if errors.Is(err, io.EOF) {
		return n, io.ErrUnexpectedEOF
	}
	return n, err
}

func (b *cutBody) Close() error { return nil }

// ReadStream reads SSE as the standard has it and NDJSON line by line: what each
// stream gives fn, and whether it ends in an error.
func TestReadStream(t *testing.T) {
	for _, tc := range []struct {
		name, media, body string
		cut               bool // the connection drops after body
		status            int
		want              string // the events as name|data|id, one a line
		fails             bool
	}{
		{name: "SSE events with ids", media: MediaSSE,
			body: "retry: 1000\n\nid: 1\nevent: state\ndata: {\"a\":1}\n\n: keep-alive\n\nid: 2\nevent: end\ndata: {}\n\n",
			want: "state|{\"a\":1}|1\nend|{}|2\n"},
		{name: "SSE data on several lines is one event", media: MediaSSE,
			body: "event: x\ndata: {\"a\":\ndata: 1}\n\n", want: "x|{\"a\":\n1}|\n"},
		{name: "SSE CRLF lines", media: MediaSSE, body: "event: x\r\ndata: 1\r\n\r\n", want: "x|1|\n"},
		{name: "SSE an event name without data names nothing after the blank line", media: MediaSSE,
			body: "event: ping\n\ndata: 2\n\n", want: "|2|\n"},
		{name: "SSE an id without data is kept for the next event", media: MediaSSE,
			body: "id: 7\n\nevent: x\ndata: 1\n\n", want: "x|1|7\n"},
		{name: "SSE an event cut before its blank line is dropped", media: MediaSSE,
			body: "id: 1\nevent: state\ndata: {}\n\nid: 2\nevent: position\ndata: {\"index\"", cut: true,
			want: "state|{}|1\n", fails: true},
		{name: "SSE an event cut after its data line is dropped too", media: MediaSSE,
			body: "id: 1\nevent: state\ndata: {}\n\nid: 2\nevent: position\ndata: {}\n", cut: true,
			want: "state|{}|1\n", fails: true},
		{name: "SSE a clean end", media: MediaSSE, body: "event: x\ndata: 1\n\n", want: "x|1|\n"},
		{name: "SSE a clean end inside an event", media: MediaSSE, body: "event: x\ndata: 1\n\nevent: result\ndata: 2\n",
			want: "x|1|\n", fails: true},
		{name: "NDJSON lines", media: MediaNDJSON, body: "{\"event\":\"depth\",\"data\":1}\n\n{\"event\":\"result\",\"data\":2}\n",
			want: "depth|1|\nresult|2|\n"},
		{name: "NDJSON a line cut before its newline", media: MediaNDJSON, body: "{\"event\":\"depth\",\"data\":1}\n{\"event\":\"res", cut: true,
			want: "depth|1|\n", fails: true},
		{name: "NDJSON a last line without its newline at a clean end", media: MediaNDJSON, body: "{\"event\":\"depth\",\"data\":1}\n{\"event\":\"res",
			want: "depth|1|\n", fails: true},
		{name: "a 204 has no events", media: MediaSSE, status: http.StatusNoContent, want: ""},
		{name: "plain JSON is one result", media: "application/json", body: `{"bestmove":"e2e4"}`, want: "result|{\"bestmove\":\"e2e4\"}|\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body io.ReadCloser = io.NopCloser(strings.NewReader(tc.body))
			if tc.cut {
				body = &cutBody{strings.NewReader(tc.body)}
			}
			status := tc.status
			if status == 0 {
				status = http.StatusOK
			}
			res := &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {tc.media}}, Body: body}
			var got strings.Builder
			err := ReadStream(res, func(ev StreamEvent) error {
				fmt.Fprintf(&got, "%s|%s|%s\n", ev.Event, ev.Data, ev.ID)
				return nil
			})
			if got.String() != tc.want || (err != nil) != tc.fails {
				t.Fatalf("events:\n%s(err %v), want:\n%s(fails %v)", got.String(), err, tc.want, tc.fails)
			}
		})
	}
}
