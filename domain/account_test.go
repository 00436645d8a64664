package domain

import (
	"strings"
	"testing"
)

func TestNormalizeEmail(t *testing.T) {
	long := strings.Repeat("a", MaxEmailLength-len("@example.com")) + "@example.com"
	cases := []struct {
		name, in, want string // want "": refused
	}{
		{"lower-cased and trimmed", "  Ann@Example.COM ", "ann@example.com"},
		{"at the limit", long, long},
		{"past the limit", "a" + long, ""},
		// 252 bytes as given, 372 once lower-cased (U+023A is 2 bytes, U+2C65 3)
		{"past the limit once lower-cased", strings.Repeat("Ⱥ", 120) + "@example.com", ""},
		{"display name", "Ann <ann@example.com>", ""},
		{"no dot in the domain", "ann@localhost", ""},
		{"a line break", "ann@example.com\r\nBcc: x@example.com", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := NormalizeEmail(c.in)
			if c.want == "" {
				if err == nil {
					t.Fatalf("NormalizeEmail(%q) = %q (%d bytes), want a refusal", c.in, got, len(got))
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("NormalizeEmail(%q) = %q, %v; want %q", c.in, got, err, c.want)
			}
		})
	}
}
