package ledger_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"chessd/ledger"
)

// clockedMeter is a meter whose clock the test sets: charge makes one answered call,
// settled, at the instant given.
func clockedMeter(t *testing.T, f *fixture) (charge func(i int, at time.Time, cached bool)) {
	t.Helper()
	m := f.meter(t, ledger.MeterConfig{})
	var clock atomic.Value
	ledger.SetClock(m, func() time.Time { return clock.Load().(time.Time) })
	return func(i int, at time.Time, cached bool) {
		t.Helper()
		ctx := context.Background()
		clock.Store(at.UTC())
		r, err := m.Reserve(ctx, f.evalCall(i))
		if err != nil {
			t.Fatal(err)
		}
		a := answered()
		a.Cached = cached
		if err := r.Settle(a); err != nil {
			t.Fatal(err)
		}
		if err := m.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Usage buckets charges by the calendar of the asked time zone: across New York's
// March 2026 daylight-saving change (02:00 EST became 03:00 EDT on the 8th, a 23-hour
// day), days and hours fall where a New Yorker's clock put them, not where UTC's does.
func TestUsageInATimeZoneAcrossDaylightSaving(t *testing.T) {
	f := newFixture(t, nil)
	charge := clockedMeter(t, f)
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	instants := []string{
		"2026-03-07T23:30:00-05:00", // 04:30Z on the 8th
		"2026-03-08T00:30:00-05:00",
		"2026-03-08T01:59:00-05:00",
		"2026-03-08T03:10:00-04:00", // the clock jumped from 02:00 to 03:00
		"2026-03-08T23:50:00-04:00", // 03:50Z on the 9th
		"2026-03-09T00:10:00-04:00",
	}
	ctx := context.Background()
	for i, s := range instants {
		charge(i, at(s), false)
	}
	// from 2026-03-07 to 2026-03-09 in New York, both days whole
	from, to := time.Date(2026, 3, 7, 0, 0, 0, 0, ny), time.Date(2026, 3, 10, 0, 0, 0, 0, ny)
	tests := []struct {
		zone  string
		group string
		want  string // value:calls, in order
	}{
		{"America/New_York", "day", "2026-03-07:1 2026-03-08:4 2026-03-09:1"},
		{"America/New_York", "hour", "2026-03-07T23:00:00-05:00:1 2026-03-08T00:00:00-05:00:1 2026-03-08T01:00:00-05:00:1 " +
			"2026-03-08T03:00:00-04:00:1 2026-03-08T23:00:00-04:00:1 2026-03-09T00:00:00-04:00:1"},
		{"America/New_York", "month", "2026-03:6"},
		{"UTC", "day", "2026-03-08:4 2026-03-09:2"},
	}
	for _, tc := range tests {
		t.Run(tc.zone+"/"+tc.group, func(t *testing.T) {
			rep, err := ledger.Usage(ctx, f.pool, ledger.UsageQuery{AccountID: f.account.ID(), From: from, To: to, Zone: tc.zone, GroupBy: []string{tc.group}})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			var calls, units int64
			for _, g := range rep.Groups {
				got = append(got, fmt.Sprintf("%s:%d", g.Values[0], g.Calls))
				calls, units = calls+g.Calls, units+g.Units
			}
			if strings.Join(got, " ") != tc.want {
				t.Fatalf("groups %s, want %s", strings.Join(got, " "), tc.want)
			}
			if rep.Calls != 6 || calls != rep.Calls || units != rep.Units || rep.Units != 6*10 {
				t.Fatalf("totals %d calls %d units; groups add up to %d and %d", rep.Calls, rep.Units, calls, units)
			}
		})
	}
	// the 8th alone is 23 hours in New York: four charges, bounds included
	day := ledger.UsageQuery{AccountID: f.account.ID(), From: time.Date(2026, 3, 8, 0, 0, 0, 0, ny), To: time.Date(2026, 3, 9, 0, 0, 0, 0, ny), Zone: "America/New_York"}
	if rep, err := ledger.Usage(ctx, f.pool, day); err != nil || rep.Calls != 4 || day.To.Sub(day.From) != 23*time.Hour {
		t.Fatalf("the 8th: %d calls (%v) over %v", rep.Calls, err, day.To.Sub(day.From))
	}
}

// Pages of groups, each after the last one's values, give every group once and in
// order, and add up to the totals.
func TestUsagePages(t *testing.T) {
	f := newFixture(t, nil)
	charge := clockedMeter(t, f)
	ctx := context.Background()
	start := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	for i := range 30 {
		charge(i, start.Add(time.Duration(i)*7*time.Hour), i%3 == 0)
	}
	q := ledger.UsageQuery{AccountID: f.account.ID(), From: start, To: start.AddDate(0, 1, 0), GroupBy: []string{"day", "cached"}}
	all, err := ledger.Usage(ctx, f.pool, q)
	if err != nil {
		t.Fatal(err)
	}
	var paged []string
	var calls int64
	q.Limit = 4
	for pages := 0; ; pages++ {
		rep, err := ledger.Usage(ctx, f.pool, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range rep.Groups {
			paged = append(paged, strings.Join(g.Values, "/"))
			calls += g.Calls
		}
		if rep.Calls != all.Calls || rep.Units != all.Units {
			t.Fatalf("page %d totals %d/%d, want the range's %d/%d", pages, rep.Calls, rep.Units, all.Calls, all.Units)
		}
		if !rep.More {
			break
		}
		q.After = rep.Groups[len(rep.Groups)-1].Values
	}
	var whole []string
	for _, g := range all.Groups {
		whole = append(whole, strings.Join(g.Values, "/"))
	}
	if strings.Join(paged, " ") != strings.Join(whole, " ") || calls != 30 || len(whole) < 10 {
		t.Fatalf("pages gave %v (%d calls), the whole range %v", paged, calls, whole)
	}
}

// Usage up to a past instant (GET /usage's as_of) gives the same answer before and
// after later charges arrive.
func TestUsageAsOfStaysTheSame(t *testing.T) {
	f := newFixture(t, nil)
	charge := clockedMeter(t, f)
	ctx := context.Background()
	start := time.Date(2026, 6, 1, 10, 0, 0, 0, time.UTC)
	for i := range 5 {
		charge(i, start.Add(time.Duration(i)*time.Hour), false)
	}
	asOf := start.Add(150 * time.Minute) // after the third charge
	q := ledger.UsageQuery{AccountID: f.account.ID(), From: start.AddDate(0, 0, -1), To: asOf, GroupBy: []string{"hour"}}
	before, err := ledger.Usage(ctx, f.pool, q)
	if err != nil {
		t.Fatal(err)
	}
	for i := 5; i < 10; i++ {
		charge(i, asOf.Add(time.Duration(i)*time.Minute), false)
	}
	after, err := ledger.Usage(ctx, f.pool, q)
	if err != nil {
		t.Fatal(err)
	}
	if before.Calls != 3 || fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatalf("as of %v: %+v before later charges, %+v after", asOf, before, after)
	}
}
