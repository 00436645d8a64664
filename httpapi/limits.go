package httpapi

import (
	"net/http"
	"time"

	"chessd/domain"
	"chessd/ratelimit"
)

// KeylessPerMinute is the request rate allowed to one address without a key.
const KeylessPerMinute = 30

// SignupsPerHour bounds the accounts one address can open, and the key recoveries it
// can ask for (each its own policy).
const SignupsPerHour = 10

// addressLimit applies a per-address limit of SignupsPerHour to the keyless calls that
// make accounts or send mail (policy "signup" or "recover"); false means it answered 429.
func (s *Server) addressLimit(w http.ResponseWriter, r *http.Request, policy string) bool {
	if s.limiter == nil {
		return true
	}
	d := s.limiter.Allow(r.Context(), "ip:"+s.limitAddr(r).String(), ratelimit.Policy{Name: policy, Limit: SignupsPerHour, Window: time.Hour})
	ratelimit.SetHeaders(w.Header(), d)
	if d.Allowed {
		return true
	}
	s.writeError(w, r, &rateLimited{d: d, per: "an hour"})
	return false
}

// rateLimit applies the caller's limit: for a key, its account's plan's requests per
// minute (or Config.KeyRequestsPerMinute), shared by every key of the account's env, so
// that more keys never buy more rate; for no key, the keyless rate of the address.
// Calls of the managing scopes (see managing) count against the calling key's own
// bucket of the same rate instead. The limits hold across every server of the database
// (package ratelimit). The RateLimit-Policy and RateLimit headers go on every answer of
// a limited endpoint, successful ones included; false means it answered 429.
func (s *Server) rateLimit(w http.ResponseWriter, r *http.Request, key *domain.Key, scope domain.Scope) bool {
	if s.limiter == nil {
		return true
	}
	var d ratelimit.Decision
	switch {
	case key == nil:
		d = s.limiter.Allow(r.Context(), "ip:"+s.limitAddr(r).String(), ratelimit.Policy{Name: "ip", Limit: KeylessPerMinute, Window: time.Minute})
	case managing(scope):
		d = s.limiter.Allow(r.Context(), "key:"+key.ID(), ratelimit.Policy{Name: "key", Limit: s.perMinute(r), Window: time.Minute})
	default:
		bucket := "acct:" + key.AccountID() + ":" + key.Env().String()
		d = s.limiter.Allow(r.Context(), bucket, ratelimit.Policy{Name: "account", Limit: s.perMinute(r), Window: time.Minute})
	}
	ratelimit.SetHeaders(w.Header(), d)
	if d.Allowed {
		return true
	}
	s.writeError(w, r, &rateLimited{d: d, per: "a minute"})
	return false
}

// managing reports whether calls needing scope manage the account (keys, billing,
// webhooks) and so count against the calling key's own bucket: a runaway eval key that
// spends the account's rate must not lock out the key that would revoke it.
func managing(scope domain.Scope) bool {
	return scope == domain.ScopeKeysWrite || scope == domain.ScopeBilling
}

// perMinute is the caller's account's plan's rate (or Config.KeyRequestsPerMinute).
func (s *Server) perMinute(r *http.Request) int {
	if s.keyRate > 0 {
		return s.keyRate
	}
	return account(r.Context()).Plan().Limits().RequestsPerMinute
}

// rateLimited is a limiter's refusal: its decision d (the limit, the wait, and the
// 429's RateLimit fields, which writeError sets) and how to say it.
type rateLimited struct {
	d     ratelimit.Decision
	per   string // "a minute", "an hour"
	which string // which requests were counted ("" all; else " with …")
}

func (e *rateLimited) Error() string { return "rate limited" }
func (e *rateLimited) Unwrap() error {
	return domain.Errorf(domain.CodeRateLimited, "more than %d requests %s%s; retry after the Retry-After delay", e.d.Limit, e.per, e.which)
}
func (e *rateLimited) RetryAfter() time.Duration { return e.d.RetryAfter }
