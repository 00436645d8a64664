package httpapi_test

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// A call the rate limits refuse costs the database nothing: its position is not looked
// up in the cache (a flood of 429s cost a query each). The cache's table is locked
// meanwhile: a lookup would wait on it, and is seen waiting.
func TestRateLimitedCallsReadNothing(t *testing.T) {
	e := newEnv(t, withRateLimits(), withKeyRequestsPerMinute(60), withWorkers(0))
	key, _ := e.signup("flood@example.com")
	for _, tc := range []struct {
		name  string
		key   string
		drain func()
	}{
		{"keyless", "", func() {
			for range 30 { // the address's burst, spent on bad bodies (counted, no engine)
				e.do("POST", "/v1/eval", "", `{}`)
			}
		}},
		{"key", key, func() {
			for range 60 {
				e.do("POST", "/v1/validate", key, `{"fen":"`+startFEN+`"}`)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.drain()
			ctx := context.Background()
			tx, err := e.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck // only a lock to let go
			if _, err := tx.Exec(ctx, `LOCK TABLE eval_cache IN ACCESS EXCLUSIVE MODE`); err != nil {
				t.Fatal(err)
			}
			answered := make(chan response, 1)
			go func() {
				// a position no call has asked, so memory cannot answer it first
				fen := fmt.Sprintf("4k3/8/8/8/8/8/3P4/4K2R w K - %d 40", time.Now().UnixNano()%50)
				answered <- e.do("POST", "/v1/eval", tc.key, `{"fen":"`+fen+`","depth":1}`)
			}()
			deadline := time.Now().Add(30 * time.Second)
			for {
				select {
				case r := <-answered:
					wantProblem(t, r, 429, "retry_after")
					return
				default:
				}
				var waiting string
				if err := e.pool.QueryRow(ctx, `SELECT coalesce(string_agg(query, '; '), '') FROM pg_stat_activity
					WHERE wait_event_type = 'Lock' AND query LIKE '%FROM eval_cache%'`).Scan(&waiting); err != nil {
					t.Fatal(err)
				}
				if waiting != "" {
					tx.Rollback(ctx) //nolint:errcheck // let the call end
					t.Fatalf("a call the rate limit refuses looked it up in the cache first (%s): %s", tc.name, waiting)
				}
				if time.Now().After(deadline) {
					t.Fatal("no answer and no lookup waiting")
				}
				time.Sleep(10 * time.Millisecond) // polling the condition
			}
		})
	}
}
