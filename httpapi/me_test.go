package httpapi_test

import (
	"chessd/postgres/pgtest"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
)

// GET /me subtracts from a key's budgets, the account's and the day's allowance what running jobs hold,
// and not what servers hold in leases for the key's own next calls: those units are the
// key's to spend, and a lease taken by one call must not make a budget look a quarter
// used. Leases are written here as another server and a job would hold them.
func TestMeRemainingCountsJobHoldsNotLeases(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cases := []struct {
		name               string
		leases             map[string]int64 // owner → units held on the key
		wantHeld, wantLeft int64            // units; the USD figures follow at the unit price
	}{
		{"nothing held", nil, 0, 990},
		{"another server's lease", map[string]int64{"srv_other": 400}, 0, 990},
		{"a running job's hold", map[string]int64{"job:job_running": 300}, 300, 690},
		{"both", map[string]int64{"srv_other": 400, "job:job_running": 300, "job:job_second": 100}, 400, 590},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			owner, _ := e.signup("me-held-" + string(rune('a'+i)) + "@example.com")
			key, keyID := e.createKey(owner, map[string]any{"label": "budgeted", "budget_units": 1000, "budget_usd": "0.01"})
			if r := e.do("PATCH", "/v1/me", owner, map[string]any{"budget_units": 2000}); r.Status != 200 { // the account's own
				t.Fatalf("account budget: %d %s", r.Status, r.Raw)
			}
			if r := e.do("POST", "/v1/eval", key, evalBody(jobFENs(len(cases))[i], `"depth":8`)); r.Status != 200 { // fresh: 10 units
				t.Fatalf("eval: %d %s", r.Status, r.Raw)
			}
			// the call is settled and this server's lease given back (others' stay)
			if err := e.meter.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			pgtest.WaitFor(t, "the lease to go back", func() bool {
				var n int
				if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM leases WHERE key_id = $1`, keyID).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n == 0
			})
			me := e.do("GET", "/v1/me", key, nil)
			acct := me.Body["account_id"].(string)
			day := time.Now().UTC().Format(time.DateOnly)
			var total int64
			for o, units := range tc.leases {
				if _, err := e.pool.Exec(ctx, `INSERT INTO leases (lease_id, owner, key_id, account_id, env, day, units, expires_at)
					VALUES ($1, $2, $3, $4, 'live', $5, $6, now() + interval '1 hour')`, "lease_"+o+"_"+keyID, o, keyID, acct, day, units); err != nil {
					t.Fatal(err)
				}
				total += units
			}
			// the invariants of 0013_meter.sql: held is the sum of the leases
			if _, err := e.pool.Exec(ctx, `UPDATE key_balances SET held_units = $2::bigint, held_usd = $2::bigint * 0.00001 WHERE key_id = $1`, keyID, total); err != nil {
				t.Fatal(err)
			}
			if _, err := e.pool.Exec(ctx, `UPDATE account_days SET held_units = $3 WHERE account_id = $1 AND env = 'live' AND day = $2`,
				acct, day, total); err != nil {
				t.Fatal(err)
			}
			if _, err := e.pool.Exec(ctx, `UPDATE account_budgets SET held_units = $2 WHERE account_id = $1 AND env = 'live'`,
				acct, total); err != nil {
				t.Fatal(err)
			}

			me = e.do("GET", "/v1/me", key, nil)
			if me.Status != 200 {
				t.Fatalf("me: %d %s", me.Status, me.Raw)
			}
			var spend map[string]any
			for _, k := range me.Body["key_spend"].([]any) {
				if k := k.(map[string]any); k["key_id"] == keyID {
					spend = k
				}
			}
			usd := func(units int64) string { return decimal.New(units, -5).StringFixed(6) }
			want := map[string]any{"spent_units": float64(10), "held_units": float64(tc.wantHeld), "held_usd": usd(tc.wantHeld),
				"remaining_units": float64(tc.wantLeft), "remaining_usd": usd(tc.wantLeft)}
			for f, v := range want {
				if spend[f] != v {
					t.Errorf("key_spend %s = %v, want %v (%v)", f, spend[f], v, spend)
				}
			}
			today := me.Body["today"].(map[string]any)
			allowance := today["allowance_units"].(float64)
			if today["units"] != float64(10) || today["held_units"] != float64(tc.wantHeld) ||
				today["remaining_units"] != allowance-10-float64(tc.wantHeld) {
				t.Errorf("today: %v, want units 10, held %d", today, tc.wantHeld)
			}
			budget := me.Body["budget"].(map[string]any)
			if budget["held_units"] != float64(tc.wantHeld) || budget["remaining_units"] != float64(2000-10-tc.wantHeld) {
				t.Errorf("account budget: %v, want held %d, remaining %d", budget, tc.wantHeld, 2000-10-tc.wantHeld)
			}
		})
	}
}

// A key works the moment its account is committed (authentication reads the events);
// GET /me then waits for the accounts read model rather than answer 404 for an account
// it has not projected yet.
func TestMeRightAfterSignupByCommand(t *testing.T) {
	e := newEnv(t)
	h := commands.New(eventstore.NewStore(e.pool, nil), testPepper)
	for i := range 5 {
		res, err := h.Signup(context.Background(), domain.Signup{Email: fmt.Sprintf("fresh-%d@example.com", i)}, "req_fresh")
		if err != nil {
			t.Fatal(err)
		}
		if r := e.do("GET", "/v1/me", res.Secret, nil); r.Status != 200 || r.Body["account_id"] != res.AccountID {
			t.Fatalf("GET /me right after the account was committed: %d %s", r.Status, r.Raw)
		}
	}
}

// GET /me of an account the read model has not caught up with (its projections start
// over after a database restart) answers 503 with Retry-After, not 404: the account
// exists, its key works. Once the read model has it, 200.
func TestMeOfAnAccountTheReadModelLacksIsRetried(t *testing.T) {
	stalled := newEnv(t, withoutProjections(), withWorkers(0))
	key, _ := stalled.signup("me-behind@example.com")
	r := stalled.do("GET", "/v1/me", key, nil)
	wantProblem(t, r, 503, "retry_after")
	if r.Header.Get("Retry-After") == "" || !strings.Contains(r.Body["detail"].(string), "catching up") {
		t.Fatalf("503 without Retry-After or a detail that says why: %v %s", r.Header, r.Raw)
	}
	newEnv(t, onPool(stalled.pool), withWorkers(0)) // its projections catch up
	pgtest.WaitFor(t, "GET /me to answer 200", func() bool { return stalled.do("GET", "/v1/me", key, nil).Status == 200 })
}

// GET /me tells the address's verification from the events, as it does the plan and
// the zone: the next GET /me after a verification shows it, whatever the accounts
// read model's lag (a console test read false right after the page said verified).
func TestMeShowsAVerificationAtOnce(t *testing.T) {
	e := newEnv(t)
	key, _ := e.signup("verified-now@example.com")
	token := e.mailedToken("verified-now@example.com")
	if r := e.do("POST", "/v1/verify-email", "", map[string]string{"token": token}); r.Status != 200 {
		t.Fatalf("verify: %d %s", r.Status, r.Raw)
	}
	pgtest.WaitFor(t, "the read model to show the verification", func() bool {
		var v bool
		return e.pool.QueryRow(context.Background(), `SELECT email_verified FROM accounts WHERE email = 'verified-now@example.com'`).Scan(&v) == nil && v
	})
	// the read model behind the events, as it is for a moment after each change
	if _, err := e.pool.Exec(context.Background(), `UPDATE accounts SET email_verified = false WHERE email = 'verified-now@example.com'`); err != nil {
		t.Fatal(err)
	}
	if r := e.do("GET", "/v1/me", key, nil); r.Status != 200 || r.Body["email_verified"] != true {
		t.Fatalf("GET /me after the verification: %d %s, want email_verified true", r.Status, r.Raw)
	}
}
