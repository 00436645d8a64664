package httpapi

import (
	"net/http"

	"chessd/ledger"
)

// WithClaim is withClaim for the tests of package httpapi_test: h learns whether the
// request's Idempotency-Key was claimed.
func (s *Server) WithClaim(w http.ResponseWriter, r *http.Request, scope string, h func(claimed bool)) {
	s.withClaim(w, r, scope, func(st *ledger.Stored) { h(st != nil) })
}
