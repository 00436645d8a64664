package httpapi_test

import (
	"strconv"
	"strings"
	"testing"
)

// Requests with a credential that opens no key count against their address across
// every server (BadKeysPerMinute): past the bucket, such a request answers 429 with
// Retry-After on either server instead of another lookup, while a key the servers
// know still works from the same address, and so does a request without a key.
func TestBadKeysAreLimitedPerAddress(t *testing.T) {
	a := newEnv(t, withRateLimits(), withWorkers(0))
	b := newEnv(t, withRateLimits(), withWorkers(0), onPool(a.pool))
	good, _ := a.signup("bad-keys@example.com")
	for _, e := range []*env{a, b} { // each server checks the key once and remembers it
		if r := e.do("GET", "/v1/me", good, nil); r.Status != 200 {
			t.Fatalf("the good key: %d %s", r.Status, r.Raw)
		}
	}
	bad := "ce_live_" + strings.Repeat("A", 43) // well formed: it takes a lookup
	refused := 0
	for i := 0; ; i++ {
		r := []*env{a, b}[i%2].do("GET", "/v1/me", bad, nil)
		if r.Status == 429 {
			wantBadKeys429(t, r)
			break
		}
		if r.Status != 401 {
			t.Fatalf("call %d: %d %s", i, r.Status, r.Raw)
		}
		if refused++; refused > 35 { // 30, and what refilled meanwhile (one every 2 s)
			t.Fatalf("%d requests with an unknown key from one address through two servers, none limited", refused)
		}
	}
	if refused < 30 {
		t.Fatalf("limited after %d unknown keys, want 30", refused)
	}
	for i, e := range []*env{a, b} {
		wantBadKeys429(t, e.do("GET", "/v1/me", bad, nil)) // held back: refused from memory
		if r := e.do("GET", "/v1/me", good, nil); r.Status != 200 {
			t.Fatalf("server %d: the good key from the held-back address: %d %s", i, r.Status, r.Raw)
		}
		if r := e.do("POST", "/v1/eval", "", `{"fen":"`+startFEN+`","depth":1}`); r.Status != 200 {
			t.Fatalf("server %d: a call without a key from the held-back address: %d %s", i, r.Status, r.Raw)
		}
	}
}

// wantBadKeys429 checks a refusal for bad credentials: 429 with Retry-After and the
// bad-key policy's RateLimit fields, none left.
func wantBadKeys429(t *testing.T, r response) {
	t.Helper()
	wantProblem(t, r, 429, "retry_after")
	if s, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || s < 1 ||
		!strings.Contains(r.Raw, "more than 30 requests a minute with an API key that opens no key") {
		t.Fatalf("the 429: Retry-After %q, %s", r.Header.Get("Retry-After"), r.Raw)
	}
	if p, l := r.Header.Get("RateLimit-Policy"), r.Header.Get("RateLimit"); p != `"bad-key";q=30;w=60` || !strings.HasPrefix(l, `"bad-key";r=0;t=`) {
		t.Fatalf("the 429's RateLimit-Policy %q and RateLimit %q, want the bad-key policy's with none left", p, l)
	}
}
