package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"

	"chessd/domain"
)

// Listener wraps the server's listener so that the answers net/http writes by itself,
// before any handler runs, reach the client as problem+json like every other error:
// a request line or header it cannot read (400), headers over the server's
// MaxHeaderBytes (431), a Transfer-Encoding it does not implement (501), an HTTP
// version it does not speak (505) and an Expect other than 100-continue (417).
//
// net/http writes those straight to the connection in one Write each, in a fixed
// form: a status line and exactly the headers below, with no Date (which every
// response made through a ResponseWriter carries). The connection recognises that
// form and writes a problem instead. 417 is the exception, written through a
// ResponseWriter but with a status no handler here ever uses.
func (s *Server) Listener(ln net.Listener) net.Listener {
	return &problemListener{Listener: ln, s: s}
}

// netHTTPErrorHeaders are the headers of every error net/http writes by itself.
const netHTTPErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

type problemListener struct {
	net.Listener
	s *Server
}

func (l *problemListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &problemConn{Conn: c, s: l.s}, nil
}

type problemConn struct {
	net.Conn
	s *Server
}

// Write passes everything through but net/http's own error answers, which it
// replaces by a problem. It reports the length of what it was given, as callers expect.
func (c *problemConn) Write(b []byte) (int, error) {
	status, detail, ok := netHTTPError(b)
	if !ok {
		return c.Conn.Write(b)
	}
	if _, err := c.Conn.Write(c.s.rawProblem(status, detail, c.RemoteAddr())); err != nil {
		return 0, err
	}
	return len(b), nil
}

// CloseWrite keeps the half-close net/http does after a 431 (so that the client reads
// the answer before the connection is reset), which wrapping would otherwise hide.
func (c *problemConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// netHTTPError recognises an error answer written by net/http itself and returns its
// status and what it says.
func netHTTPError(b []byte) (status int, detail string, ok bool) {
	const prefix = "HTTP/1.1 "
	if len(b) < len(prefix)+3 || !bytes.HasPrefix(b, []byte(prefix)) {
		return 0, "", false
	}
	status, err := strconv.Atoi(string(b[len(prefix) : len(prefix)+3]))
	if err != nil || status < 400 {
		return 0, "", false
	}
	line, rest, found := bytes.Cut(b, []byte("\r\n"))
	if status == http.StatusExpectationFailed {
		return status, "", true
	}
	if !found || !bytes.HasPrefix(rest, []byte(netHTTPErrorHeaders[2:])) {
		return 0, "", false
	}
	// "HTTP/1.1 400 Bad Request: missing required Host header" carries a reason.
	_, reason, _ := bytes.Cut(line[len(prefix):], []byte(": "))
	return status, string(reason), true
}

// netHTTPProblems say what each of net/http's own refusals means.
var netHTTPProblems = map[int]struct {
	code   domain.Code
	detail string
}{
	http.StatusBadRequest:                  {domain.CodeInvalid, "the request could not be read as HTTP"},
	http.StatusRequestHeaderFieldsTooLarge: {codeHeadersTooLarge, fmt.Sprintf("the request line and headers are over %d bytes", MaxHeaderBytes)},
	http.StatusNotImplemented:              {codeNotImplemented, "the request's Transfer-Encoding is not supported (chunked is)"},
	http.StatusHTTPVersionNotSupported:     {codeHTTPVersion, "the request's HTTP version is not supported (HTTP/1.0 and HTTP/1.1 are)"},
	http.StatusExpectationFailed:           {codeExpectation, "the Expect header is not met (only 100-continue is)"},
}

// rawProblem is a whole HTTP response carrying the problem for one of net/http's
// refusals; it closes the connection, as net/http does after them.
func (s *Server) rawProblem(status int, reason string, remote net.Addr) []byte {
	np, ok := netHTTPProblems[status]
	if !ok {
		np.code, np.detail = domain.CodeInvalid, http.StatusText(status)
	}
	kind := problemKinds[np.code]
	id := newRequestID()
	p := Problem{Type: s.problemType(kind.slug), Title: kind.title, Status: kind.status, NextAction: kind.next,
		Detail: np.detail, RequestID: id}
	switch {
	case reason != "":
		p.Detail += ": " + reason
	case status == http.StatusBadRequest:
		p.Detail += " (a malformed request line or header)"
	}
	if np.code == domain.CodeInvalid && status != http.StatusBadRequest {
		p.Status = status // a refusal net/http added after this was written: keep its status
	}
	body, _ := json.Marshal(p) //nolint:errchkjson // plain strings and ints
	body = append(body, '\n')
	s.logger.Info("request", "request_id", id, "status", p.Status, "remote", remote.String(), "refused_by", "net/http", "detail", p.Detail)
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: application/problem+json\r\nCache-Control: no-store\r\n"+
		"X-Request-Id: %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		p.Status, http.StatusText(p.Status), id, len(body), body)
}
