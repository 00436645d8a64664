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
// credentials (package ratelimit, across every server) it found empty: the refusal,
// and when it was decided.
type badKeys struct{ held memo.Map } // netip.Addr -> heldAddr

type heldAddr struct {
	d  ratelimit.Decision
	at time.Time
}

func newBadKeys() *badKeys { return &badKeys{held: memo.Map{Max: 100_000}} }

// heldBack answers a request whose credential this server has not seen open a key
// (auth.Authenticator.Known), from an address whose bad credentials ran out of their
// bucket: refused without a lookup.
func (s *Server) heldBack(addr netip.Addr, secret string) error {
	v, ok := s.badKeys.held.Load(addr)
	if !ok {
		return nil
	}
	h := v.(heldAddr)
	since := time.Since(h.at)
	if since >= h.d.RetryAfter {
		s.badKeys.held.Delete(addr)
		return nil
	}
	if s.auth.Known(secret) {
		return nil
	}
	d := h.d // as it stands now
	d.RetryAfter, d.Reset = d.RetryAfter-since, max(0, d.Reset-since)
	return badKeysLimited(d)
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
	s.badKeys.held.Store(addr, heldAddr{d: d, at: time.Now()})
	return badKeysLimited(d)
}

func badKeysLimited(d ratelimit.Decision) error {
	return &rateLimited{d: d, per: "a minute", which: " with an API key that opens no key"}
}

// isBadCredential says whether err refused the credential itself (not an outage).
func isBadCredential(err error) bool { return domain.ErrorCode(err) == domain.CodeBadCredential }
