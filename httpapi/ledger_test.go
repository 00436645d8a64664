package httpapi_test

import (
	"context"
	"encoding/csv"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/ledger"
	"chessd/postgres/pgtest"
)

// withIdem sends a POST with an Idempotency-Key.
func (e *env) withIdem(path, key, idem, body string) response {
	e.t.Helper()
	req, _ := http.NewRequest("POST", e.srv.URL+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Idempotency-Key", idem)
	return e.send(req)
}

// chargeIDs are the ids of keyID's charges, in the order they were charged.
func (e *env) chargeIDs(keyID string) []string {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT charge_id FROM charge_lines() WHERE key_id = $1 ORDER BY position, line`, keyID)
	if err != nil {
		e.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// caughtUp waits until the ledger and jobs projections have applied every event.
func (e *env) caughtUp() {
	e.t.Helper()
	ctx := context.Background()
	// answered calls are settled off the response path: commit what is queued first
	if err := e.meter.Flush(ctx); err != nil {
		e.t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		head, err := eventstore.Head(ctx, e.pool)
		if err != nil {
			e.t.Fatal(err)
		}
		var behind int
		err = e.pool.QueryRow(ctx, `SELECT count(*) FROM events ev WHERE ev.stream_type = 'ledger'
			AND NOT EXISTS (SELECT 1 FROM charges c WHERE c.position = ev.position)
			AND NOT EXISTS (SELECT 1 FROM charge_batches b WHERE b.position = ev.position)
			AND NOT EXISTS (SELECT 1 FROM credits c WHERE c.position = ev.position)`).Scan(&behind)
		if err != nil {
			e.t.Fatal(err)
		}
		var jobsBehind int
		err = e.pool.QueryRow(ctx, `SELECT count(*) FROM streams s LEFT JOIN jobs j ON s.stream_id = 'job-' || j.job_id
			WHERE s.stream_type = 'job' AND (j.version IS NULL OR j.version <> s.version)`).Scan(&jobsBehind)
		if err != nil {
			e.t.Fatal(err)
		}
		if behind == 0 && jobsBehind == 0 && head >= 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("ledger projection still %d charges behind", behind)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// charged counts a key's charges in every place that records them: the events, the
// ledger read model, and the balance row.
func (e *env) charged(keyID string) (events, rows int, spent int64) {
	e.t.Helper()
	ctx := context.Background()
	e.caughtUp()
	if err := e.pool.QueryRow(ctx, `SELECT coalesce(sum(CASE event_type WHEN 'ChargesSettled' THEN json_array_length(payload->'lines') ELSE 1 END), 0)
		FROM events WHERE stream_id = $1`, "ledger-"+keyID).Scan(&events); err != nil {
		e.t.Fatal(err)
	}
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM charge_lines() WHERE key_id = $1`, keyID).Scan(&rows); err != nil {
		e.t.Fatal(err)
	}
	if err := e.pool.QueryRow(ctx, `SELECT spent_units FROM key_balances WHERE key_id = $1`, keyID).Scan(&spent); err != nil {
		e.t.Fatal(err)
	}
	return
}

const cheapFEN = "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"

