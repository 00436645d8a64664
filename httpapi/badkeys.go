package httpapi

import (
	"net/http"
	"net/netip"
	"time"

	"chessd/domain"
	"chessd/memo"
	"chessd/ratelimit"
)

// BadKeysPerMinute bounds the requests one address may make with a credential that
// opens no key (unknown, revoked, rotated out): each such request costs the database
// a lookup or two, and no key's or account's limit counts it. Past it, the address's
// requests with a credential that this server has not seen open a key answer 429
// without a lookup until the bucket refills; keys it knows go on, so one client's
// guesses do not shut out the others behind the same address.
const BadKeysPerMinute = 30

var badKeysPolicy = ratelimit.Policy{Name: "bad-key", Limit: BadKeysPerMinute, Window: time.Minute}

// badKeys is what a server remembers of the addresses whose shared bucket of bad
// credentials (package ratelimit, across every server) it found empty: until when.
type badKeys struct{ until memo.Map } // netip.Addr -> time.Time

func newBadKeys() *badKeys { return &badKeys{until: memo.Map{Max: 100_000}} }

// heldBack answers a request whose credential this server has not seen open a key
// (auth.Authenticator.Known), from an address whose bad credentials ran out of their
// bucket: refused without a lookup.
func (s *Server) heldBack(r *http.Request, addr netip.Addr, secret string) error {
	v, ok := s.badKeys.until.Load(addr)
	if !ok {
		return nil
	}
	left := time.Until(v.(time.Time))
	if left <= 0 {
		s.badKeys.until.Delete(addr)
		return nil
	}
	if s.auth.Known(secret) {
		return nil
	}
	return badKeysLimited(left)
}

// countBadKey counts a refused credential (err, a CodeBadCredential error) against its
// address's bucket: err while the bucket has room, else a 429 that holds the address
// back on this server until it refills.
func (s *Server) countBadKey(r *http.Request, addr netip.Addr, err error) error {
	if s.limiter == nil {
		return err
	}
	d := s.limiter.Allow(r.Context(), "ip:"+addr.String(), badKeysPolicy)
	if d.Allowed {
		return err
	}
	s.badKeys.until.Store(addr, time.Now().Add(d.RetryAfter))
	return badKeysLimited(d.RetryAfter)
}

func badKeysLimited(after time.Duration) error {
	return &rateLimited{after: after, limit: BadKeysPerMinute, per: "a minute", which: " with an API key that opens no key"}
}

// isBadCredential says whether err refused the credential itself (not an outage).
func isBadCredential(err error) bool { return domain.ErrorCode(err) == domain.CodeBadCredential }
