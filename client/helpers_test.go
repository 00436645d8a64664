package client

import (
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

// A problem as an error says each fault once: the detail names the first invalid field
// already, the others are added after it.
func TestProblemError(t *testing.T) {
	for _, tc := range []struct {
		name   string
		p      Problem
		want   string
		faults []FieldError
	}{
		{name: "no fields", p: Problem{Status: 402, Title: "Payment required", Detail: "budget spent"},
			want: "402 Payment required: budget spent"},
		{name: "the detail names the only field", p: Problem{Status: 400, Title: "Invalid request", Detail: "fen: FEN has 1 fields, want 6"},
			faults: []FieldError{{Field: "fen", Reason: "FEN has 1 fields, want 6"}},
			want:   "400 Invalid request: fen: FEN has 1 fields, want 6"},
		{name: "the detail names the first of three", p: Problem{Status: 400, Title: "Invalid request", Detail: "depth: above 40 (and 2 more)"},
			faults: []FieldError{{Field: "depth", Reason: "above 40"}, {Field: "multipv", Reason: "below 1"}, {Field: "options.elo", Reason: "not a number"}},
			want:   "400 Invalid request: depth: above 40 (and 2 more); multipv: below 1; options.elo: not a number"},
		{name: "a detail that names none", p: Problem{Status: 400, Title: "Invalid request", Detail: "the body is not valid"},
			faults: []FieldError{{Field: "fen", Reason: "required"}},
			want:   "400 Invalid request: the body is not valid; fen: required"},
	} {
		if tc.faults != nil {
			tc.p.Errors = &tc.faults
		}
		if got := tc.p.Error(); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// An answer with Retry-After says the delay in its error, in seconds, and is still a
// *Problem to errors.As.
func TestCheckSaysRetryAfter(t *testing.T) {
	body := []byte(`{"type":"x","title":"Too many requests","status":429,"detail":"more than 120 requests a minute; retry after the Retry-After delay","next_action":"retry_after"}`)
	for _, tc := range []struct {
		header string
		want   string // a pattern the message must match
	}{
		{"37", `retry after the Retry-After delay \(Retry-After: 37 s\)$`},
		{time.Now().Add(30 * time.Second).UTC().Format(http.TimeFormat), `\(Retry-After: (29|30) s\)$`},
		{"", `Retry-After delay$`},
		{"soon", `Retry-After delay$`}, // unreadable: not invented
	} {
		res := &http.Response{StatusCode: 429, Status: "429 Too Many Requests", Header: http.Header{}}
		if tc.header != "" {
			res.Header.Set("Retry-After", tc.header)
		}
		err := Check(res, body)
		var p *Problem
		if err == nil || !regexp.MustCompile(tc.want).MatchString(err.Error()) || !errors.As(err, &p) || p.Status != 429 {
			t.Errorf("Retry-After %q: %v, want a *Problem matching %s", tc.header, err, tc.want)
		}
		if strings.Count(err.Error(), "Retry-After:") > 1 {
			t.Errorf("Retry-After %q: said twice: %v", tc.header, err)
		}
	}
}