// Fifty concurrent calls against a budget for ten: exactly ten succeed and are charged.
func TestBudgetHoldsUnderConcurrency(t *testing.T) {
	for _, tc := range []struct{ name, budget string }{
		{"units", `"budget_units":10`},
		{"usd", `"budget_usd":"0.000100"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			owner := e.signupPro("budget-" + tc.name + "@example.com")
			// warm the cache with another key, so every call below costs exactly 1 unit
			if r := e.do("POST", "/v1/eval", owner, evalBody(cheapFEN, `"depth":10`)); r.Status != 200 {
				t.Fatal(r.Raw)
			}
			r := e.do("POST", "/v1/keys", owner, `{"label":"budgeted",`+tc.budget+`}`)
			if r.Status != 201 {
				t.Fatal(r.Raw)
			}
			key, keyID := r.Body["api_key"].(string), r.Body["key_id"].(string)
			statuses := make(chan response, 50)
			var wg sync.WaitGroup
			for range 50 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					statuses <- e.do("POST", "/v1/eval", key, evalBody(cheapFEN, `"depth":10`))
				}()
			}
			wg.Wait()
			close(statuses)
			count := map[int]int{}
			for r := range statuses {
				count[r.Status]++
				if r.Status == 402 && r.Body["next_action"] != "raise_budget" {
					t.Fatalf("402 with next_action %v", r.Body["next_action"])
				}
				if r.Status == 200 && r.Body["cost_units"] != float64(1) {
					t.Fatalf("cost %v", r.Body["cost_units"])
				}
			}
			if count[200] != 10 || count[402] != 40 {
				t.Fatalf("statuses %v, want 10×200 and 40×402", count)
			}
			// answered calls are settled in the next group commit, a moment after
			if err := e.meter.Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
			for _, k := range e.do("GET", "/v1/keys", owner, nil).Body["keys"].([]any) {
				if k := k.(map[string]any); k["key_id"] == keyID && (k["last_used_at"] == nil || k["spent_units"] != float64(10)) {
					t.Fatalf("key record after its calls: %v", k)
				}
			}
			events, rows, spent := e.charged(keyID)
			if events != 10 || rows != 10 || spent != 10 {
				t.Fatalf("ledger: %d events, %d charge rows, %d units spent; want 10 each", events, rows, spent)
			}
			// a budget raised afterwards lets calls through again
			if r := e.do("PATCH", "/v1/keys/"+keyID, owner, `{"budget_units":null,"budget_usd":null}`); r.Status != 200 {
				t.Fatal(r.Raw)
			}
			if r := e.do("POST", "/v1/eval", key, evalBody(cheapFEN, `"depth":10`)); r.Status != 200 {
				t.Fatalf("after clearing the budget: %d %s", r.Status, r.Raw)
			}
		})
	}
}

// leasesReleased waits until the server has given back every lease (they go back
// when idle), so that a test can set balances the next calls reserve against.
func (e *env) leasesReleased() {
	e.t.Helper()
	ctx := context.Background()
	if err := e.meter.Flush(ctx); err != nil {
		e.t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM leases`).Scan(&n); err != nil {
			e.t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%d leases still held", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestIdempotency(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("idem@example.com")
	_, keyID := e.createKey(key, map[string]any{"label": "idem"})
	_ = keyID
	body := evalBody(startFEN, `"depth":9`)
	first := e.withIdem("/v1/eval", key, "retry-1", body)
	if first.Status != 200 {
		t.Fatal(first.Raw)
	}
	// the answer is stored with its charge, in the settler's next group commit: a
	// retry before it is told the first request still runs (409, Retry-After)
	if err := e.meter.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	again := e.withIdem("/v1/eval", key, "retry-1", body)
	if again.Status != 200 || again.Raw != first.Raw || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay differs: %d %s", again.Status, again.Raw)
	}
	wantProblem(t, e.withIdem("/v1/eval", key, "retry-1", evalBody(startFEN, `"depth":8`)), 422, "fix_request")
	// concurrent retries of one key: one answer, the others told to wait or replayed;
	// one charge
	var wg sync.WaitGroup
	var answers sync.Map
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch r := e.withIdem("/v1/eval", key, "retry-2", body); r.Status {
			case 200:
				answers.Store(r.Raw, true)
			case 409:
				if r.Body["next_action"] != "retry_after" || r.Header.Get("Retry-After") == "" {
					t.Errorf("409 without retry_after: %s", r.Raw)
				}
			default:
				t.Errorf("concurrent retry: %d %s", r.Status, r.Raw)
			}
		}()
	}
	wg.Wait()
	if err := e.meter.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	last := e.withIdem("/v1/eval", key, "retry-2", body)
	answers.Store(last.Raw, true)
	n := 0
	answers.Range(func(any, any) bool { n++; return true })
	if last.Status != 200 || n != 1 {
		t.Fatalf("retries got %d different answers; the last %d %s", n, last.Status, last.Raw)
	}
	signupKeyID := principalKeyID(t, e, key)
	events, rows, _ := e.charged(signupKeyID)
	if events != 2 || rows != 2 {
		t.Fatalf("two idempotency keys, %d events and %d charges; want 2", events, rows)
	}
	// other POSTs remember their first answer too; secrets are not stored
	k1 := e.withIdem("/v1/keys", key, "create-1", `{"label":"once"}`)
	k2 := e.withIdem("/v1/keys", key, "create-1", `{"label":"once"}`)
	if k1.Status != 201 || k2.Status != 201 || k1.Body["key_id"] != k2.Body["key_id"] || k2.Body["api_key"] == k1.Body["api_key"] {
		t.Fatalf("create replay: %s / %s", k1.Raw, k2.Raw)
	}
	h1 := e.withIdem("/v1/webhooks", key, "hook-1", `{"url":"https://example.com/hook"}`)
	h2 := e.withIdem("/v1/webhooks", key, "hook-1", `{"url":"https://example.com/hook"}`)
	secret, _ := h1.Body["secret"].(string)
	if h1.Status != 201 || h2.Status != 201 || h1.Body["id"] != h2.Body["id"] || !strings.HasPrefix(secret, "whsec_") || h2.Body["secret"] == secret {
		t.Fatalf("webhook replay: %s / %s", h1.Raw, h2.Raw)
	}
	var leaked int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency WHERE position($1::bytea IN response) > 0 OR position($2::bytea IN response) > 0`,
		[]byte(secret), []byte(k1.Body["api_key"].(string))).Scan(&leaked); err != nil || leaked != 0 {
		t.Fatalf("%d stored answers hold a secret (%v)", leaked, err)
	}
	wantProblem(t, e.withIdem("/v1/eval", key, strings.Repeat("x", 300), body), 400, "fix_request")
}

func principalKeyID(t *testing.T, e *env, key string) string {
	t.Helper()
	r := e.do("GET", "/v1/me", key, nil)
	return r.Body["key"].(map[string]any)["key_id"].(string)
}

func TestFailedCallsAreNotCharged(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("failed@example.com")
	keyID := principalKeyID(t, e, key)
	for _, body := range []string{
		`{"fen":"not a fen"}`, evalBody(startFEN, `"depth":99`), `{"fen":"` + startFEN + `","bogus":1}`,
	} {
		if r := e.do("POST", "/v1/eval", key, body); r.Status != 400 {
			t.Fatalf("%d %s", r.Status, r.Raw)
		}
	}
	free, _ := e.signup("free-plan@example.com")
	wantProblem(t, e.do("POST", "/v1/eval", free, evalBody(startFEN, `"depth":25`)), 402, "upgrade")
	wantProblem(t, e.do("POST", "/v1/bestmove", free, evalBody(startFEN, `"multipv":5`)), 402, "upgrade")
	if events, rows, spent := e.charged(keyID); events != 0 || rows != 0 || spent != 0 {
		t.Fatalf("failed calls charged: %d %d %d", events, rows, spent)
	}
}

func TestDailyAllowance(t *testing.T) {
	e := newEnv(t)
	key, _ := e.signup("allowance@example.com")
	me := e.do("GET", "/v1/me", key, nil)
	today := me.Body["today"].(map[string]any)
	allowance := int64(today["allowance_units"].(float64))
	if r := e.do("POST", "/v1/eval", key, evalBody(startFEN, `"depth":8`)); r.Status != 200 {
		t.Fatal(r.Raw)
	}
	ctx := context.Background()
	e.leasesReleased()
	if _, err := e.pool.Exec(ctx, `UPDATE account_days SET units = $1 - 5`, allowance); err != nil {
		t.Fatal(err)
	}
	r := e.do("POST", "/v1/eval", key, evalBody(cheapFEN, `"depth":8`)) // 10 units: over
	wantProblem(t, r, 402, "upgrade")
	if !strings.Contains(r.Body["detail"].(string), "daily allowance") {
		t.Fatalf("detail: %s", r.Raw)
	}
	if r := e.do("POST", "/v1/eval", key, evalBody(startFEN, `"depth":8`)); r.Status != 200 { // cached: 1 unit fits
		t.Fatalf("a call that fits: %d %s", r.Status, r.Raw)
	}
	e.caughtUp() // usage shows settled calls
	me = e.do("GET", "/v1/me", key, nil)
	if rem := me.Body["today"].(map[string]any)["remaining_units"]; rem != float64(4) {
		t.Fatalf("remaining %v, want 4", rem)
	}
}

// wantDetail checks a problem's detail.
func wantDetail(t *testing.T, r response, detail string) {
	t.Helper()
	if r.Body["detail"] != detail {
		t.Fatalf("detail %q, want %q", r.Body["detail"], detail)
	}
}

func TestRateLimit(t *testing.T) {
	e := newEnv(t, withRateLimits())
	key, _ := e.signup("rate@example.com")
	var last response
	for i := 0; i < 200; i++ {
		last = e.do("POST", "/v1/validate", key, `{"fen":"`+startFEN+`"}`)
		if i == 0 && (last.Header.Get("RateLimit-Policy") != `"account";q=120;w=60` || !strings.HasPrefix(last.Header.Get("RateLimit"), `"account";r=`)) {
			t.Fatalf("headers on success: %v", last.Header)
		}
		if last.Status == 429 {
			break
		}
	}
	wantProblem(t, last, 429, "retry_after")
	wantDetail(t, last, "more than 120 requests a minute; retry after the Retry-After delay")
	if last.Header.Get("Retry-After") == "" || !strings.Contains(last.Header.Get("RateLimit"), "r=0") {
		t.Fatalf("429 headers: %v", last.Header)
	}
	for i := 0; i < 40; i++ {
		last = e.do("POST", "/v1/eval", "", evalBody(startFEN, `"depth":5`))
		if last.Status == 429 {
			break
		}
	}
	wantProblem(t, last, 429, "retry_after")
	wantDetail(t, last, "more than 30 requests a minute; retry after the Retry-After delay")
	if last.Header.Get("RateLimit-Policy") != `"ip";q=30;w=60` {
		t.Fatalf("keyless policy header: %v", last.Header)
	}
	for i := 0; i < 20; i++ { // one signup above came from this address already
		last = e.do("POST", "/v1/signup", "", map[string]string{"email": fmt.Sprintf("burst%d@example.com", i)})
		if last.Status == 429 {
			break
		}
	}
	wantProblem(t, last, 429, "retry_after")
	wantDetail(t, last, "more than 10 requests an hour; retry after the Retry-After delay")
	if last.Header.Get("RateLimit-Policy") != `"signup";q=10;w=3600` {
		t.Fatalf("signup policy header: %v", last.Header)
	}
}

// An unverified account cannot have the service mail its address without end: five
// verification messages in 24 hours, signup's included (it queued one a minute for
// ever: 31 in half an hour of a clock moved back).
func TestVerificationMailCapped(t *testing.T) {
	e := newEnv(t, withRateLimits())
	key, _ := e.signup("capped@example.com")
	ctx := context.Background()
	var last response
	for range 10 {
		if _, err := e.pool.Exec(ctx, `UPDATE email_verifications SET created_at = created_at - interval '61 seconds'`); err != nil {
			t.Fatal(err)
		}
		if last = e.do("POST", "/v1/me/verify-email", key, nil); last.Status != 202 {
			break
		}
	}
	// a refusal about time: 429 saying when the next may go, a day after the first
	// message (about 24 h less the nine minutes the clock was moved back)
	wantProblem(t, last, 429, "retry_after")
	// the account's rate limit let the call through: its fields, saying there is
	// room, would contradict the 429
	if p, l := last.Header.Get("RateLimit-Policy"), last.Header.Get("RateLimit"); p != "" || l != "" {
		t.Fatalf("a 429 of the mail's cap with the rate limit's fields %q, %q", p, l)
	}
	if ra, err := strconv.Atoi(last.Header.Get("Retry-After")); err != nil || ra < 86400-10*61 || ra > 86400-4*61 {
		t.Fatalf("Retry-After %q past the day's cap, want about a day less the minutes moved back", last.Header.Get("Retry-After"))
	}
	// the fifth message a moment ago: both limits hold, and the wait is the day's
	if _, err := e.pool.Exec(ctx, `UPDATE email_verifications SET created_at = now() - interval '10 seconds'
		WHERE created_at = (SELECT max(created_at) FROM email_verifications)`); err != nil {
		t.Fatal(err)
	}
	both := e.do("POST", "/v1/me/verify-email", key, nil)
	wantProblem(t, both, 429, "retry_after")
	if ra, err := strconv.Atoi(both.Header.Get("Retry-After")); err != nil || ra < 86400-10*61 {
		t.Fatalf("Retry-After %q with both limits holding, want the day's wait (the minute's was told, then refused again)", both.Header.Get("Retry-After"))
	}
	if _, err := e.pool.Exec(ctx, `UPDATE email_verifications SET created_at = created_at - interval '1 minute'`); err != nil {
		t.Fatal(err)
	}
	var queued int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM mail_outbox WHERE to_email = 'capped@example.com'`).Scan(&queued); err != nil {
		t.Fatal(err)
	}
	if queued != commands.MaxVerificationMails {
		t.Fatalf("%d messages queued to an unverified address; want %d", queued, commands.MaxVerificationMails)
	}
	// a day after the first, the next may go
	if _, err := e.pool.Exec(ctx, `UPDATE email_verifications SET created_at = created_at - interval '24 hours'
		WHERE created_at = (SELECT min(created_at) FROM email_verifications)`); err != nil {
		t.Fatal(err)
	}
	if r := e.do("POST", "/v1/me/verify-email", key, nil); r.Status != 202 {
		t.Fatalf("a day after the first message: %d %s", r.Status, r.Raw)
	}
}

