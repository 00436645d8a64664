package httpapi

import (
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"chessd/domain"
)

// usageProblemFields lists the fields a validation error names, sorted.
func usageProblemFields(t *testing.T, err error) []string {
	t.Helper()
	var de *domain.Error
	if !errors.As(err, &de) || de.Code != domain.CodeInvalid {
		t.Fatalf("error %v, want a validation error", err)
	}
	var out []string
	for _, f := range de.Fields {
		out = append(out, f.Field)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// GET /usage's parameters: dates are days of the asked zone (a daylight-saving day is
// 23 or 25 hours long), instants are taken as given, and every bad parameter is named.
func TestParseUsage(t *testing.T) {
	now := time.Date(2026, 11, 23, 15, 0, 0, 0, time.UTC)
	tests := []struct {
		query    string
		from, to string // RFC 3339, want
		dims     string
		problems string // the fields reported, in order; "" for none
	}{
		{query: "", from: "2026-10-24T00:00:00Z", to: "2026-11-24T00:00:00Z"},
		{query: "tz=America/New_York&from=2026-03-08&to=2026-03-08", from: "2026-03-08T05:00:00Z", to: "2026-03-09T04:00:00Z"},
		{query: "tz=America/New_York&from=2026-11-01&to=2026-11-01", from: "2026-11-01T04:00:00Z", to: "2026-11-02T05:00:00Z"},
		{query: "tz=Asia/Kolkata&from=2026-01-01&to=2026-01-31", from: "2025-12-31T18:30:00Z", to: "2026-01-31T18:30:00Z"},
		// midnights that do not exist: the clocks jump from 00:00 to 01:00, so the day
		// starts at the jump (time.Date gave 23:00 of the day before)
		{query: "tz=America/Santiago&from=2026-09-06&to=2026-09-06", from: "2026-09-06T04:00:00Z", to: "2026-09-07T03:00:00Z"},
		{query: "tz=America/Santiago&from=2026-09-05&to=2026-09-05", from: "2026-09-05T04:00:00Z", to: "2026-09-06T04:00:00Z"},
		{query: "tz=Atlantic/Azores&from=2026-03-29&to=2026-03-29", from: "2026-03-29T01:00:00Z", to: "2026-03-30T00:00:00Z"},
		{query: "from=0000-01-01", problems: "from"},
		{query: "to=0000-12-31T00:00:00Z", problems: "to"},
		{query: "from=2026-11-01T10:00:00Z&to=2026-11-01T11:30:00%2B01:00", from: "2026-11-01T10:00:00Z", to: "2026-11-01T10:30:00Z"},
		{query: "group_by=key,hour,cached,key&window=hour", from: "2026-10-24T00:00:00Z", to: "2026-11-24T00:00:00Z", dims: "key,hour,cached"},
		{query: "window=month", from: "2026-10-24T00:00:00Z", to: "2026-11-24T00:00:00Z", dims: "month"},
		{query: "as_of=2026-11-20T12:00:00Z", from: "2026-10-24T00:00:00Z", to: "2026-11-20T12:00:00Z"},
		{query: "as_of=2026-11-23T14:59:30Z", problems: "as_of"},
		{query: "as_of=2026-11-20", problems: "as_of"},
		{query: "as_of=2026-10-01T00:00:00Z", problems: "to"},
		{query: "group_by=day&window=month", problems: "window"},
		{query: "group_by=weekday", problems: "group_by"},
		{query: "tz=Mars/Olympus", problems: "tz"},
		{query: "tz=../../etc/passwd", problems: "tz"},
		{query: "tz=Local", problems: "tz"},
		{query: "from=2026-11-30&to=2026-11-01", problems: "to"},
		{query: "from=2026-11-02&to=2026-11-01", problems: "to"},
		{query: "tz=Asia/Kolkata&from=2026-11-02&to=2026-11-01", problems: "to"},
		{query: "from=yesterday&limit=0&cursor=xyz", problems: "cursor from limit"},
		{query: "group_by=day&cursor=" + usageCursorOf("group_by=day", now, "2026-11-01", "x"), problems: "cursor"},
		{query: "group_by=day&cursor=" + usageCursorOf("group_by=day", now, "2026-11-01\x00"), problems: "cursor"},
	}
	for _, tc := range tests {
		t.Run(tc.query, func(t *testing.T) {
			q, err := url.ParseQuery(tc.query)
			if err != nil {
				t.Fatal(err)
			}
			u, err := parseUsage(q, now)
			if tc.problems != "" {
				got := usageProblemFields(t, err)
				if strings.Join(got, " ") != tc.problems {
					t.Fatalf("problems in %v, want %s", got, tc.problems)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if f, to := u.from.UTC().Format(time.RFC3339), u.to.UTC().Format(time.RFC3339); f != tc.from || to != tc.to {
				t.Fatalf("range [%s, %s), want [%s, %s)", f, to, tc.from, tc.to)
			}
			if d := strings.Join(u.dims, ","); d != tc.dims {
				t.Fatalf("groups %s, want %s", d, tc.dims)
			}
		})
	}
}

// usageCursorOf is the cursor of the page of query (at now) that ends at values.
func usageCursorOf(query string, now time.Time, values ...string) string {
	q, err := url.ParseQuery(query)
	if err != nil {
		panic(err)
	}
	u, err := parseUsage(q, now)
	if err != nil {
		panic(err)
	}
	return encodeUsageCursor(u.scope, values)
}

// A /usage cursor is good for the query that made it and for no other that groups,
// labels or bounds its groups differently: its values mean nothing against other
// columns (a cursor of group_by=key, read as endpoints, skipped them all).
func TestUsageCursorScope(t *testing.T) {
	now := time.Date(2026, 11, 23, 15, 0, 0, 0, time.UTC)
	tests := []struct {
		made, used string // the query that made the cursor, the one it comes with
		ok         bool
	}{
		{"group_by=key", "group_by=key&limit=5", true},
		{"group_by=day", "window=day", true},
		{"group_by=key,key", "group_by=key", true},
		{"group_by=key&from=2026-11-01", "group_by=key&from=2026-11-01T00:00:00Z", true},
		{"group_by=key&tz=UTC", "group_by=key", true},
		{"group_by=key", "group_by=endpoint", false},
		{"group_by=key,day", "group_by=day,key", false},
		{"group_by=key,day", "group_by=key,month", false},
		{"group_by=key", "group_by=key&tz=Europe/Paris", false},
		{"group_by=key&from=2026-11-01", "group_by=key", false},
		{"group_by=key&from=2026-11-01", "group_by=key&from=2026-11-02", false},
		{"group_by=key&to=2026-11-20", "group_by=key&to=2026-11-21", false},
		{"group_by=key&from=2026-11-01&tz=Europe/Paris", "group_by=key&from=2026-11-01&tz=Europe/Berlin", false},
		{"group_by=key&as_of=2026-11-20T00:00:00Z", "group_by=key", false},
	}
	for _, tc := range tests {
		t.Run(tc.made+" then "+tc.used, func(t *testing.T) {
			q, err := url.ParseQuery(tc.used)
			if err != nil {
				t.Fatal(err)
			}
			values := []string{"x"}
			if strings.Contains(tc.made, ",day") {
				values = append(values, "2026-11-01")
			}
			q.Set("cursor", usageCursorOf(tc.made, now, values...))
			u, err := parseUsage(q, now)
			switch {
			case tc.ok && err != nil:
				t.Fatalf("refused: %v", err)
			case !tc.ok && err == nil:
				t.Fatalf("accepted, after %q", u.after)
			case !tc.ok:
				if got := usageProblemFields(t, err); strings.Join(got, " ") != "cursor" {
					t.Fatalf("problems in %v, want cursor", got)
				}
			}
		})
	}
}

// FuzzUsageCursor: no cursor crashes the decoder, and a decoded one is the one
// encodeUsageCursor makes of its values (one spelling per cursor).
func FuzzUsageCursor(f *testing.F) {
	scope := usageScope([]string{"key", "day"}, time.UTC, [3]string{}, "")
	f.Add(encodeUsageCursor(scope, []string{"key_1", "2026-11-01"}), scope, 2)
	f.Add(encodeUsageCursor(scope, []string{"key_1", "2026-11-01"}), usageScope([]string{"endpoint", "day"}, time.UTC, [3]string{}, ""), 2)
	f.Add("WyJrZXlfMSIsIjIwMjYtMTEtMDEiXQ", scope, 2) // the cursors before scopes: ["key_1","2026-11-01"]
	f.Add("", scope, 1)
	f.Add("bnVsbA", "", 1)
	f.Fuzz(func(t *testing.T, s, scope string, groups int) {
		values, ok := decodeUsageCursor(s, scope, groups)
		if !ok {
			return
		}
		if again := encodeUsageCursor(scope, values); again != s {
			t.Fatalf("%q decoded to %q, which encodes as %q", s, values, again)
		}
	})
}
