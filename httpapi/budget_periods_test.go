package httpapi_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"chessd/alerts"
	"chessd/commands"
	"chessd/eventstore"
	"chessd/ledger"
)

// A key's budget per day starts again at the account's midnight: the account moves to
// New York, a daily key spends its budget and is refused, its day ends and it spends
// again; /me and GET /keys show the period, its spend and the lifetime spend. A change
// of period counts what the key spent since the new period began; a credit gives back
// to the current period only; alerts are told again in each period.
func TestBudgetByPeriod(t *testing.T) {
	e := newEnv(t)
	e.svc.DisableCache() // every eval below is a fresh one: 10 units
	owner := e.signupPro("periods@example.com")
	ctx := context.Background()

	if r := e.do("PATCH", "/v1/me", owner, map[string]any{"timezone": "Mars/Olympus"}); r.Status != 400 {
		t.Fatalf("an unknown zone: %d %s", r.Status, r.Raw)
	}
	r := e.do("PATCH", "/v1/me", owner, map[string]any{"timezone": "America/New_York"})
	if r.Status != 200 || r.Body["timezone"] != "America/New_York" {
		t.Fatalf("PATCH /me: %d %s", r.Status, r.Raw)
	}
	secret, keyID := e.createKey(owner, map[string]any{"label": "daily", "scopes": []string{"eval"},
		"budget_units": 20, "budget_period": "day"})
	hook := e.do("POST", "/v1/webhooks", owner, map[string]any{"url": "http://127.0.0.1:9/hooks"})
	if hook.Status != 201 {
		t.Fatalf("webhook: %d %s", hook.Status, hook.Raw)
	}

	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().In(ny)
	midnight := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, ny)
	key := func() map[string]any {
		t.Helper()
		for _, k := range e.do("GET", "/v1/keys", owner, nil).Body["keys"].([]any) {
			if k := k.(map[string]any); k["key_id"] == keyID {
				return k
			}
		}
		t.Fatalf("key %s not listed", keyID)
		return nil
	}
	spendOf := func() map[string]any {
		t.Helper()
		for _, k := range e.do("GET", "/v1/me", owner, nil).Body["key_spend"].([]any) {
			if k := k.(map[string]any); k["key_id"] == keyID {
				return k
			}
		}
		t.Fatalf("key %s not in /me", keyID)
		return nil
	}
	eval := func(want int) {
		t.Helper()
		if r := e.do("POST", "/v1/eval", secret, evalBody(cheapFEN, `"depth":8`)); r.Status != want {
			t.Fatalf("eval: %d, want %d: %s", r.Status, want, r.Raw)
		}
	}
	wantPeriod := func(k map[string]any, period string, start time.Time, spent, lifetime float64) {
		t.Helper()
		if k["budget_period"] != period || k["period_spent_units"] != spent || k["spent_units"] != lifetime {
			t.Fatalf("key: period %v, period spend %v, spent %v; want %s, %v, %v", k["budget_period"], k["period_spent_units"],
				k["spent_units"], period, spent, lifetime)
		}
		if start.IsZero() {
			if k["period_start"] != nil {
				t.Fatalf("a budget for the key's life has a period start: %v", k["period_start"])
			}
			return
		}
		if got, _ := time.Parse(time.RFC3339, fmt.Sprint(k["period_start"])); !got.Equal(start) {
			t.Fatalf("period starts %v, want %v", k["period_start"], start.UTC())
		}
	}
	alertsTold := func() int {
		t.Helper()
		cs, err := alerts.Check(ctx, e.pool)
		if err != nil {
			t.Fatal(err)
		}
		return len(cs)
	}

	wantPeriod(key(), "day", midnight, 0, 0)
	eval(200)
	eval(200)
	e.caughtUp()
	eval(402) // 20 of 20 units spent today
	wantPeriod(spendOf(), "day", midnight, 20, 20)
	if n := alertsTold(); n != 3 {
		t.Fatalf("%d alerts at 100 %% of the day's budget, want 3 (50, 80, 100)", n)
	}

	// The day ends: the key's period is moved back a day, as the clock would move it.
	if _, err := e.pool.Exec(ctx, `UPDATE key_balances SET period_start = period_start - interval '1 day',
		period_end = period_end - interval '1 day' WHERE key_id = $1`, keyID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE budget_alerts SET period_start = period_start - interval '1 day' WHERE key_id = $1`, keyID); err != nil {
		t.Fatal(err)
	}
	wantPeriod(spendOf(), "day", midnight, 0, 20) // the new day, before any call
	if me := e.do("GET", "/v1/me", owner, nil); me.Body["timezone"] != "America/New_York" {
		t.Fatalf("/me timezone: %v", me.Body["timezone"])
	}
	eval(200)
	e.caughtUp()
	wantPeriod(key(), "day", midnight, 10, 30)
	if n := alertsTold(); n != 1 {
		t.Fatalf("%d alerts at 50 %% of the new day, want 1 (50 told again)", n)
	}

	// A credit gives back to the current period only. Every charge above was made
	// today, so for a moment the period is made to start at the last one: the first
	// two are then of an earlier period.
	var start time.Time
	if err := e.pool.QueryRow(ctx, `SELECT period_start FROM key_balances WHERE key_id = $1`, keyID).Scan(&start); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE key_balances SET period_start = (SELECT max(charged_at) FROM charge_lines() WHERE key_id = $1)
		WHERE key_id = $1`, keyID); err != nil {
		t.Fatal(err)
	}
	var first, last string
	if err := e.pool.QueryRow(ctx, `SELECT (array_agg(charge_id ORDER BY charged_at))[1], (array_agg(charge_id ORDER BY charged_at DESC))[1]
		FROM charge_lines() WHERE key_id = $1`, keyID).Scan(&first, &last); err != nil {
		t.Fatal(err)
	}
	refund := commands.New(eventstore.NewStore(e.pool, nil), nil)
	if _, err := refund.RefundCharges(ctx, []string{first}, "an earlier period", "ops:test", "r1"); err != nil {
		t.Fatal(err)
	}
	if k := spendOf(); k["period_spent_units"] != float64(10) || k["spent_units"] != float64(20) {
		t.Fatalf("after crediting an earlier period's charge: period %v, lifetime %v; want 10, 20", k["period_spent_units"], k["spent_units"])
	}
	if _, err := refund.RefundCharges(ctx, []string{last}, "this period", "ops:test", "r2"); err != nil {
		t.Fatal(err)
	}
	if k := spendOf(); k["period_spent_units"] != float64(0) || k["spent_units"] != float64(10) {
		t.Fatalf("after crediting this period's charge: period %v, lifetime %v; want 0, 10", k["period_spent_units"], k["spent_units"])
	}
	if _, err := e.pool.Exec(ctx, `UPDATE key_balances SET period_start = $2 WHERE key_id = $1`, keyID, start); err != nil {
		t.Fatal(err)
	}

	// Per month: what the key was charged this month (net of credits) counts at once.
	if r := e.do("PATCH", "/v1/keys/"+keyID, owner, map[string]any{"budget_period": "month", "budget_units": 10}); r.Status != 200 {
		t.Fatalf("PATCH budget_period: %d %s", r.Status, r.Raw)
	}
	monthStart := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, ny)
	wantPeriod(key(), "month", monthStart, 10, 10)
	eval(402)
	if r := e.do("PATCH", "/v1/keys/"+keyID, owner, map[string]any{"budget_period": "total", "budget_units": 30}); r.Status != 200 {
		t.Fatalf("PATCH budget_period: %d %s", r.Status, r.Raw)
	}
	wantPeriod(key(), "total", time.Time{}, 10, 10)
	eval(200)
	if r := e.do("PATCH", "/v1/keys/"+keyID, owner, map[string]any{"budget_period": "week"}); r.Status != 400 {
		t.Fatalf("an unknown period: %d %s", r.Status, r.Raw)
	}
}

