package httpapi_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"chessd/httpapi"
)

// listen serves e's API the way chessd serve does: a real listener wrapped by
// Listener, and net/http's header limit above the door's.
func listen(t *testing.T, e *env) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: e.checked, MaxHeaderBytes: httpapi.ServerMaxHeaderBytes, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(e.api.Listener(ln)) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// rawExchange writes raw bytes on a fresh connection and reads the answers, one per
// request expected.
func rawExchange(t *testing.T, addr, raw string, answers int) []*http.Response {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(20 * time.Second)) //nolint:errcheck // a test bound
	go func() {
		// the server may stop reading (431) and close while this still writes
		io.WriteString(conn, raw) //nolint:errcheck // see above
	}()
	br := bufio.NewReader(conn)
	var out []*http.Response
	for range answers {
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("reading the answer to %.60q: %v", raw, err)
		}
		body, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		res.Body = io.NopCloser(strings.NewReader(string(body)))
		out = append(out, res)
	}
	return out
}

// wantRawProblem checks a problem+json answer read off the wire.
func wantRawProblem(t *testing.T, res *http.Response, status int, detail string) map[string]any {
	t.Helper()
	raw, _ := io.ReadAll(res.Body)
	if res.StatusCode != status || res.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("%s %s: %s", res.Status, res.Header.Get("Content-Type"), raw)
	}
	var p map[string]any
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatalf("not JSON: %q", raw)
	}
	typ, _ := p["type"].(string)
	if p["status"] != float64(status) || p["next_action"] != "fix_request" || !strings.HasPrefix(typ, "http://chessd.test/v1/problems/") ||
		p["title"] == "" || p["request_id"] == "" || !strings.Contains(p["detail"].(string), detail) {
		t.Fatalf("problem %s", raw)
	}
	return p
}

// TestNetHTTPErrorsAreProblems sends what net/http refuses before any handler runs,
// over real TCP, and expects problem+json with the right status.
func TestNetHTTPErrorsAreProblems(t *testing.T) {
	e := newEnv(t)
	addr := listen(t, e)
	big := func(n int) string { return strings.Repeat("a", n) }
	tests := []struct {
		name, raw string
		status    int
		detail    string
	}{
		{"malformed request line", "GARBAGE\r\n\r\n", 400, "could not be read as HTTP"},
		{"no Host", "GET /v1/healthz HTTP/1.1\r\n\r\n", 400, "missing required Host header"},
		{"bad header name", "GET /v1/healthz HTTP/1.1\r\nHost: x\r\nBad Name: y\r\n\r\n", 400, "could not be read"},
		{"NUL in a header", "GET /v1/healthz HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", 400, "could not be read"},
		{"bad escape in the path", "GET /v1/jobs/%zz HTTP/1.1\r\nHost: x\r\n\r\n", 400, "could not be read"},
		{"headers over net/http's limit", "GET /v1/healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + big(3*httpapi.MaxHeaderBytes) + "\r\n\r\n",
			431, "over 32768 bytes"},
		{"headers over the door's limit", "GET /v1/healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + big(httpapi.MaxHeaderBytes+10) + "\r\n\r\n",
			431, "at most 32768"},
		{"transfer encoding", "POST /v1/signup HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "Transfer-Encoding"},
		{"HTTP version", "GET /v1/healthz HTTP/2.7\r\nHost: x\r\n\r\n", 505, "HTTP version"},
		{"Expect", "GET /v1/healthz HTTP/1.1\r\nHost: x\r\nExpect: tea\r\n\r\n", 417, "Expect"},
		{"NUL in a path id", "GET /v1/jobs/%00 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "control character U+0000"},
		{"invalid UTF-8 in a path id", "GET /v1/keys/%FF HTTP/1.1\r\nHost: x\r\n\r\n", 400, "not valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantRawProblem(t, rawExchange(t, addr, tt.raw, 1)[0], tt.status, tt.detail)
		})
	}
	t.Run("a later HTTP/1 minor version is served as 1.1", func(t *testing.T) { // RFC 9110, 2.5
		res := rawExchange(t, addr, "GET /v1/healthz HTTP/1.9\r\nHost: x\r\n\r\n", 1)
		if res[0].StatusCode != 200 {
			t.Fatalf("HTTP/1.9: %s", res[0].Status)
		}
	})
	t.Run("a good request, then a bad one on the same connection", func(t *testing.T) {
		res := rawExchange(t, addr, "GET /v1/healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/healthz HTTP/1.1\r\nBad Name: y\r\n\r\n", 2)
		if body, _ := io.ReadAll(res[0].Body); res[0].StatusCode != 200 || !strings.Contains(string(body), `"ok"`) {
			t.Fatalf("first answer %s %s", res[0].Status, body)
		}
		wantRawProblem(t, res[1], 400, "could not be read")
	})
}
