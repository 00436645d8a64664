// Package commands holds the write side: each command loads the aggregates it touches
// from their events, asks the domain for new events, and appends them in one
// transaction. Nothing here writes a read model.
package commands

import (
	"context"
	"crypto/rand"
	"fmt"
	"math/big"
	"time"

	"chessd/domain"
	"chessd/eventstore"
)

// Handler runs the synchronous commands of the API.
type Handler struct {
	store  *eventstore.Store
	pepper []byte
	now    func() time.Time
	// APIURL is the API's public base (…/v1), named in the mail a signup sends.
	APIURL string
	jobs   *jobCache
}

// New builds a Handler. pepper keys the HMAC under which secrets are stored.
func New(store *eventstore.Store, pepper []byte) *Handler {
	return &Handler{store: store, pepper: pepper, now: func() time.Time { return time.Now().UTC().Truncate(time.Microsecond) },
		APIURL: "http://localhost:8080/v1", jobs: &jobCache{jobs: map[string]*domain.Job{}}}
}

// Actor is who issues a command: the authenticated key and request facts.
type Actor struct {
	Key       *domain.Key
	RequestID string
}

func (a Actor) meta() eventstore.Metadata {
	m := eventstore.Metadata{RequestID: a.RequestID}
	if a.Key != nil {
		m.AccountID, m.KeyID = a.Key.AccountID(), a.Key.ID()
	}
	return m
}

// LoadKey folds a key's stream. A key that does not exist has Exists() false.
func LoadKey(ctx context.Context, q eventstore.Querier, keyID string) (*domain.Key, error) {
	evs, err := loadStream(ctx, q, domain.KeyStream(keyID))
	if err != nil {
		return nil, err
	}
	return domain.RehydrateKey(evs), nil
}

// LoadAccount folds an account's stream.
func LoadAccount(ctx context.Context, q eventstore.Querier, accountID string) (*domain.Account, error) {
	evs, err := loadStream(ctx, q, domain.AccountStream(accountID))
	if err != nil {
		return nil, err
	}
	return domain.RehydrateAccount(evs), nil
}

func loadStream(ctx context.Context, q eventstore.Querier, stream string) ([]domain.Event, error) {
	return loadStreamAfter(ctx, q, stream, 0)
}

// loadStreamAfter is loadStream of the events after version.
func loadStreamAfter(ctx context.Context, q eventstore.Querier, stream string, version int64) ([]domain.Event, error) {
	stored, err := eventstore.LoadAfter(ctx, q, stream, version)
	if err != nil {
		return nil, err
	}
	out := make([]domain.Event, 0, len(stored))
	for _, s := range stored {
		e, err := domain.Decode(s.Type, s.SchemaVersion, s.Payload)
		if err != nil {
			return nil, fmt.Errorf("stream %s version %d: %w", stream, s.Version, err)
		}
		out = append(out, e)
	}
	return out, nil
}

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// randomBase62 encodes n random bytes in base62.
func randomBase62(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error()) // never happens on Linux
	}
	v := new(big.Int).SetBytes(b)
	out := make([]byte, 0, n*4/3+2)
	sixtyTwo := big.NewInt(62)
	mod := new(big.Int)
	for v.Sign() > 0 {
		v.DivMod(v, sixtyTwo, mod)
		out = append(out, base62[mod.Int64()])
	}
	for len(out) < n*4/3+1 { // fixed length, whatever the leading zeros
		out = append(out, '0')
	}
	return string(out)
}

// NewID makes a public id such as key_3kTMd... with 128 random bits.
func NewID(prefix string) string { return prefix + "_" + randomBase62(16) }

// newSecret makes a key secret: ce_live_ or ce_test_ and 32 random bytes in base62.
func newSecret(env domain.Env) (secret, prefix string) {
	secret = "ce_" + env.String() + "_" + randomBase62(32)
	return secret, secret[:12]
}