// A budgeted key gives no budget that starts again more often than its own: a key per
// month cannot create a key per day, nor turn one's budget into a daily one.
func TestBudgetPeriodGrants(t *testing.T) {
	e := newEnv(t)
	owner := e.signupPro("grants@example.com")
	monthly, _ := e.createKey(owner, map[string]any{"label": "monthly", "scopes": []string{"eval", "keys:write"},
		"budget_units": 1000, "budget_period": "month"})
	for _, tc := range []struct {
		body map[string]any
		want int
	}{
		{map[string]any{"label": "m", "scopes": []string{"eval"}, "budget_units": 100, "budget_period": "month"}, 201},
		{map[string]any{"label": "t", "scopes": []string{"eval"}, "budget_units": 100}, 201},
		{map[string]any{"label": "d", "scopes": []string{"eval"}, "budget_units": 100, "budget_period": "day"}, 403},
		{map[string]any{"label": "big", "scopes": []string{"eval"}, "budget_units": 5000, "budget_period": "month"}, 403},
	} {
		if r := e.do("POST", "/v1/keys", monthly, tc.body); r.Status != tc.want {
			t.Errorf("create %v: %d, want %d: %s", tc.body, r.Status, tc.want, r.Raw)
		}
	}
	_, childID := e.createKey(monthly, map[string]any{"label": "child", "scopes": []string{"eval"}, "budget_units": 100,
		"budget_period": "month"})
	if r := e.do("PATCH", "/v1/keys/"+childID, monthly, map[string]any{"budget_period": "day"}); r.Status != 403 {
		t.Errorf("monthly key turning a key daily: %d %s", r.Status, r.Raw)
	}
	if r := e.do("PATCH", "/v1/keys/"+childID, monthly, map[string]any{"budget_period": "total"}); r.Status != 200 {
		t.Errorf("monthly key tightening a key to a lifetime budget: %d %s", r.Status, r.Raw)
	}
}

