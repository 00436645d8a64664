package ledger_test

import (
	"context"
	"testing"
	"time"

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
