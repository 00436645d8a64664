package httpapi

import (
	"context"
	"net/http"
	"strings"

	"chessd/domain"
)

// bearer extracts the secret of an Authorization: Bearer header. ok is false when the
// header is absent; a present but unusable header is an error.
func bearer(r *http.Request) (secret string, ok bool, err error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return "", false, nil
	}
	scheme, value, found := strings.Cut(h, " ")
	if !found || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(value) == "" {
		return "", true, domain.Errorf(domain.CodeBadCredential, "the Authorization header must be `Bearer <API key>`")
	}
	return strings.TrimSpace(value), true, nil
}

// authenticate resolves the request's key; nil with no error means no credential.
func (s *Server) authenticate(r *http.Request) (*domain.Key, error) {
	return s.authenticateWith(r, s.auth.Authenticate)
}

// authenticateRemembered is authenticate from memory (auth.Authenticator.Remembered:
// the key's and account's versions are still checked on every call), for costed calls.
func (s *Server) authenticateRemembered(r *http.Request) (*domain.Key, error) {
	return s.authenticateWith(r, s.auth.Remembered)
}

// authenticateVouched is authenticateRemembered when memory alone can answer
// (auth.Authenticator.Vouched); vouched false: it cannot, and nothing was decided.
func (s *Server) authenticateVouched(r *http.Request) (key *domain.Key, vouched bool, err error) {
	secret, present, err := bearer(r)
	if err != nil || !present {
		return nil, false, nil // authenticateRemembered tells
	}
	key, acct, vouched, err := s.auth.Vouched(secret)
	if !vouched || err != nil {
		return nil, vouched, err
	}
	if box, _ := r.Context().Value(ctxPrincipal).(*principalBox); box != nil {
		box.key, box.account = key, acct
	}
	return key, true, nil
}

// authenticateWith resolves the request's key with auth (which may ask the database),
// unless its address has used up its bad credentials (BadKeysPerMinute), which it
// counts.
func (s *Server) authenticateWith(r *http.Request, auth func(context.Context, string) (*domain.Key, *domain.Account, error)) (*domain.Key, error) {
	secret, present, err := bearer(r)
	if err != nil || !present {
		return nil, err
	}
	addr := s.limitAddr(r)
	if err := s.heldBack(addr, secret); err != nil {
		return nil, err
	}
	key, acct, err := auth(r.Context(), secret)
	if isBadCredential(err) {
		return nil, s.countBadKey(r, addr, err)
	}
	if err != nil {
		return nil, err
	}
	if box, _ := r.Context().Value(ctxPrincipal).(*principalBox); box != nil {
		box.key, box.account = key, acct
	}
	return key, nil
}

// authed requires a key holding scope.
func (s *Server) authed(scope domain.Scope, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key, err := s.authenticate(r)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if key == nil {
			s.writeError(w, r, domain.Errorf(domain.CodeNoCredential, "this endpoint needs an API key: send Authorization: Bearer <key> (POST /v1/signup gives one)"))
			return
		}
		if !key.HasScope(scope) {
			s.writeError(w, r, domain.Errorf(domain.CodeScope, "this key lacks the scope %q that %s %s needs", scope, r.Method, r.URL.Path))
			return
		}
		if !s.rateLimit(w, r, key, scope) {
			return
		}
		h(w, r)
	}
}
