package webhook

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"chessd/domain"
)

// Secrets seals endpoints' signing secrets for the database: AES-256-GCM under a key
// derived from the service's key pepper (CHESSD_KEY_PEPPER), which every server shares
// and the database never holds, so that a copy of the database cannot sign deliveries.
// A sealed secret is bound to its endpoint's id: moved to another row, it does not open.
type Secrets struct{ aead cipher.AEAD }

// sealedPrefix marks a sealed secret; a secret without it was stored before secrets
// were sealed (migration 0021's rows) and is used as it is.
const sealedPrefix = "sealed1:"

// ErrSecretSealed says a stored secret does not open under this server's pepper.
var ErrSecretSealed = errors.New("webhook: the endpoint's secret does not open with this server's key pepper")

// NewSecrets derives the sealing key from pepper.
func NewSecrets(pepper []byte) (*Secrets, error) {
	if len(pepper) == 0 {
		return nil, errors.New("webhook: no key pepper to seal secrets with")
	}
	// the key is the label's HMAC under the pepper, as a key's secret is stored
	block, err := aes.NewCipher(domain.HashSecret(pepper, "chessd webhook secrets v1"))
	if err != nil {
		return nil, fmt.Errorf("webhook secrets: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("webhook secrets: %w", err)
	}
	return &Secrets{aead: aead}, nil
}

func (s *Secrets) seal(secret, endpointID string) string {
	nonce := make([]byte, s.aead.NonceSize())
	rand.Read(nonce) //nolint:errcheck // crypto/rand does not fail
	return sealedPrefix + base64.RawStdEncoding.EncodeToString(s.aead.Seal(nonce, nonce, []byte(secret), []byte(endpointID)))
}

func (s *Secrets) open(stored, endpointID string) (string, error) {
	b64, sealed := strings.CutPrefix(stored, sealedPrefix)
	if !sealed {
		return stored, nil
	}
	if s == nil {
		return "", ErrSecretSealed
	}
	raw, err := base64.RawStdEncoding.DecodeString(b64)
	n := s.aead.NonceSize()
	if err != nil || len(raw) < n {
		return "", ErrSecretSealed
	}
	plain, err := s.aead.Open(nil, raw[:n], raw[n:], []byte(endpointID))
	if err != nil {
		return "", ErrSecretSealed
	}
	return string(plain), nil
}