func TestBilling(t *testing.T) {
	e := newEnv(t)
	key, _ := e.signup("billing@example.com")
	// a plan is bought only from an account whose address is verified
	wantProblem(t, e.do("POST", "/v1/billing/checkout", key, `{"plan":"pro"}`), 403, "verify_email")
	soon := e.do("POST", "/v1/me/verify-email", key, nil) // one message a minute
	wantProblem(t, soon, 429, "retry_after")
	if ra, err := strconv.Atoi(soon.Header.Get("Retry-After")); err != nil || ra < 1 || ra > 60 {
		t.Fatalf("Retry-After %q a moment after signup's message, want at most the minute", soon.Header.Get("Retry-After"))
	}
	token := e.mailedToken("billing@example.com")
	wantProblem(t, e.do("POST", "/v1/verify-email", "", map[string]any{"token": token + "0"}), 400, "fix_request")
	wantProblem(t, e.do("POST", "/v1/verify-email", "", map[string]any{}), 400, "fix_request")
	v := e.do("POST", "/v1/verify-email", "", map[string]any{"token": token})
	if v.Status != 200 || v.Body["email_verified"] != true || v.Body["email"] != "billing@example.com" {
		t.Fatalf("verify: %d %s", v.Status, v.Raw)
	}
	wantProblem(t, e.do("POST", "/v1/verify-email", "", map[string]any{"token": token}), 400, "fix_request") // used
	pgtest.WaitFor(t, "/me to show the address verified", func() bool { return e.do("GET", "/v1/me", key, nil).Body["email_verified"] == true })
	wantProblem(t, e.do("POST", "/v1/me/verify-email", key, nil), 409, "fix_request") // verified already
	r := e.do("POST", "/v1/billing/checkout", key, `{"plan":"pro"}`)
	wantProblem(t, r, 409, "contact")
	if !strings.Contains(r.Body["detail"].(string), "pro") {
		t.Fatalf("detail does not name the plan: %s", r.Raw)
	}
	// a plan is the whole account's, live keys' caps included: a test key buys none
	tester, _ := e.createKey(key, map[string]any{"env": "test", "scopes": []string{"billing"}})
	wantProblem(t, e.do("POST", "/v1/billing/checkout", tester, `{"plan":"pro"}`), 403, "fix_request")
	wantProblem(t, e.do("POST", "/v1/billing/checkout", key, `{"plan":"gold"}`), 400, "fix_request")
	wantProblem(t, e.do("POST", "/v1/billing/checkout", key, `{}`), 400, "fix_request")
	p := e.do("POST", "/v1/billing/portal", key, nil)
	if p.Status != 200 || p.Body["portal_url"] != "http://chessd.test/account" {
		t.Fatalf("portal: %d %s", p.Status, p.Raw)
	}
	evalOnly, _ := e.createKey(key, map[string]any{"scopes": []string{"eval"}})
	wantProblem(t, e.do("POST", "/v1/billing/portal", evalOnly, nil), 403, "fix_request")
}

