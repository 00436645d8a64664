package httpapi_test

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// withKeyRequestsPerMinute replaces the plans' requests per minute
// (httpapi.Config.KeyRequestsPerMinute).
func withKeyRequestsPerMinute(n int) envOption {
	return func(c *envConfig) { c.keyPerMinute = n }
}

var rateLimitField = regexp.MustCompile(`^"([a-z]+)";r=(\d+);t=(\d+)$`)

// TestRateLimitAcrossServers: two servers on one database enforce one limit. Calls
// alternate between them as fast as they are answered; the number let through is what
// one limiter would allow in that time (the burst plus what refilled while the calls
// ran), every 429 carries Retry-After and the RateLimit fields, and the remaining
// count the servers report never goes up while the bucket drains. A key's limit is its
// account's: the calls also alternate between two live keys of one account, which
// share it, while a test key of the account has its own.
func TestRateLimitAcrossServers(t *testing.T) {
	a := newEnv(t, withRateLimits(), withKeyRequestsPerMinute(60), withWorkers(0))
	b := newEnv(t, withRateLimits(), withKeyRequestsPerMinute(60), withWorkers(0), onPool(a.pool))
	key, _ := a.signup("replicas@example.com")
	// Managing keys counts against the key's own bucket (TestRevokeWhileAccountLimited),
	// not the account's: the timed calls start on a full bucket.
	other, _ := a.createKey(key, map[string]any{"label": "second", "scopes": []string{"eval", "keys:write"}})
	testKey, _ := a.createKey(key, map[string]any{"label": "test", "env": "test", "scopes": []string{"eval"}})
	validate := func(e *env, k string) response {
		return e.do("POST", "/v1/validate", k, `{"fen":"`+startFEN+`"}`)
	}
	for _, tc := range []struct {
		name   string
		policy string
		limit  int
		spent  int // calls of the bucket before the timed ones
		status int // of a call let through
		call   func(e *env, i int) response
	}{
		{"account", `"account";q=60;w=60`, 60, 0, 200, func(e *env, i int) response {
			return validate(e, []string{key, other}[i/2%2])
		}},
		// Refused for the request after the limiter and before any engine or allowance.
		{"keyless", `"ip";q=30;w=60`, 30, 0, 400, func(e *env, _ int) response {
			return e.do("POST", "/v1/eval", "", `{}`)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			interval := time.Minute / time.Duration(tc.limit)
			through, remaining := tc.spent, tc.limit
			start := time.Now()
			for i := range 150 {
				r := tc.call([]*env{a, b}[i%2], i)
				if got := r.Header.Get("RateLimit-Policy"); got != tc.policy {
					t.Fatalf("call %d: RateLimit-Policy %q, want %q", i, got, tc.policy)
				}
				m := rateLimitField.FindStringSubmatch(r.Header.Get("RateLimit"))
				if m == nil || !strings.HasPrefix(tc.policy, `"`+m[1]+`";`) {
					t.Fatalf("call %d: RateLimit %q", i, r.Header.Get("RateLimit"))
				}
				r0, _ := strconv.Atoi(m[2])
				if r0 > remaining {
					t.Fatalf("call %d: remaining went up from %d to %d", i, remaining, r0)
				}
				remaining = r0
				if r.Status == 429 {
					wantProblem(t, r, 429, "retry_after")
					if s, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || s < 1 || r0 != 0 {
						t.Fatalf("call %d: 429 with Retry-After %q and RateLimit %q", i, r.Header.Get("Retry-After"), r.Header.Get("RateLimit"))
					}
					continue
				}
				if r.Status != tc.status {
					t.Fatalf("call %d: %d %s", i, r.Status, r.Raw)
				}
				through++
			}
			elapsed := time.Since(start)
			// One limiter admits the burst plus a token per interval that passed.
			most := tc.limit + int(elapsed/interval)
			t.Logf("%d of 150 calls through two servers in %v (limit %d a minute, at most %d in that time)", through, elapsed.Round(time.Millisecond), tc.limit, most)
			if through < tc.limit || through > most {
				t.Fatalf("%d calls through, want %d to %d", through, tc.limit, most)
			}
		})
	}
	// Two live keys with a bucket each would have let about twice the calls through,
	// above. The account's test key has its own bucket, still nearly full.
	for i, e := range []*env{a, b} {
		r := validate(e, testKey)
		m := rateLimitField.FindStringSubmatch(r.Header.Get("RateLimit"))
		if r.Status != 200 || r.Header.Get("RateLimit-Policy") != `"account";q=60;w=60` || m == nil {
			t.Fatalf("server %d: the test key got %d, RateLimit-Policy %q, RateLimit %q", i, r.Status,
				r.Header.Get("RateLimit-Policy"), r.Header.Get("RateLimit"))
		}
		if left, _ := strconv.Atoi(m[2]); left < 50 {
			t.Fatalf("server %d: the test key has %d calls left of 60: it shares the live keys' bucket", i, left)
		}
	}
}

// A key that spends its account's rate does not lock out the calls that manage the
// account: those count against the calling key's own bucket, so the admin key can still
// revoke the runaway one, while its own eval calls share the spent bucket.
func TestRevokeWhileAccountLimited(t *testing.T) {
	e := newEnv(t, withRateLimits(), withKeyRequestsPerMinute(5), withWorkers(0))
	admin, _ := e.signup("runaway@example.com")
	runaway, runawayID := e.createKey(admin, map[string]any{"label": "runaway", "scopes": []string{"eval"}})
	for r := e.do("POST", "/v1/validate", runaway, `{"fen":"`+startFEN+`"}`); r.Status != 429; r = e.do("POST", "/v1/validate", runaway, `{"fen":"`+startFEN+`"}`) {
		if r.Status != 200 {
			t.Fatalf("validate: %d %s", r.Status, r.Raw)
		}
	}
	wantProblem(t, e.do("POST", "/v1/validate", admin, `{"fen":"`+startFEN+`"}`), 429, "retry_after")
	r := e.do("DELETE", "/v1/keys/"+runawayID, admin, nil)
	if r.Status != 204 || r.Header.Get("RateLimit-Policy") != `"key";q=5;w=60` {
		t.Fatalf("revoke while the account's rate is spent: %d, RateLimit-Policy %q: %s", r.Status, r.Header.Get("RateLimit-Policy"), r.Raw)
	}
	wantProblem(t, e.do("POST", "/v1/validate", runaway, `{"fen":"`+startFEN+`"}`), 401, "fix_request") // revoked
}
