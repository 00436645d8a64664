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
		{query: "from=yesterday&limit=0&cursor=xyz", problems: "cursor from limit"},
		{query: "group_by=day&cursor=" + encodeUsageCursor([]string{"2026-11-01", "x"}), problems: "cursor"},
		{query: "group_by=day&cursor=" + encodeUsageCursor([]string{"2026-11-01\x00"}), problems: "cursor"},
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

// FuzzUsageCursor: no cursor crashes the decoder, and a decoded one re-encodes to
// values that decode the same.
func FuzzUsageCursor(f *testing.F) {
	f.Add(encodeUsageCursor([]string{"key_1", "2026-11-01"}), 2)
	f.Add("", 1)
	f.Add("bnVsbA", 1)
	f.Fuzz(func(t *testing.T, s string, groups int) {
		values, ok := decodeUsageCursor(s, groups)
		if !ok {
			return
		}
		again, ok := decodeUsageCursor(encodeUsageCursor(values), groups)
		if !ok || strings.Join(again, "\x00") != strings.Join(values, "\x00") {
			t.Fatalf("%q decoded to %q, which does not round-trip", s, values)
		}
	})
}
