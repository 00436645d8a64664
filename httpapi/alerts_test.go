package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"chessd/alerts"
	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
)

// A key's spend crossing 50 % of its budget is told once, to the account's webhook
// endpoints, as a queued delivery; a refund that takes the spend back under re-arms it,
// and the next crossing is told again.
func TestBudgetAlerts(t *testing.T) {
	e := newEnv(t)
	e.svc.DisableCache() // every eval below is a fresh one: 10 units
	owner := e.signupPro("alerts@example.com")
	secret, keyID := e.createKey(owner, map[string]any{"label": "capped", "scopes": []string{"eval"}, "budget_units": 100})
	hook := e.do("POST", "/v1/webhooks", owner, map[string]any{"url": "http://127.0.0.1:9/hooks"})
	if hook.Status != 201 {
		t.Fatalf("webhook: %d %s", hook.Status, hook.Raw)
	}
	hookID := hook.Body["id"].(string)
	ctx := context.Background()
	// a key of another account whose budget a release before budgets were bounded took
	// near 2^63: the check, which runs for every account at once, overflowed on it
	other := e.signupPro("alerts-other@example.com")
	_, legacyID := e.createKey(other, map[string]any{"label": "legacy", "scopes": []string{"eval"}, "budget_units": 1})
	if _, err := e.pool.Exec(ctx, `UPDATE key_balances SET budget_units = 9223372036854775807 WHERE key_id = $1`, legacyID); err != nil {
		t.Fatal(err)
	}
	if r := e.do("POST", "/v1/keys", other, map[string]any{"scopes": []string{"eval"}, "budget_units": int64(domain.MaxBudgetUnits) + 1}); r.Status != 400 {
		t.Fatalf("a budget over domain.MaxBudgetUnits: %d %s", r.Status, r.Raw)
	}
	spend := func(n int) {
		t.Helper()
		for i := range n {
			if r := e.do("POST", "/v1/eval", secret, evalBody(cheapFEN, fmt.Sprintf(`"depth":%d`, 8+i%2))); r.Status != 200 {
				t.Fatalf("eval: %d %s", r.Status, r.Raw)
			}
		}
		e.caughtUp()
	}
	told := func() []map[string]any {
		t.Helper()
		var out []map[string]any
		for _, d := range e.do("GET", "/v1/webhooks/"+hookID+"/deliveries", owner, nil).Body["deliveries"].([]any) {
			d := d.(map[string]any)
			if d["type"] == "budget.threshold" {
				var data map[string]any
				raw, _ := json.Marshal(d["data"])
				json.Unmarshal(raw, &data) //nolint:errcheck // checked by the callers' comparisons
				out = append(out, data)
			}
		}
		return out
	}
	check := func() int {
		t.Helper()
		cs, err := alerts.Check(ctx, e.pool)
		if err != nil {
			t.Fatal(err)
		}
		return len(cs)
	}

	spend(3) // 30 units of 100: under every threshold
	if n := check(); n != 0 {
		t.Fatalf("%d crossings under 50 %%", n)
	}
	spend(3) // 60: past 50
	if n := check(); n != 1 {
		t.Fatalf("%d crossings past 50 %%, want 1", n)
	}
	if n := check(); n != 0 {
		t.Fatalf("the crossing was told again (%d)", n)
	}
	msgs := told()
	if len(msgs) != 1 || msgs[0]["threshold_percent"] != float64(50) || msgs[0]["key_id"] != keyID || msgs[0]["budget_units"] != float64(100) {
		t.Fatalf("alerts: %v", msgs)
	}
	// a refund of every charge takes the spend back to 0: the 50 % alert is re-armed
	ids := e.chargeIDs(keyID)
	if _, err := commands.New(eventstore.NewStore(e.pool, nil), nil).RefundCharges(ctx, ids, "test refund", "ops:test", "r"); err != nil {
		t.Fatal(err)
	}
	if n := check(); n != 0 {
		t.Fatalf("%d crossings after the refund", n)
	}
	spend(6)
	if n := check(); n != 1 || len(told()) != 2 {
		t.Fatalf("after spending again: %d new crossings, %d alerts", n, len(told()))
	}
}