// mixedLoad makes charged calls of several kinds on two keys (live and test) over the
// given FENs; it returns the number of calls of each key, all answered.
func mixedLoad(t *testing.T, e *env, live, test string) (liveCalls, testCalls int) {
	t.Helper()
	n := 0
	for i, extra := range []string{`"depth":8`, `"depth":9,"multipv":2`, `"depth":8`, `"depth":10,"movetime_ms":100`} {
		for _, k := range []string{live, test} {
			path := "/v1/eval"
			if i%2 == 1 {
				path = "/v1/bestmove"
			}
			if r := e.do("POST", path, k, evalBody(cheapFEN, extra)); r.Status != 200 {
				t.Fatalf("%d %s", r.Status, r.Raw)
			}
			n++
		}
	}
	if r := e.do("POST", "/v1/eval", live, evalBody(startFEN, `"depth":7,"engine":"sf-15.1"`)); r.Status != 200 {
		t.Fatal(r.Raw)
	}
	return n/2 + 1, n / 2
}

func TestUsage(t *testing.T) {
	e := newEnv(t)
	live := e.signupPro("usage@example.com")
	test, _ := e.createKey(live, map[string]any{"env": "test", "label": "t"})
	calls, testCalls := mixedLoad(t, e, live, test)
	e.caughtUp()

	all := e.do("GET", "/v1/usage", live, nil) // the live key's book: its env's
	totals := all.Body["totals"].(map[string]any)
	if all.Status != 200 || totals["calls"] != float64(calls) {
		t.Fatalf("usage: %d %s (want %d calls)", all.Status, all.Raw, calls)
	}
	for _, k := range []string{live, test} {
		if r := e.do("GET", "/v1/usage?env=test", k, nil); r.Status != 200 || r.Body["totals"].(map[string]any)["calls"] != float64(testCalls) {
			t.Fatalf("the test book: %d %s (want %d calls)", r.Status, r.Raw, testCalls)
		}
	}
	for _, g := range []string{"key", "day", "endpoint", "engine", "env", "key,day", "endpoint,engine", "env,key,day,endpoint,engine", "day,day",
		"hour", "month", "cached", "key,hour,cached", "cached&tz=America/New_York", "day&tz=Asia/Kolkata", "endpoint&window=hour&tz=Pacific/Chatham"} {
		r := e.do("GET", "/v1/usage?group_by="+g, live, nil)
		g, _, _ = strings.Cut(g, "&")
		if r.Status != 200 || fmt.Sprint(r.Body["totals"]) != fmt.Sprint(totals) {
			t.Fatalf("group_by=%s: %d totals %v, want %v", g, r.Status, r.Body["totals"], totals)
		}
		var units float64
		for _, grp := range r.Body["groups"].([]any) {
			grp := grp.(map[string]any)
			for _, name := range strings.Split(g, ",") {
				if _, ok := grp[name]; !ok {
					t.Fatalf("group_by=%s: group without %s: %v", g, name, grp)
				}
			}
			units += grp["units"].(float64)
		}
		if units != totals["units"] {
			t.Fatalf("group_by=%s: groups sum to %v units, totals say %v", g, units, totals["units"])
		}
	}
	// pages of one group at a time, then CSV: the same groups, once each, in order
	whole := e.do("GET", "/v1/usage?group_by=key,endpoint,cached", live, nil)
	var paged []any
	cursor := ""
	for pages := 0; pages < 50; pages++ {
		r := e.do("GET", "/v1/usage?group_by=key,endpoint,cached&limit=1"+cursor, live, nil)
		if r.Status != 200 || fmt.Sprint(r.Body["totals"]) != fmt.Sprint(totals) {
			t.Fatalf("page %d: %d %s", pages, r.Status, r.Raw)
		}
		paged = append(paged, r.Body["groups"].([]any)...)
		next, _ := r.Body["next_cursor"].(string)
		if next == "" {
			break
		}
		cursor = "&cursor=" + next
	}
	if fmt.Sprint(paged) != fmt.Sprint(whole.Body["groups"]) || len(paged) < 3 {
		t.Fatalf("pages gave %v, one answer %v", paged, whole.Body["groups"])
	}
	csvRows := e.csv("/v1/usage?group_by=key,endpoint,cached", live)
	if strings.Join(csvRows[0], ",") != "key,endpoint,cached,calls,units,usd,credits,credited_units,credited_usd,net_units,net_usd" || len(csvRows)-1 != len(paged) {
		t.Fatalf("CSV %v for %d groups", csvRows, len(paged))
	}
	for i, g := range paged {
		g := g.(map[string]any)
		want := []string{g["key"].(string), g["endpoint"].(string), g["cached"].(string),
			fmt.Sprint(g["calls"]), fmt.Sprint(g["units"]), g["usd"].(string), fmt.Sprint(g["credits"]),
			fmt.Sprint(g["credited_units"]), g["credited_usd"].(string), fmt.Sprint(g["net_units"]), g["net_usd"].(string)}
		if strings.Join(csvRows[i+1], ",") != strings.Join(want, ",") {
			t.Fatalf("CSV row %d %v, JSON %v", i+1, csvRows[i+1], want)
		}
	}
	// Without groups the CSV is the totals' one row, and every CSV carries them in headers.
	sums := e.do("GET", "/v1/usage", live, nil).Body["totals"].(map[string]any)
	wantTotals := []string{fmt.Sprint(sums["calls"]), fmt.Sprint(sums["units"]), sums["usd"].(string), fmt.Sprint(sums["credits"]),
		fmt.Sprint(sums["credited_units"]), sums["credited_usd"].(string), fmt.Sprint(sums["net_units"]), sums["net_usd"].(string)}
	if rows := e.csv("/v1/usage", live); len(rows) != 2 || strings.Join(rows[1], ",") != strings.Join(wantTotals, ",") {
		t.Fatalf("ungrouped CSV %v, JSON totals %v", rows, wantTotals)
	}
	_, header := e.csvAnswer("/v1/usage?group_by=key", live)
	for name, field := range map[string]string{"Calls": "calls", "Units": "units", "USD": "usd", "Credits": "credits",
		"Credited-Units": "credited_units", "Credited-USD": "credited_usd"} {
		if got, want := header.Get("Usage-Total-"+name), fmt.Sprint(sums[field]); got != want {
			t.Errorf("CSV Usage-Total-%s %q, JSON totals.%s %q", name, got, field, want)
		}
	}
	if header.Get("Vary") != "Accept" {
		t.Errorf("GET /usage answers by Accept without Vary: Accept (%q)", header.Get("Vary"))
	}
	// each book alone: test usage is never live usage (decisions.md)
	for _, c := range []struct{ key, query, env string }{{live, "", "live"}, {live, "&env=test", "test"}, {test, "", "test"}} {
		r := e.do("GET", "/v1/usage?group_by=env"+c.query, c.key, nil)
		if gs := r.Body["groups"].([]any); r.Status != 200 || len(gs) != 1 || gs[0].(map[string]any)["env"] != c.env {
			t.Fatalf("by env%s, want only %s: %s", c.query, c.env, r.Raw)
		}
	}
	wantProblem(t, e.do("GET", "/v1/usage?env=live", test, nil), 403, "fix_request")
	for _, q := range []string{"group_by=color", "group_by=key,,day", "from=yesterday", "from=2026-11-10&to=2026-11-01", "from=2026-11-10&to=2026-11-09", "page=2",
		"tz=Nowhere/City", "window=week", "group_by=day&cursor=bm9wZQ", "limit=100001"} {
		wantProblem(t, e.do("GET", "/v1/usage?"+q, live, nil), 400, "fix_request")
	}
	empty := e.do("GET", "/v1/usage?from=2020-01-01&to=2020-01-31&group_by=day", live, nil)
	if empty.Body["totals"].(map[string]any)["calls"] != float64(0) || len(empty.Body["groups"].([]any)) != 0 {
		t.Fatalf("empty range: %s", empty.Raw)
	}

	// usage equals the ledger to the unit and the cent
	ctx := context.Background()
	var ledgerUnits, ledgerUSD decimal.Decimal
	if err := e.pool.QueryRow(ctx, `SELECT
			coalesce(sum(debit) FILTER (WHERE currency = 'UNITS' AND account LIKE 'key:%'), 0),
			coalesce(sum(debit) FILTER (WHERE currency = 'USD' AND account LIKE 'key:%'), 0)
		FROM ledger_entries WHERE book NOT LIKE '%/test'`).Scan(&ledgerUnits, &ledgerUSD); err != nil {
		t.Fatal(err)
	}
	if ledgerUnits.String() != fmt.Sprint(totals["units"]) || ledgerUSD.StringFixed(6) != totals["usd"] {
		t.Fatalf("ledger %s units $%s, usage %v units $%v", ledgerUnits, ledgerUSD.StringFixed(6), totals["units"], totals["usd"])
	}
	var unbalanced int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT position, currency FROM ledger_entries
		GROUP BY position, currency HAVING sum(debit) <> sum(credit)) x`).Scan(&unbalanced); err != nil || unbalanced != 0 {
		t.Fatalf("%d unbalanced transactions (%v)", unbalanced, err)
	}
	// a test key never touches live usage, budgets or allowance
	var liveDays, testDays int64
	if err := e.pool.QueryRow(ctx, `SELECT coalesce(sum(units) FILTER (WHERE env = 'live'), 0), coalesce(sum(units) FILTER (WHERE env = 'test'), 0) FROM account_days`).Scan(&liveDays, &testDays); err != nil {
		t.Fatal(err)
	}
	var liveCharged, testCharged int64
	if err := e.pool.QueryRow(ctx, `SELECT coalesce(sum(units) FILTER (WHERE env = 'live'), 0), coalesce(sum(units) FILTER (WHERE env = 'test'), 0) FROM charge_lines()`).Scan(&liveCharged, &testCharged); err != nil {
		t.Fatal(err)
	}
	if liveDays != liveCharged || testDays != testCharged || testCharged == 0 {
		t.Fatalf("allowance books: live %d/%d test %d/%d", liveDays, liveCharged, testDays, testCharged)
	}
	var testInLiveBook int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries le JOIN charge_lines() c ON c.position = le.position
		WHERE c.env = 'test' AND le.book NOT LIKE '%/test'`).Scan(&testInLiveBook); err != nil || testInLiveBook != 0 {
		t.Fatalf("test charges posted to a live book: %d (%v)", testInLiveBook, err)
	}
}

