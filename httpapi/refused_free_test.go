package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A call the rate limits or its Idempotency-Key header refuse costs the database nothing: its position is not looked
// up in the cache (a flood of 429s cost a query each). The cache's table is locked
// meanwhile: a lookup would wait on it, and is seen waiting.
func TestRateLimitedCallsReadNothing(t *testing.T) {
	e := newEnv(t, withRateLimits(), withKeyRequestsPerMinute(60), withWorkers(0))
	key, _ := e.signup("flood@example.com")
	other, _ := e.signup("twokeys@example.com")
	for _, tc := range []struct {
		name  string
		key   string
		drain func()
		idem  []string // Idempotency-Key header values
		want  int
		code  string
	}{
		{"keyless", "", func() {
			for range 30 { // the address's burst, spent on bad bodies (counted, no engine)
				e.do("POST", "/v1/eval", "", `{}`)
			}
		}, nil, 429, "retry_after"},
		{"key", key, func() {
			for range 60 {
				e.do("POST", "/v1/validate", key, `{"fen":"`+startFEN+`"}`)
			}
		}, nil, 429, "retry_after"},
		// a refused Idempotency-Key header reads nothing either
		{"idempotency key too long", other, func() {}, []string{strings.Repeat("k", 256)}, 400, "fix_request"},
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
				req, err := http.NewRequest("POST", e.srv.URL+"/v1/eval", strings.NewReader(`{"fen":"`+fen+`","depth":1}`))
				if err != nil {
					panic(err)
				}
				if tc.key != "" {
					req.Header.Set("Authorization", "Bearer "+tc.key)
				}
				req.Header["Idempotency-Key"] = tc.idem
				answered <- e.send(req)
			}()
			deadline := time.Now().Add(30 * time.Second)
			for {
				select {
				case r := <-answered:
					wantProblem(t, r, tc.want, tc.code)
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
					t.Fatalf("a refused call looked it up in the cache first (%s): %s", tc.name, waiting)
				}
				if time.Now().After(deadline) {
					t.Fatal("no answer and no lookup waiting")
				}
				time.Sleep(10 * time.Millisecond) // polling the condition
			}
		})
	}
}
