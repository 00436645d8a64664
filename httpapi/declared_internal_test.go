package httpapi

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gorilla/mux"

	"chessd/openapi"
)

// The routes and the document describe the same operations: a route the document does
// not have, or a documented operation no route takes, stops the server being built.
func TestDeclareRoutesNeedsTheDocument(t *testing.T) {
	panics := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: no panic", name)
			}
		}()
		f()
	}
	noop := func(http.ResponseWriter, *http.Request) {}
	// every documented operation routed, and one more
	documented := func() (*mux.Router, map[*mux.Route]*declared) {
		ops, err := openapi.Operations()
		if err != nil {
			t.Fatal(err)
		}
		r, routes := mux.NewRouter(), map[*mux.Route]*declared{}
		for _, op := range ops {
			routes[r.HandleFunc("/v1"+op.Path, noop).Methods(op.Method)] = &declared{}
		}
		return r, routes
	}
	r, routes := documented()
	declareRoutes(r, routes)
	for _, d := range routes {
		if d.op == "" || d.query == nil {
			t.Fatalf("a route left undeclared: %+v", d)
		}
	}
	panics("a route the document lacks", func() {
		r, routes := documented()
		routes[r.HandleFunc("/v1/undocumented", noop).Methods("GET")] = &declared{}
		declareRoutes(r, routes)
	})
	panics("an operation no route takes", func() {
		r := mux.NewRouter()
		d := &declared{}
		declareRoutes(r, map[*mux.Route]*declared{r.HandleFunc("/v1/healthz", noop).Methods("GET"): d})
	})
}

// A request without a query string, or with a body where one is declared, costs
// nothing more than the handler.
func TestDeclaredOnlyCostsNothingWithoutAQuery(t *testing.T) {
	s := &Server{}
	calls := 0
	h := s.declaredOnly(&declared{op: "GET /x", body: false}, func(http.ResponseWriter, *http.Request) { calls++ })
	hb := s.declaredOnly(&declared{op: "POST /x", body: true}, func(http.ResponseWriter, *http.Request) { calls++ })
	get := httptest.NewRequest("GET", "/v1/x", nil)
	post := httptest.NewRequest("POST", "/v1/x", strings.NewReader(`{"fen":"x"}`))
	w := httptest.NewRecorder()
	if n := testing.AllocsPerRun(100, func() { h(w, get); hb(w, post) }); n != 0 {
		t.Fatalf("%v allocations a request", n)
	}
	if calls == 0 {
		t.Fatal("the handler did not run")
	}
}
