package ledger_test

import (
	"context"
	"testing"
	"time"

	"chessd/eventstore"
	"chessd/ledger"
	"chessd/postgres/pgtest"
)

// Budget periods follow the zone's calendar, daylight-saving days included: New York's
// 8 March 2026 is 23 hours long and 1 November 2026 25.
func TestBudgetPeriodBounds(t *testing.T) {
	pool := pgtest.NewDB(t)
	utc := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		period, tz, at string
		start, end     string
	}{
		{"day", "America/New_York", "2026-03-08T12:00:00Z", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"},
		{"day", "America/New_York", "2026-11-01T12:00:00Z", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"},
		{"day", "America/New_York", "2026-03-08T04:59:59Z", "2026-03-07T05:00:00Z", "2026-03-08T05:00:00Z"},
		{"month", "America/New_York", "2026-03-15T00:00:00Z", "2026-03-01T05:00:00Z", "2026-04-01T04:00:00Z"},
		{"month", "UTC", "2026-12-31T23:59:59Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{"day", "Asia/Kolkata", "2026-06-01T20:00:00Z", "2026-06-01T18:30:00Z", "2026-06-02T18:30:00Z"},
	} {
		var start, end time.Time
		err := pool.QueryRow(context.Background(), `SELECT period_start, period_end FROM budget_period_bounds($1, $2, $3)`,
			tc.period, tc.tz, utc(tc.at)).Scan(&start, &end)
		if err != nil {
			t.Fatal(err)
		}
		if !start.Equal(utc(tc.start)) || !end.Equal(utc(tc.end)) {
			t.Errorf("%s of %s at %s: [%s, %s), want [%s, %s)", tc.period, tc.tz, tc.at,
				start.UTC().Format(time.RFC3339), end.UTC().Format(time.RFC3339), tc.start, tc.end)
		}
	}
}

// A period that has ended rolls into the next one where it ended, never earlier: after
// a change of the account's zone, the new zone's midnight can lie before the old end,
// and a refund of a charge the old period counted then lowered a period that never held
// it, giving room past the budget. Both the roll and the views that read an ended
// period as the next one start it at the old end, for keys and for account budgets.
func TestNextPeriodStartsWhereTheLastEnded(t *testing.T) {
	budget := int64(1000)
	f := newFixture(t, &budget)
	ctx := context.Background()
	// the old period ended halfway between the zone's last midnight and now
	const endBetween = `(SELECT n.period_start + (now() - n.period_start) / 2
		FROM budget_period_bounds('day', account_tz($1), now()) n)`
	var oldEnd time.Time
	if err := f.pool.QueryRow(ctx, `UPDATE key_balances SET budget_period = 'day', period_units = 7,
		period_end = `+endBetween+`, period_start = `+endBetween+` - interval '1 day'
		WHERE account_id = $1 AND key_id = $2 RETURNING period_end`, f.account.ID(), f.key.ID()).Scan(&oldEnd); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(ctx, `INSERT INTO account_budgets (account_id, env, budget_units, budget_period, period_units, period_end, period_start)
		VALUES ($1, 'test', 500, 'day', 7, $2, $2::timestamptz - interval '1 day')`, f.account.ID(), oldEnd); err != nil {
		t.Fatal(err)
	}
	check := func(what, query string, args ...any) {
		t.Helper()
		var start time.Time
		var units int64
		if err := f.pool.QueryRow(ctx, query, args...).Scan(&start, &units); err != nil {
			t.Fatal(err)
		}
		if !start.Equal(oldEnd) || units != 0 {
			t.Errorf("%s: the next period starts at %s with %d units spent; want it to start where the last ended, %s, with none",
				what, start.UTC().Format(time.RFC3339Nano), units, oldEnd.UTC().Format(time.RFC3339Nano))
		}
	}
	check("key_periods", `SELECT period_start, period_units FROM key_periods WHERE key_id = $1`, f.key.ID())
	check("account_periods", `SELECT period_start, period_units FROM account_periods WHERE account_id = $1 AND env = 'test'`, f.account.ID())
	if _, err := f.pool.Exec(ctx, `SELECT meter_roll(ARRAY[$1]), account_roll(ARRAY[$2], ARRAY['test'])`, f.key.ID(), f.account.ID()); err != nil {
		t.Fatal(err)
	}
	check("meter_roll", `SELECT period_start, period_units FROM key_balances WHERE key_id = $1`, f.key.ID())
	check("account_roll", `SELECT period_start, period_units FROM account_budgets WHERE account_id = $1 AND env = 'test'`, f.account.ID())
}

// A refund gives back only to the period that counted its charge. A server whose clock
// runs ahead of the database's dates a charge just past midnight that a settle deciding
// by the database's clock counted in the day before: its refund then lowered the new
// day's spend, which never held it, and the new day could charge past its budget by
// the refund. The settle rolls the periods at its lines' latest charged_at (0054), so
// the new day counts that charge, and after its refund still counts every charge made
// in it, for the key and for the account budget alike.
func TestRefundGivesBackOnlyToThePeriodThatCountedIt(t *testing.T) {
	budget := int64(1000)
	f := newFixture(t, &budget)
	ctx := context.Background()
	end := dailyPeriodEnding(t, f, "1 second")
	if _, err := f.pool.Exec(ctx, `INSERT INTO account_budgets (account_id, env, budget_units, budget_period, period_units, period_end, period_start)
		VALUES ($1, $2, 1000, 'day', 0, $3, $3::timestamptz - interval '1 day')`, f.account.ID(), f.key.Env(), end); err != nil {
		t.Fatal(err)
	}
	m := f.meter(t, ledger.MeterConfig{})
	// the server's clock, ahead
	ledger.SetClock(m, func() time.Time { return time.Now().Add(2 * time.Second) })
	// dated past the period's end by the server's clock, settled before it by the database's
	settleCall(t, f, m, 0)
	// the database's clock passes the end
	for {
		var past bool
		if err := f.pool.QueryRow(ctx, `SELECT now() > $1`, end).Scan(&past); err != nil {
			t.Fatal(err)
		}
		if past {
			break
		}
		time.Sleep(50 * time.Millisecond) // polling the database's clock
	}
	for i := 1; i <= 3; i++ { // the new day's own calls: 30 units
		settleCall(t, f, m, i)
	}
	var chargeID string
	if err := f.pool.QueryRow(ctx, `SELECT charge_id FROM charge_lines() WHERE request_id = 'req-0'`).Scan(&chargeID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		_, err := ledger.Credit(ctx, tx, ledger.CreditRequest{ChargeID: chargeID, Reason: "test", Actor: "ops"}, time.Now())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for what, query := range map[string]string{
		"key":     `SELECT period_units FROM key_periods WHERE key_id = $1 AND account_id = $2`,
		"account": `SELECT period_units FROM account_periods WHERE $1 <> '' AND account_id = $2`,
	} {
		var units int64
		if err := f.pool.QueryRow(ctx, query, f.key.ID(), f.account.ID()).Scan(&units); err != nil {
			t.Fatal(err)
		}
		if units < 30 {
			t.Errorf("the %s's new period counts %d units after the refund; its own calls were charged 30: a refund gave it back what an earlier period counted", what, units)
		}
	}
}

// A server whose clock is far ahead of the database's cannot end a period early by
// more than a minute: the settle rolls at its calls' answer times at most a minute past
// the database's clock. A period ending in two minutes stays, a call of a server an
// hour ahead counted in it.
func TestAFarAheadClockDoesNotEndAPeriod(t *testing.T) {
	budget := int64(1000)
	f := newFixture(t, &budget)
	ctx := context.Background()
	end := dailyPeriodEnding(t, f, "2 minutes")
	m := f.meter(t, ledger.MeterConfig{})
	ledger.SetClock(m, func() time.Time { return time.Now().Add(time.Hour) })
	settleCall(t, f, m, 0)
	var stored time.Time
	var units int64
	if err := f.pool.QueryRow(ctx, `SELECT period_end, period_units FROM key_balances WHERE key_id = $1`, f.key.ID()).Scan(&stored, &units); err != nil {
		t.Fatal(err)
	}
	if !stored.Equal(end) || units != 10 {
		t.Errorf("the period ends at %s with %d units after a call of a server an hour ahead; want it to end at %s, the call's 10 units counted in it",
			stored.UTC().Format(time.RFC3339Nano), units, end.UTC().Format(time.RFC3339Nano))
	}
}

// dailyPeriodEnding makes f's key's budget daily, its current period ending after the
// interval given (PostgreSQL's words), and returns that end.
func dailyPeriodEnding(t *testing.T, f *fixture, in string) time.Time {
	t.Helper()
	var end time.Time
	if err := f.pool.QueryRow(context.Background(), `UPDATE key_balances SET budget_period = 'day',
		period_start = now() - interval '1 day', period_end = now() + $2::interval
		WHERE key_id = $1 RETURNING period_end`, f.key.ID(), in).Scan(&end); err != nil {
		t.Fatal(err)
	}
	return end
}

// settleCall reserves f's call i on m, answers it and waits for its charge.
func settleCall(t *testing.T, f *fixture, m *ledger.Meter, i int) {
	t.Helper()
	ctx := context.Background()
	r, err := m.Reserve(ctx, f.evalCall(i))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Settle(answered()); err != nil {
		t.Fatal(err)
	}
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}
