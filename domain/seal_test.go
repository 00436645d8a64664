package domain

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

// A sealed value opens for what it is bound to, under the pepper and purpose that
// sealed it, and under nothing else.
func TestSealer(t *testing.T) {
	newSealer := func(pepper, purpose string) *Sealer {
		s, err := NewSealer([]byte(pepper), purpose)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := newSealer("pepper-one-0123456789", "purpose one")
	sealed := s.Seal("ev_secret", "to@example.com")
	if !IsSealed(sealed) || strings.Contains(sealed, "secret") || sealed == s.Seal("ev_secret", "to@example.com") {
		t.Fatalf("sealed %q: want the sealed form, no plaintext, a fresh nonce each time", sealed)
	}
	raw, err := base64.RawStdEncoding.DecodeString(strings.TrimPrefix(sealed, sealedPrefix))
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)-1] ^= 1
	edited := sealedPrefix + base64.RawStdEncoding.EncodeToString(raw)
	for _, tc := range []struct {
		name    string
		sealer  *Sealer
		stored  string
		boundTo string
		want    string
		err     error
	}{
		{"what it is bound to", s, sealed, "to@example.com", "ev_secret", nil},
		{"bound to another", s, sealed, "thief@example.com", "", ErrNotOpened},
		{"another pepper", newSealer("pepper-two-0123456789", "purpose one"), sealed, "to@example.com", "", ErrNotOpened},
		{"another purpose", newSealer("pepper-one-0123456789", "purpose two"), sealed, "to@example.com", "", ErrNotOpened},
		{"no sealer", nil, sealed, "to@example.com", "", ErrNotOpened},
		{"edited", s, edited, "to@example.com", "", ErrNotOpened},
		{"not base64", s, sealedPrefix + "!!", "to@example.com", "", ErrNotOpened},
		{"not sealed", s, "ev_secret", "to@example.com", "", ErrNotOpened},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.sealer.Open(tc.stored, tc.boundTo)
			if got != tc.want || !errors.Is(err, tc.err) {
				t.Fatalf("open: %q, %v; want %q, %v", got, err, tc.want, tc.err)
			}
		})
	}
	if _, err := NewSealer(nil, "purpose one"); err == nil {
		t.Fatal("a sealer without a pepper")
	}
}