// A /usage cursor continues the query that made it and no other: its values are the
// last group's, compared with the grouping columns, so a cursor of group_by=key taken
// to group_by=endpoint answered 200 with no groups (every key_… sorts after every
// endpoint). One taken to another group_by, tz, from or to is a 400 naming cursor.
func TestUsageCursorOfAnotherQuery(t *testing.T) {
	e := newEnv(t)
	live := e.signupPro("usage-cursor@example.com")
	test, _ := e.createKey(live, map[string]any{"env": "test", "label": "t"})
	mixedLoad(t, e, live, test)
	other, _ := e.createKey(live, map[string]any{"label": "second", "scopes": []string{"eval"}}) // a second key of the live book
	if r := e.do("POST", "/v1/eval", other, evalBody(cheapFEN, `"depth":8`)); r.Status != 200 {
		t.Fatal(r.Raw)
	}
	e.caughtUp()

	first := e.do("GET", "/v1/usage?group_by=key&limit=1", live, nil)
	cursor, _ := first.Body["next_cursor"].(string)
	if first.Status != 200 || cursor == "" {
		t.Fatalf("first page: %d %s", first.Status, first.Raw)
	}
	for _, q := range []string{"group_by=endpoint", "group_by=engine", "group_by=key,day", "group_by=key&tz=Europe/Paris",
		"group_by=key&from=2026-01-01", "group_by=key&to=2099-12-31",
		"group_by=key&as_of=" + time.Now().Add(-time.Hour).UTC().Format(time.RFC3339), "group_by=key&env=test"} {
		r := e.do("GET", "/v1/usage?"+q+"&cursor="+cursor, live, nil)
		wantProblem(t, r, 400, "fix_request")
		if !strings.Contains(r.Raw, `"field":"cursor"`) {
			t.Errorf("%s with a cursor of group_by=key: %s, want a problem naming cursor", q, r.Raw)
		}
	}
	// the same query, by next_cursor or by Link, gets the next key
	second := e.do("GET", "/v1/usage?group_by=key&limit=1&cursor="+cursor, live, nil)
	groups, _ := second.Body["groups"].([]any)
	if second.Status != 200 || len(groups) != 1 || fmt.Sprint(groups) == fmt.Sprint(first.Body["groups"]) {
		t.Fatalf("second page: %d %s", second.Status, second.Raw)
	}
	_, h := e.csvAnswer("/v1/usage?group_by=key&limit=1", live)
	path, ok := strings.CutPrefix(h.Get("Link"), "<http://chessd.test")
	path, _, ok2 := strings.Cut(path, ">")
	if !ok || !ok2 {
		t.Fatalf("Link %q", h.Get("Link"))
	}
	if r := e.do("GET", path, live, nil); r.Status != 200 || fmt.Sprint(r.Body["groups"]) != fmt.Sprint(groups) {
		t.Fatalf("the next page by Link %s: %d %s", path, r.Status, r.Raw)
	}
}

