package httpapi

import (
	"net/http"

	"chessd/domain"
)

// MaxHeaderBytes bounds a request's line and headers together; above it the answer is
// 431 problem+json.
const MaxHeaderBytes = 32 << 10

// ServerMaxHeaderBytes is the value for http.Server.MaxHeaderBytes. It is above
// MaxHeaderBytes so that the door refuses most oversized requests itself, with a whole
// problem (request id, instance, access log); only bigger ones are cut short by
// net/http, whose plain-text answer Listener rewrites.
const ServerMaxHeaderBytes = 2 * MaxHeaderBytes

// Codes of the refusals made before a handler runs.
const (
	codeHeadersTooLarge domain.Code = "headers_too_large"
	codeNotImplemented  domain.Code = "not_implemented"
	codeHTTPVersion     domain.Code = "http_version"
	codeExpectation     domain.Code = "expectation_failed"
)

// door refuses what must never reach a handler: headers over MaxHeaderBytes, and a
// path or query holding invalid UTF-8 or control characters (domain.TextProblem).
// Path ids are looked up in PostgreSQL, which refuses NUL and invalid UTF-8 in text,
// so without this a request for /v1/jobs/%00 would fail as a 500.
func door(r *http.Request) error {
	if n := headerBytes(r); n > MaxHeaderBytes {
		return domain.Errorf(codeHeadersTooLarge, "the request line and headers are %d bytes; at most %d are accepted", n, MaxHeaderBytes)
	}
	var p domain.Problems
	if reason := domain.TextProblem(r.URL.Path, false); reason != "" {
		p.Add("path", "the path "+reason)
	}
	if r.URL.RawQuery == "" {
		return p.Err()
	}
	for name, values := range r.URL.Query() {
		if reason := domain.TextProblem(name, false); reason != "" {
			p.Add("query", "a parameter name "+reason)
			continue
		}
		for _, v := range values {
			if reason := domain.TextProblem(v, false); reason != "" {
				p.Add(name, reason)
			}
		}
	}
	return p.Err()
}

// headerBytes is the size of the request line and headers as sent, give or take the
// spelling of header names.
func headerBytes(r *http.Request) int {
	n := len(r.Method) + len(r.RequestURI) + len(r.Proto) + len("  \r\nHost: \r\n\r\n") + len(r.Host)
	for name, values := range r.Header {
		for _, v := range values {
			n += len(name) + len(v) + len(": \r\n")
		}
	}
	return n
}