// An account's budget caps all its keys together, per period: two keys share a daily
// budget, concurrent calls never pass it, a budgeted key cannot lift it, alerts tell
// the account's crossings, and removing the budget lets calls through again.
func TestAccountBudget(t *testing.T) {
	e := newEnv(t)
	e.svc.DisableCache() // every eval below is a fresh one: 10 units
	owner := e.signupPro("account-budget@example.com")
	ctx := context.Background()
	a, _ := e.createKey(owner, map[string]any{"label": "a", "scopes": []string{"eval"}})
	b, _ := e.createKey(owner, map[string]any{"label": "b", "scopes": []string{"eval"}})
	capped, _ := e.createKey(owner, map[string]any{"label": "capped", "scopes": []string{"eval", "billing", "usage:read"},
		"budget_units": 1000})

	r := e.do("PATCH", "/v1/me", owner, map[string]any{"budget_units": 50, "budget_period": "day"})
	if r.Status != 200 {
		t.Fatalf("PATCH /me budget: %d %s", r.Status, r.Raw)
	}
	if bud := r.Body["budget"].(map[string]any); bud["budget_units"] != float64(50) || bud["budget_period"] != "day" ||
		bud["period_start"] == nil || bud["remaining_units"] != float64(50) {
		t.Fatalf("/me budget: %v", bud)
	}
	if r := e.do("PATCH", "/v1/me", capped, map[string]any{"budget_units": nil}); r.Status != 403 {
		t.Fatalf("a budgeted key lifting the account's budget: %d %s", r.Status, r.Raw)
	}
	// nor move the midnights that start its budget over
	if r := e.do("PATCH", "/v1/me", capped, map[string]any{"timezone": "Pacific/Kiritimati"}); r.Status != 403 {
		t.Fatalf("a budgeted key moving the account's zone: %d %s", r.Status, r.Raw)
	}
	if r := e.do("PATCH", "/v1/me", capped, map[string]any{"timezone": "UTC"}); r.Status != 200 {
		t.Fatalf("a budgeted key naming the zone already in force: %d %s", r.Status, r.Raw)
	}
	// nor may a test key, budget or not: the zone moves the live keys' periods too
	tester, _ := e.createKey(owner, map[string]any{"label": "tests", "env": "test", "scopes": []string{"billing"}})
	if r := e.do("PATCH", "/v1/me", tester, map[string]any{"timezone": "Pacific/Kiritimati"}); r.Status != 403 {
		t.Fatalf("a test key moving the account's zone: %d %s", r.Status, r.Raw)
	}
	// all or nothing: a bad budget leaves the zone given with it unchanged
	if r := e.do("PATCH", "/v1/me", owner, map[string]any{"timezone": "Europe/Paris", "budget_units": -1}); r.Status != 400 {
		t.Fatalf("PATCH /me with a negative budget: %d %s", r.Status, r.Raw)
	}
	if me := e.do("GET", "/v1/me", owner, nil); me.Body["timezone"] != "UTC" {
		t.Fatalf("a refused PATCH /me changed the zone to %v", me.Body["timezone"])
	}

	// 20 concurrent calls from two keys against 5 calls' worth
	results := make(chan int, 20)
	for i := range 20 {
		key := a
		if i%2 == 1 {
			key = b
		}
		go func() {
			results <- e.do("POST", "/v1/eval", key, evalBody(cheapFEN, fmt.Sprintf(`"depth":%d`, 6+i%3))).Status
		}()
	}
	ok := 0
	for range 20 {
		switch s := <-results; s {
		case 200:
			ok++
		case 402, 503: // over the budget; or no engine free in time under load (not charged either)
		default:
			t.Errorf("eval: %d", s)
		}
	}
	e.caughtUp()
	var charged int64
	accountID := e.do("GET", "/v1/me", owner, nil).Body["account_id"]
	if err := e.pool.QueryRow(ctx, `SELECT coalesce(sum(units), 0) FROM charge_lines() WHERE account_id = $1`, accountID).Scan(&charged); err != nil {
		t.Fatal(err)
	}
	if ok == 0 || ok > 5 || charged != int64(ok)*10 || charged > 50 {
		t.Fatalf("%d calls answered and %d units charged against an account budget of 50", ok, charged)
	}
	t.Logf("%d of 20 concurrent calls answered, %d units charged", ok, charged)
	r = e.do("POST", "/v1/eval", a, evalBody(cheapFEN, `"depth":9`))
	if ok == 5 {
		wantProblem(t, r, 402, "raise_budget")
	}
	me := e.do("GET", "/v1/me", owner, nil).Body["budget"].(map[string]any)
	if me["period_spent_units"] != float64(charged) {
		t.Fatalf("/me budget after the calls: %v, %d charged", me, charged)
	}
	cs, err := alerts.Check(ctx, e.pool)
	if err != nil {
		t.Fatal(err)
	}
	account := 0
	for _, c := range cs {
		if c.KeyID == "" {
			account++
		}
	}
	if want := map[bool]int{true: 3, false: 2}[ok == 5]; ok >= 4 && account != want {
		t.Fatalf("%d account alerts at %d of 50 units, want %d", account, charged, want)
	}

	if r := e.do("PATCH", "/v1/me", owner, map[string]any{"budget_units": nil}); r.Status != 200 ||
		r.Body["budget"].(map[string]any)["budget_units"] != nil {
		t.Fatalf("removing the account's budget: %d %s", r.Status, r.Raw)
	}
	if r := e.do("POST", "/v1/eval", b, evalBody(cheapFEN, `"depth":10`)); r.Status != 200 {
		t.Fatalf("eval without an account budget: %d %s", r.Status, r.Raw)
	}
}

