package httpapi

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/gorilla/mux"

	"chessd/domain"
	"chessd/openapi"
)

// declared is what the OpenAPI document declares of a route's operation: the query
// parameters it takes and whether it takes a body. Every route under /v1 passes
// through declaredOnly, which refuses the rest with one rule for all of them (400
// naming each): a query parameter the operation does not declare, a parameter given
// twice, a query that does not parse, and a body sent to an operation that declares
// none. The handlers then read one value per parameter and never meet another.
type declared struct {
	op    string          // "GET /keys", as the document names it
	query map[string]bool // the query parameters it takes
	takes string          // those, in the document's order, for a refusal: "(env)"
	body  bool            // it declares a request body
}

// singleHeaders are the request headers the API reads one value of (net/http's
// canonical key, and the name a refusal gives): each may be sent once. Header.Get
// reads the first field line and ignores the others, so that two Authorization lines
// holding the keys of two accounts were answered as the first, and two Last-Event-ID
// lines resumed after the first: as for a query parameter, no first or last one wins.
// (A comma-joined value, as a proxy may make of two lines, is no valid value of any
// of them: a key, an Idempotency-Key, an event id hold no ", ".)
var singleHeaders = [...]struct{ key, name string }{
	{"Authorization", "Authorization"},
	{"Idempotency-Key", "Idempotency-Key"},
	{"Last-Event-Id", "Last-Event-ID"},
}

// repeatedHeader says whether r holds one of singleHeaders more than once.
func repeatedHeader(r *http.Request) bool {
	for _, h := range singleHeaders {
		if len(r.Header[h.key]) > 1 {
			return true
		}
	}
	return false
}

// declaredOnly runs h when r holds only what d declares, and no header the API reads
// one value of more than once. A request without a query string costs nothing more
// here, nor does one with a body where a body is declared.
func (s *Server) declaredOnly(d *declared, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.RawQuery == "" && (d.body || r.ContentLength == 0) && !repeatedHeader(r) {
			h(w, r)
			return
		}
		if err := d.check(r); err != nil {
			s.writeError(w, r, err)
			return
		}
		h(w, r)
	}
}

// check reports every undeclared, repeated or unreadable parameter, every repeated
// single-value header, and a body where none is declared, in one refusal.
func (d *declared) check(r *http.Request) error {
	var p domain.Problems
	for _, h := range singleHeaders {
		if n := len(r.Header[h.key]); n > 1 {
			p.Add(h.name, fmt.Sprintf("is given %d times; send it once (no first or last one is taken)", n))
		}
	}
	if r.URL.RawQuery != "" {
		q, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			// url.Values drops what it cannot read ("a=1;b=2", "%zz=1"): that part of
			// the query would be ignored without a word
			p.Add("query", fmt.Sprintf("is malformed (%v); separate parameters with & and escape %% as %%25", err))
		}
		for _, name := range slices.Sorted(maps.Keys(q)) {
			switch {
			case name == "":
				p.Add("query", "holds a parameter without a name")
			case !d.query[name]:
				p.Add(name, "is not a parameter of "+d.op+d.takes)
			case len(q[name]) > 1:
				p.Add(name, "is given more than once")
			}
		}
	}
	if !d.body {
		given, err := bodyGiven(r)
		if err != nil {
			return err
		}
		if given {
			p.Add("body", "must be empty: "+d.op+" takes no request body")
		}
	}
	return p.Err()
}

// bodyGiven reports whether r carries a body of at least one byte; a body of unknown
// length (chunked) is peeked at.
func bodyGiven(r *http.Request) (bool, error) {
	switch {
	case r.ContentLength > 0:
		return true, nil
	case r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody:
		return false, nil
	}
	var b [1]byte
	n, err := io.ReadFull(r.Body, b[:])
	switch {
	case n > 0:
		return true, nil
	case errors.Is(err, io.EOF):
		r.Body = http.NoBody
		return false, nil
	}
	return false, decodeReadError(err)
}

// declareRoutes fills each route's declared from the OpenAPI document (package
// openapi): routes maps every route made by routes' handle to its declared. The
// document and the routes must describe the same operations: a documented operation
// no route takes, or a route the document does not have, is a programming error.
func declareRoutes(router *mux.Router, routes map[*mux.Route]*declared) {
	ops, err := openapi.Operations()
	if err != nil {
		panic("httpapi: " + err.Error())
	}
	for _, op := range ops {
		// the template matches its own route: {id} is a path segment like any other
		probe := &http.Request{Method: op.Method, URL: &url.URL{Path: "/v1" + op.Path}, Header: http.Header{}}
		var m mux.RouteMatch
		if !router.Match(probe, &m) || m.MatchErr != nil {
			panic(fmt.Sprintf("httpapi: the OpenAPI document's %s %s has no route", op.Method, op.Path))
		}
		d, ok := routes[m.Route]
		if !ok || d.op != "" {
			panic(fmt.Sprintf("httpapi: the OpenAPI document's %s %s is routed to a route of no one operation", op.Method, op.Path))
		}
		d.op, d.body, d.query = op.Method+" "+op.Path, op.Body, map[string]bool{}
		for _, name := range op.Query {
			d.query[name] = true
		}
		d.takes = ", which takes none"
		if len(op.Query) > 0 {
			d.takes = " (" + strings.Join(op.Query, ", ") + ")"
		}
	}
	for route, d := range routes {
		if d.op == "" {
			t, _ := route.GetPathTemplate()
			ms, _ := route.GetMethods()
			panic(fmt.Sprintf("httpapi: the route %s %s is not in the OpenAPI document", strings.Join(ms, ","), t))
		}
	}
}
