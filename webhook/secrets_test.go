package webhook

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

// sealedPrefix is domain.Sealer's mark, which secrets sealed before it carry too.
const sealedPrefix = "sealed1:"

// A sealed secret opens for its endpoint under the pepper that sealed it, and under
// nothing else; a secret stored before sealing is used as it is.
func TestSecrets(t *testing.T) {
	s, err := NewSecrets([]byte("pepper-one-0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewSecrets([]byte("pepper-two-0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	sealed := s.seal("whsec_abc", "whe_1")
	if !strings.HasPrefix(sealed, sealedPrefix) || strings.Contains(sealed, "abc") || sealed == s.seal("whsec_abc", "whe_1") {
		t.Fatalf("sealed %q: want the prefix, no plaintext, a fresh nonce each time", sealed)
	}
	for _, tc := range []struct {
		name     string
		secrets  *Secrets
		stored   string
		endpoint string
		want     string
		err      error
	}{
		{"its endpoint", s, sealed, "whe_1", "whsec_abc", nil},
		{"another endpoint's row", s, sealed, "whe_2", "", ErrSecretSealed},
		{"another pepper", other, sealed, "whe_1", "", ErrSecretSealed},
		{"no secrets configured", nil, sealed, "whe_1", "", ErrSecretSealed},
		{"edited", s, flipLastByte(t, sealed), "whe_1", "", ErrSecretSealed},
		{"not base64", s, sealedPrefix + "!!", "whe_1", "", ErrSecretSealed},
		{"stored before sealing", s, "whsec_old", "whe_1", "whsec_old", nil},
		// sealed by webhook's own AES-GCM code, before secrets were sealed by domain.Sealer
		{"sealed before domain.Sealer", s, "sealed1:VT5n8mGtlbpGthyX5YcDDZ9VY9h2kELdbe+Im1gKzn+fhnKWkTYnnQ", "whe_golden", "whsec_golden", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.secrets.open(tc.stored, tc.endpoint)
			if got != tc.want || !errors.Is(err, tc.err) {
				t.Fatalf("open: %q, %v; want %q, %v", got, err, tc.want, tc.err)
			}
		})
	}
	if _, err := NewSecrets(nil); err == nil {
		t.Fatal("secrets without a pepper")
	}
}

// flipLastByte changes one bit of a sealed secret's tag: an edit that always changes
// the bytes (rewriting its last characters would not when they already say so).
func flipLastByte(t *testing.T, sealed string) string {
	t.Helper()
	raw, err := base64.RawStdEncoding.DecodeString(strings.TrimPrefix(sealed, sealedPrefix))
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)-1] ^= 1
	return sealedPrefix + base64.RawStdEncoding.EncodeToString(raw)
}
