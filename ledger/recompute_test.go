package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"chessd/commands"
	"chessd/domain"
	"chessd/ledger"
)

// replayFixture is rollupFixture's account (a key without a budget, a second live key
// and a test key) in a zone whose midnight is hours away, with an account budget per
// month, a daily key with a budget, charges on every key, credits, and the second live
// key moved to a monthly budget between its charges (its period recounted from the
// charges, then settled into).
type replayFixture struct {
	*rollupFixture
	day *domain.Key
}

func newReplayFixture(t *testing.T) *replayFixture {
	t.Helper()
	ctx := context.Background()
	f := &replayFixture{rollupFixture: newRollupFixture(t)}
	h := commands.New(f.store, []byte("meter-test-pepper-0123456789"))
	// local noon, give or take an hour: no period of the test starts while it runs
	tz := "UTC"
	if off := 12 - time.Now().UTC().Hour(); off != 0 {
		tz = fmt.Sprintf("Etc/GMT%+d", -off) // Etc/GMT-5 is UTC+5
	}
	accountBudget := int64(1_000_000)
	if _, err := h.UpdateAccount(ctx, commands.Actor{Key: f.admin}, commands.AccountChange{Timezone: &tz,
		Budget: &domain.BudgetChange{Units: &accountBudget, Period: domain.PeriodMonth}}); err != nil {
		t.Fatal(err)
	}
	var err error
	if f.account, err = commands.LoadAccount(ctx, f.pool, f.account.ID()); err != nil {
		t.Fatal(err)
	}
	budget := int64(100_000)
	f.day = f.createKey(t, domain.KeySettings{Scopes: []domain.Scope{domain.ScopeEval}, Env: domain.EnvLive,
		BudgetUnits: &budget, Period: domain.PeriodDay})
	f.keys = append(f.keys, f.day)
	now := time.Now()
	for i := range 8 { // keys[i%4]: the key without a budget, the second live key, the test key, the daily key
		f.charge(t, i, now)
	}
	if _, err := h.UpdateKey(ctx, commands.Actor{Key: f.admin}, f.keys[1].ID(),
		domain.KeyChange{Budget: domain.BudgetChange{Units: &budget, Period: domain.PeriodMonth}}); err != nil {
		t.Fatal(err)
	}
	if f.keys[1], err = commands.LoadKey(ctx, f.pool, f.keys[1].ID()); err != nil {
		t.Fatal(err)
	}
	for i := 8; i < 12; i++ {
		f.charge(t, i, now)
	}
	for _, req := range []string{"req-0", "req-3", "req-5", "req-6"} { // one charge of each key
		f.credit(t, req, now)
	}
	// the fixture is what it says: periods with spend in them, on both kinds of row
	for _, q := range []string{
		`SELECT count(*) FROM key_balances WHERE account_id = $1 AND budget_period = 'day' AND period_start IS NOT NULL AND period_units > 0`,
		`SELECT count(*) FROM key_balances WHERE account_id = $1 AND budget_period = 'month' AND period_start IS NOT NULL AND period_units > 0`,
		`SELECT count(*) FROM key_balances WHERE account_id = $1 AND budget_period = 'total' AND period_units > 0`,
		`SELECT count(*) FROM account_budgets WHERE account_id = $1 AND env = 'live' AND budget_period = 'month' AND period_start IS NOT NULL AND period_units > 0`,
		`SELECT count(*) FROM credits WHERE account_id = $1`,
	} {
		if n := count(t, f.pool, q, f.account.ID()); n == 0 {
			t.Fatalf("the fixture has no row of %s", q)
		}
	}
	return f
}

