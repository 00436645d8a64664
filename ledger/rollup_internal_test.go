package ledger

import (
	"testing"
	"time"
)

// A zone keeps UTC's hours when each UTC hour is one hour of its clock: whole-hour
// offsets, changed on a UTC hour (daylight saving included); not a half- or
// quarter-hour zone, a zone whose daylight saving moves by half an hour, or a
// pre-standard local mean time.
func TestZoneKeepsUTCHours(t *testing.T) {
	day := func(y int, m time.Month, d int) time.Time { return time.Date(y, m, d, 0, 0, 0, 0, time.UTC) }
	for _, c := range []struct {
		zone     string
		from, to time.Time
		want     bool
	}{
		{"UTC", day(2026, 1, 1), day(2027, 1, 1), true},
		{"America/New_York", day(2026, 3, 1), day(2026, 4, 1), true}, // spring forward
		{"America/New_York", day(2026, 1, 1), day(2036, 1, 1), true}, // ten years of changes
		{"Europe/Paris", day(2026, 10, 1), day(2026, 11, 1), true},
		{"Asia/Kolkata", day(2026, 3, 1), day(2026, 4, 1), false},        // +05:30
		{"Asia/Kathmandu", day(2026, 3, 1), day(2026, 4, 1), false},      // +05:45
		{"Australia/Lord_Howe", day(2026, 1, 1), day(2027, 1, 1), false}, // +10:30, +11 in summer
		{"America/New_York", day(1883, 11, 1), day(1883, 12, 1), false},  // local mean time until noon of the 18th
		{"Not/A_Zone", day(2026, 1, 1), day(2026, 2, 1), false},
	} {
		if got := zoneKeepsUTCHours(c.zone, c.from, c.to); got != c.want {
			t.Errorf("%s from %s to %s: %v, want %v", c.zone, c.from.Format(time.DateOnly), c.to.Format(time.DateOnly), got, c.want)
		}
	}
}

// hourSpan leaves the whole UTC hours of a range to the rollup and its ragged ends to
// the charges.
func TestHourSpan(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		from, to         string
		hourFrom, hourTo string // "" when no whole hour
	}{
		{"2026-03-08T00:00:00Z", "2026-03-09T00:00:00Z", "2026-03-08T00:00:00Z", "2026-03-09T00:00:00Z"},
		{"2026-03-08T00:00:00.000001Z", "2026-03-08T05:59:59Z", "2026-03-08T01:00:00Z", "2026-03-08T05:00:00Z"},
		{"2026-03-08T00:00:00-05:30", "2026-03-09T00:00:00-05:30", "2026-03-08T06:00:00Z", "2026-03-09T05:00:00Z"},
		{"2026-03-08T00:10:00Z", "2026-03-08T01:50:00Z", "", ""}, // straddles an hour, holds none whole
		{"2026-03-08T00:10:00Z", "2026-03-08T00:50:00Z", "", ""},
	} {
		hf, ht, ok := hourSpan(at(c.from), at(c.to))
		if !ok && c.hourFrom == "" {
			continue
		}
		if !ok || !hf.Equal(at(c.hourFrom)) || !ht.Equal(at(c.hourTo)) {
			t.Errorf("[%s, %s): hours [%s, %s) %v, want [%s, %s)", c.from, c.to, hf, ht, ok, c.hourFrom, c.hourTo)
		}
	}
}
