package httpapi

import (
	"net/http"
	"time"

	"chessd/domain"
	"chessd/ratelimit"
)

// KeylessPerMinute is the request rate allowed to one address without a key.
const KeylessPerMinute = 30

// SignupsPerHour bounds the accounts one address can open.
const SignupsPerHour = 10

// signupLimit applies the per-address signup limit; false means it answered 429.
func (s *Server) signupLimit(w http.ResponseWriter, r *http.Request) bool {
	if s.limiter == nil {
		return true
	}
	d := s.limiter.Allow(r.Context(), "ip:"+s.limitAddr(r).String(), ratelimit.Policy{Name: "signup", Limit: SignupsPerHour, Window: time.Hour})
	ratelimit.SetHeaders(w.Header(), d)
	if d.Allowed {
		return true
	}
	s.writeError(w, r, &rateLimited{after: d.RetryAfter, limit: d.Limit, per: "hour"})
	return false
}

// rateLimit applies the caller's limit: for a key, its account's plan's requests per
// minute (or Config.KeyRequestsPerMinute), shared by every key of the account's env, so
// that more keys never buy more rate; for no key, the keyless rate of the address. The
// limits hold across every server of the database (package ratelimit). The
// RateLimit-Policy and RateLimit headers go on every answer of a limited endpoint,
// successful ones included; false means it answered 429.
func (s *Server) rateLimit(w http.ResponseWriter, r *http.Request, key *domain.Key) bool {
	if s.limiter == nil {
		return true
	}
	var d ratelimit.Decision
	if key != nil {
		perMinute := account(r.Context()).Plan().Limits().RequestsPerMinute
		if s.keyRate > 0 {
			perMinute = s.keyRate
		}
		bucket := "acct:" + key.AccountID() + ":" + key.Env().String()
		d = s.limiter.Allow(r.Context(), bucket, ratelimit.Policy{Name: "account", Limit: perMinute, Window: time.Minute})
	} else {
		d = s.limiter.Allow(r.Context(), "ip:"+s.limitAddr(r).String(), ratelimit.Policy{Name: "ip", Limit: KeylessPerMinute, Window: time.Minute})
	}
	ratelimit.SetHeaders(w.Header(), d)
	if d.Allowed {
		return true
	}
	s.writeError(w, r, &rateLimited{after: d.RetryAfter, limit: d.Limit, per: "minute"})
	return false
}

type rateLimited struct {
	after time.Duration
	limit int
	per   string
}

func (e *rateLimited) Error() string { return "rate limited" }
func (e *rateLimited) Unwrap() error {
	return domain.Errorf(domain.CodeRateLimited, "more than %d requests a %s; retry after the Retry-After delay", e.limit, e.per)
}
func (e *rateLimited) RetryAfter() time.Duration { return e.after }
