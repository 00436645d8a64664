package ratelimit

import (
	"net/http"
	"strconv"
	"testing"
	"time"
)

func TestHeaderStrings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		d          Decision
		policy     string
		rateLimit  string
		retryAfter int
	}{
		{
			name:      "allowed",
			d:         Decision{Allowed: true, Limit: 120, Remaining: 42, Reset: 17 * time.Second, Policy: perKey},
			policy:    `"key";q=120;w=60`,
			rateLimit: `"key";r=42;t=17`,
		},
		{
			name:      "reset rounds up",
			d:         Decision{Allowed: true, Limit: 5, Remaining: 4, Reset: 2*time.Second + 1, Policy: perIP},
			policy:    `"ip";q=5;w=10`,
			rateLimit: `"ip";r=4;t=3`,
		},
		{
			name:       "denied",
			d:          Decision{Limit: 120, Reset: time.Minute, RetryAfter: 500 * time.Millisecond, Policy: perKey},
			policy:     `"key";q=120;w=60`,
			rateLimit:  `"key";r=0;t=60`,
			retryAfter: 1,
		},
		{
			name:       "denied, retry rounds up",
			d:          Decision{Limit: 1, Reset: 90 * time.Second, RetryAfter: 89*time.Second + 1, Policy: Policy{Name: "slow", Limit: 1, Window: 90 * time.Second}},
			policy:     `"slow";q=1;w=90`,
			rateLimit:  `"slow";r=0;t=90`,
			retryAfter: 90,
		},
		{
			name:       "denied, retry under a nanosecond still says 1",
			d:          Decision{Limit: 1, Policy: Policy{Name: "k", Limit: 1, Window: time.Second}},
			policy:     `"k";q=1;w=1`,
			rateLimit:  `"k";r=0;t=0`,
			retryAfter: 1,
		},
		{
			name:      "name escaped as an sf-string",
			d:         Decision{Allowed: true, Limit: 3, Remaining: 2, Reset: time.Second, Policy: Policy{Name: `a"b\c`, Limit: 3, Window: 3 * time.Second}},
			policy:    `"a\"b\\c";q=3;w=3`,
			rateLimit: `"a\"b\\c";r=2;t=1`,
		},
		{
			name:      "unprintable bytes replaced",
			d:         Decision{Allowed: true, Limit: 1, Reset: time.Second, Policy: Policy{Name: "a\r\nb", Limit: 1, Window: time.Second}},
			policy:    `"a??b";q=1;w=1`,
			rateLimit: `"a??b";r=0;t=1`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.d.PolicyHeader(); got != tc.policy {
				t.Errorf("PolicyHeader() = %s, want %s", got, tc.policy)
			}
			if got := tc.d.Header(); got != tc.rateLimit {
				t.Errorf("Header() = %s, want %s", got, tc.rateLimit)
			}
			if got := tc.d.RetryAfterSeconds(); got != tc.retryAfter {
				t.Errorf("RetryAfterSeconds() = %d, want %d", got, tc.retryAfter)
			}

			h := http.Header{}
			SetHeaders(h, tc.d)
			want := http.Header{
				"Ratelimit-Policy": {tc.policy},
				"Ratelimit":        {tc.rateLimit},
			}
			if !tc.d.Allowed {
				want["Retry-After"] = []string{strconv.Itoa(tc.retryAfter)}
			}
			if len(h) != len(want) {
				t.Fatalf("SetHeaders set %v, want %v", h, want)
			}
			for k, v := range want {
				if got := h.Values(k); len(got) != 1 || got[0] != v[0] {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
			if got := h.Get(HeaderRateLimit); got != tc.rateLimit {
				t.Errorf("Get(%q) = %q", HeaderRateLimit, got)
			}
		})
	}
}

// TestHeadersFromLimiter checks the documented example end to end.
func TestHeadersFromLimiter(t *testing.T) {
	t.Parallel()
	l, _ := newTestLimiter(t)
	h := http.Header{}
	SetHeaders(h, l.Allow(t.Context(), "key:k1", perKey))
	if h.Get("RateLimit-Policy") != `"key";q=120;w=60` || h.Get("RateLimit") != `"key";r=119;t=1` || h.Get("Retry-After") != "" {
		t.Fatalf("first request: %v", h)
	}
	var d Decision
	for range perKey.Limit {
		d = l.Allow(t.Context(), "key:k1", perKey)
	}
	h = http.Header{}
	SetHeaders(h, d)
	if h.Get("RateLimit-Policy") != `"key";q=120;w=60` || h.Get("RateLimit") != `"key";r=0;t=60` || h.Get("Retry-After") != "1" {
		t.Fatalf("121st request: %v", h)
	}
}

func BenchmarkSetHeaders(b *testing.B) {
	d := Decision{Limit: 120, Reset: time.Minute, RetryAfter: 500 * time.Millisecond, Policy: perKey}
	h := http.Header{}
	b.ReportAllocs()
	for b.Loop() {
		SetHeaders(h, d)
	}
}