// csv GETs path as text/csv and returns its rows.
func (e *env) csv(path, key string) [][]string {
	e.t.Helper()
	rows, _ := e.csvAnswer(path, key)
	return rows
}

// csvAnswer GETs path as text/csv and returns its rows and headers.
func (e *env) csvAnswer(path, key string) ([][]string, http.Header) {
	e.t.Helper()
	req, _ := http.NewRequest("GET", e.srv.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Accept", "text/csv")
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/csv") {
		e.t.Fatalf("GET %s as CSV: %d %s", path, res.StatusCode, res.Header.Get("Content-Type"))
	}
	rows, err := csv.NewReader(res.Body).ReadAll()
	if err != nil {
		e.t.Fatal(err)
	}
	return rows, res.Header
}

// A retry of an answered call gets its first answer even when a new call would be
// refused: the key's budget or the address's keyless allowance spent by that very
// call. While the first call still runs, a retry is told to wait (409), not that the
// budget is spent; the same key with another request is 422.
func TestIdempotentRetryOfASpendingCall(t *testing.T) {
	e := newEnv(t, withKeylessPerDay(1))
	owner := e.signupPro("spent@example.com")
	const depth = 9
	price, err := ledger.Quote(domain.Call{Endpoint: domain.EndpointEval, Depth: depth, MultiPV: 1, Positions: 1})
	if err != nil {
		t.Fatal(err)
	}
	capped, _ := e.createKey(owner, map[string]any{"label": "one call", "scopes": []string{"eval"}, "budget_units": price.Units})
	for _, c := range []struct {
		name, key, fen string
	}{
		{"the key's budget", capped, cheapFEN},
		{"the keyless allowance", "", startFEN},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := evalBody(c.fen, fmt.Sprintf(`"depth":%d`, depth))
			first := e.withIdem("/v1/eval", c.key, "spend-1", body)
			if first.Status != 200 {
				t.Fatalf("first call: %d %s", first.Status, first.Raw)
			}
			if err := e.meter.Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
			if r := e.withIdem("/v1/eval", c.key, "spend-2", body); r.Status != 402 {
				t.Fatalf("a new call after the first: %d %s, want 402", r.Status, r.Raw)
			}
			again := e.withIdem("/v1/eval", c.key, "spend-1", body)
			if again.Status != 200 || again.Raw != first.Raw || again.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("the retry: %d %s", again.Status, again.Raw)
			}
			wantProblem(t, e.withIdem("/v1/eval", c.key, "spend-1", evalBody(c.fen, `"depth":8`)), 422, "fix_request")
		})
	}
	t.Run("running", func(t *testing.T) {
		const deep = 22
		price, err := ledger.Quote(domain.Call{Endpoint: domain.EndpointEval, Depth: deep, MultiPV: 1, Positions: 1})
		if err != nil {
			t.Fatal(err)
		}
		key, _ := e.createKey(owner, map[string]any{"label": "one deep call", "scopes": []string{"eval"}, "budget_units": price.Units})
		body := evalBody(startFEN, fmt.Sprintf(`"depth":%d`, deep))
		done := make(chan response, 1)
		go func() { done <- e.withIdem("/v1/eval", key, "deep-1", body) }()
		// the retry comes once the first call's claim is written (during its search)
		pgtest.WaitFor(t, "the first call's claim", func() bool {
			var n int
			err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency WHERE idem_key = 'deep-1' AND state = 'running'`).Scan(&n)
			return err == nil && n == 1
		})
		wantProblem(t, e.withIdem("/v1/eval", key, "deep-1", body), 409, "retry_after")
		if first := <-done; first.Status != 200 {
			t.Fatalf("first call: %d %s", first.Status, first.Raw)
		}
	})
}

// A handler that panics with its Idempotency-Key claimed gives the key back (withClaim,
// which every POST but /eval and /bestmove claims through): a retry runs afresh at once
// rather than being told to wait (409) for as long as the server lives.
func TestPanicGivesTheClaimBack(t *testing.T) {
	e := newEnv(t)
	owner := e.signupPro("panic@example.com")
	const body = `{"label":"after a panic"}`
	req := httptest.NewRequest("POST", "/v1/keys", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", "panics-1")
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the handler's panic did not pass on to the server's recovery")
			}
		}()
		e.api.WithClaim(httptest.NewRecorder(), req, principalKeyID(t, e, owner), func(claimed bool) {
			if !claimed {
				t.Fatal("the Idempotency-Key was not claimed")
			}
			panic("a handler's bug")
		})
	}()
	var left int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency WHERE idem_key = 'panics-1'`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d claims left after the panic (%v)", left, err)
	}
	if r := e.withIdem("/v1/keys", owner, "panics-1", body); r.Status != 201 {
		t.Fatalf("the retry: %d %s", r.Status, r.Raw)
	}
}