// `chessd replay`'s checks find every column of the write-side balances that GET /me
// and GET /keys show, or the budget rule reads, wrong when it is not what the charges
// and credits say: the key's and the account budget's spend in the current period (the
// reviewer's case: a total budget's period spend lost while its charges stand), and
// balances or days wrong at zero or below, which a filter on positive rows hid on both
// sides. An untouched ledger (charges, credits, daily, monthly and total periods, an
// account budget) is equal everywhere.
func TestReplayChecksEveryBalance(t *testing.T) {
	f := newReplayFixture(t)
	ctx := context.Background()
	checks, err := ledger.RecomputeBalances(ctx, f.pool)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, c := range checks {
		names[c.Name] = true
		if !c.Equal() {
			t.Errorf("untouched ledger: %s differs: live %v, from the events %v", c.Name, c.Live, c.Replayed)
		}
	}
	for _, n := range []string{"key_balances.spent", "key_balances.period", "account_budgets.period", "account_days"} {
		if !names[n] {
			t.Errorf("no check %s among %v", n, names)
		}
	}
	// the budgets and periods the fixture's events set are the meter's (day, month,
	// total keys; an account budget)
	settings, err := ledger.RecomputeSettings(ctx, f.pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range settings {
		if !c.Equal() || len(c.Live) == 0 && c.Name != "account_zones" {
			t.Errorf("untouched ledger: %s: live %v, from the events %v", c.Name, c.Live, c.Replayed)
		}
	}
	var adminID string
	if err := f.pool.QueryRow(ctx, `SELECT key_id FROM key_balances WHERE account_id = $1 AND key_id <> ALL ($2)`,
		f.account.ID(), []string{f.keys[0].ID(), f.keys[1].ID(), f.keys[2].ID(), f.day.ID()}).Scan(&adminID); err != nil {
		t.Fatal(err)
	}
	acct := f.account.ID()
	for _, tc := range []struct {
		name, sql string
		args      []any
		check     string
	}{
		{"a daily key's period units", `UPDATE key_balances SET period_units = period_units - 1 WHERE key_id = $1`,
			[]any{f.day.ID()}, "key_balances.period"},
		{"a daily key's period USD", `UPDATE key_balances SET period_usd = period_usd + 0.000001 WHERE key_id = $1`,
			[]any{f.day.ID()}, "key_balances.period"},
		{"a monthly key's period units", `UPDATE key_balances SET period_units = period_units + 7 WHERE key_id = $1`,
			[]any{f.keys[1].ID()}, "key_balances.period"},
		{"a total budget's period spend lost", `UPDATE key_balances SET period_units = 0, period_usd = 0 WHERE key_id = $1`,
			[]any{f.keys[0].ID()}, "key_balances.period"},
		{"a key that spent nothing, period below zero", `UPDATE key_balances SET period_units = -3 WHERE key_id = $1`,
			[]any{adminID}, "key_balances.period"},
		{"the account budget's period units", `UPDATE account_budgets SET period_units = period_units + 1 WHERE account_id = $1 AND env = 'live'`,
			[]any{acct}, "account_budgets.period"},
		{"the account budget's period USD", `UPDATE account_budgets SET period_usd = 0 WHERE account_id = $1 AND env = 'live'`,
			[]any{acct}, "account_budgets.period"},
		{"an account's budget row lost while its env is charged", `DELETE FROM account_budgets WHERE account_id = $1 AND env = 'test'`,
			[]any{acct}, "account_budgets.period"},
		{"a charged key's balance row lost", `DELETE FROM key_balances WHERE key_id = $1`,
			[]any{f.keys[2].ID()}, "key_balances.spent"},
		{"a key's spend zeroed while its charges stand", `UPDATE key_balances SET spent_units = 0, spent_usd = 0 WHERE key_id = $1`,
			[]any{f.day.ID()}, "key_balances.spent"},
		{"a key that spent nothing, spend below zero", `UPDATE key_balances SET spent_units = -10, spent_usd = -0.0001 WHERE key_id = $1`,
			[]any{adminID}, "key_balances.spent"},
		{"a day's use zeroed", `UPDATE account_days SET units = 0 WHERE account_id = $1 AND env = 'live'`,
			[]any{acct}, "account_days"},
		{"a day nothing was charged on, below zero", `INSERT INTO account_days (account_id, env, day, units) VALUES ($1, 'live', current_date - 3, -5)`,
			[]any{acct}, "account_days"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx, err := f.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck // the corruption goes with it
			tag, err := tx.Exec(ctx, tc.sql, tc.args...)
			if err != nil || tag.RowsAffected() != 1 {
				t.Fatalf("%s: %v, %d rows", tc.sql, err, tag.RowsAffected())
			}
			checks, err := ledger.RecomputeBalances(ctx, tx)
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, c := range checks {
				if c.Name == tc.check {
					found = true
				}
				if c.Equal() != (c.Name != tc.check) {
					t.Errorf("%s: equal %v: live %v, from the events %v", c.Name, c.Equal(), c.Live, c.Replayed)
				}
			}
			if !found {
				t.Errorf("no check %s", tc.check)
			}
		})
	}
}

// `chessd replay` on a running service: charges settling while the checks run are not
// reported as differences, as every check reads its live rows and recounts them on one
// snapshot (a settle committing between the two reads was reported).
func TestRecomputeReadsOneSnapshot(t *testing.T) {
	f := newReplayFixture(t)
	ctx := context.Background()
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 100; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			f.charge(t, i, time.Now())
		}
	}()
	var differs []string
	for range 150 {
		balances, settings, err := ledger.Recompute(ctx, f.pool)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range append(balances, settings...) {
			if !c.Equal() {
				differs = append(differs, c.Name)
			}
		}
	}
	close(stop)
	<-done
	if len(differs) > 0 {
		t.Errorf("checks run while charges settled report differences: %v", differs)
	}
}
