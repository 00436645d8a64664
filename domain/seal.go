package domain

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
)

// Sealer seals what the database must keep but not be able to use, such as a message
// carrying a one-use token: AES-256-GCM under a key derived from the service's key
// pepper (CHESSD_KEY_PEPPER), which every server shares and the database never holds.
// A sealed value is bound to what it belongs to (its row's id, its recipient): moved
// elsewhere, it does not open.
type Sealer struct{ aead cipher.AEAD }

// sealedPrefix marks a sealed value (webhook secrets use the same form).
const sealedPrefix = "sealed1:"

// ErrNotOpened says a stored value is not sealed, or does not open under this pepper
// for what it is bound to.
var ErrNotOpened = errors.New("the sealed value does not open with this server's key pepper")

// NewSealer derives a sealing key from pepper for one purpose (a fixed label): each
// purpose has its own key.
func NewSealer(pepper []byte, purpose string) (*Sealer, error) {
	if len(pepper) == 0 {
		return nil, errors.New("no key pepper to seal with")
	}
	// the key is the label's HMAC under the pepper, as a key's secret is stored; 32
	// bytes, so that neither constructor can fail
	block, err := aes.NewCipher(HashSecret(pepper, purpose))
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Sealer{aead: aead}, nil
}

// Seal seals plain, bound to boundTo.
func (s *Sealer) Seal(plain, boundTo string) string {
	nonce := make([]byte, s.aead.NonceSize())
	rand.Read(nonce) //nolint:errcheck // crypto/rand does not fail
	return sealedPrefix + base64.RawStdEncoding.EncodeToString(s.aead.Seal(nonce, nonce, []byte(plain), []byte(boundTo)))
}

// Open opens what Seal sealed with the same boundTo; ErrNotOpened otherwise.
func (s *Sealer) Open(stored, boundTo string) (string, error) {
	b64, ok := strings.CutPrefix(stored, sealedPrefix)
	if !ok || s == nil {
		return "", ErrNotOpened
	}
	raw, err := base64.RawStdEncoding.DecodeString(b64)
	n := s.aead.NonceSize()
	if err != nil || len(raw) < n {
		return "", ErrNotOpened
	}
	plain, err := s.aead.Open(nil, raw[:n], raw[n:], []byte(boundTo))
	if err != nil {
		return "", ErrNotOpened
	}
	return string(plain), nil
}

// IsSealed says whether stored is in sealed form (whether or not it opens).
func IsSealed(stored string) bool { return strings.HasPrefix(stored, sealedPrefix) }