// A charge's explanation counts the key's spend within the budget's period that holds
// the charge, in the account's zone, as the meter counted it: for a daily budget, not
// the charges of earlier days.
func TestExplainChargeInItsPeriod(t *testing.T) {
	e := newEnv(t)
	e.svc.DisableCache() // every eval: 10 units
	owner := e.signupPro("explain-period@example.com")
	ctx := context.Background()
	if r := e.do("PATCH", "/v1/me", owner, map[string]any{"timezone": "America/New_York"}); r.Status != 200 {
		t.Fatalf("PATCH /me: %d %s", r.Status, r.Raw)
	}
	secret, keyID := e.createKey(owner, map[string]any{"label": "daily", "scopes": []string{"eval"},
		"budget_units": 100, "budget_period": "day"})
	for range 3 {
		if r := e.do("POST", "/v1/eval", secret, evalBody(cheapFEN, `"depth":8`)); r.Status != 200 {
			t.Fatalf("eval: %d %s", r.Status, r.Raw)
		}
	}
	e.caughtUp()
	ids := e.chargeIDs(keyID)
	if len(ids) != 3 {
		t.Fatalf("%d charges, want 3", len(ids))
	}
	// the first charge as if made a day earlier: its line in the log, which the
	// explanation sums, and the bounds of its event's lines in the read model
	pos, line, ok := ledger.ParseLineChargeID(ids[0])
	if !ok {
		t.Fatalf("charge id %s is not a line's", ids[0])
	}
	if _, err := e.pool.Exec(ctx, `UPDATE events SET payload = jsonb_set(payload::jsonb, ARRAY['lines', $2::text, 'charged_at'],
			to_jsonb((payload->'lines'->$3::int->>'charged_at')::timestamptz - interval '1 day'))::json WHERE position = $1`,
		pos, fmt.Sprint(line), line); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE charge_batches SET first_at = first_at - interval '1 day' WHERE position = $1`, pos); err != nil {
		t.Fatal(err)
	}
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().In(ny)
	midnight := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, ny)
	for _, tc := range []struct {
		charge        string
		before, after float64
	}{
		{ids[1], 0, 10}, // the day's first
		{ids[2], 10, 20},
	} {
		r := e.do("GET", "/v1/charges/"+tc.charge, owner, nil)
		if r.Status != 200 {
			t.Fatalf("explain %s: %d %s", tc.charge, r.Status, r.Raw)
		}
		k := r.Body["key"].(map[string]any)
		start, _ := time.Parse(time.RFC3339, fmt.Sprint(k["period_start"]))
		end, _ := time.Parse(time.RFC3339, fmt.Sprint(k["period_end"]))
		if k["budget_period"] != "day" || !start.Equal(midnight) || !end.Equal(midnight.AddDate(0, 0, 1)) {
			t.Fatalf("explain %s: period %v from %v to %v, want the day from %v", tc.charge, k["budget_period"], k["period_start"], k["period_end"], midnight)
		}
		if k["spent_units_before"] != tc.before || k["spent_units_after"] != tc.after || k["remaining_units_after"] != 100-tc.after {
			t.Fatalf("explain %s: spent %v -> %v, remaining %v; want %v -> %v of the day's 100", tc.charge,
				k["spent_units_before"], k["spent_units_after"], k["remaining_units_after"], tc.before, tc.after)
		}
	}
}
