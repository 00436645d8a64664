package commands

import (
	"context"
	"time"

	"chessd/domain"
	"chessd/eventstore"
)

// SignupResult is what POST /signup answers: the secret appears here and nowhere else.
type SignupResult struct {
	AccountID string
	KeyID     string
	Secret    string
	Plan      domain.Plan
}

// Signup creates an account with its first key (all scopes, live) and queues the
// verification mail, all in one transaction. An address can hold one account.
func (h *Handler) Signup(ctx context.Context, s domain.Signup, requestID string) (SignupResult, error) {
	accountID, keyID := NewID("acct"), NewID("key")
	secret, prefix := newSecret(domain.EnvLive)
	now := h.now()
	created, err := domain.NewAccount(accountID, s, now)
	if err != nil {
		return SignupResult{}, err
	}
	key, err := domain.NewKey(keyID, accountID, domain.KeySettings{Label: "signup", Scopes: domain.AllScopes, Env: domain.EnvLive},
		nil, prefix, domain.HashSecret(h.pepper, secret), now)
	if err != nil {
		return SignupResult{}, err
	}
	md := eventstore.Metadata{RequestID: requestID, AccountID: accountID, KeyID: keyID}
	emailStream := domain.EmailStream(domain.EmailHash(created.Email))
	_, err = h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		// A concurrent signup with the same address makes the append below conflict;
		// the retry then finds the claim here.
		if v, err := eventstore.StreamVersion(ctx, tx, emailStream); err != nil {
			return err
		} else if v > 0 {
			return domain.Errorf(domain.CodeConflict, "an account with this e-mail address already exists")
		}
		if err := tx.Append(ctx, emailStream, domain.StreamEmail, 0, md, event(&domain.EmailClaimed{AccountID: accountID})); err != nil {
			return err
		}
		if err := tx.Append(ctx, domain.AccountStream(accountID), domain.StreamAccount, 0, md, event(created)); err != nil {
			return err
		}
		if err := tx.Append(ctx, domain.KeyStream(keyID), domain.StreamKey, 0, md, event(key)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO mail_outbox (account_id, to_email, subject, body) VALUES ($1, $2, $3, $4)`,
			accountID, created.Email, "Verify your e-mail address",
			"Welcome to chessd. Your account "+accountID+" is on the free plan; verify this address to unlock billing.")
		return err
	})
	if err != nil {
		return SignupResult{}, err
	}
	return SignupResult{AccountID: accountID, KeyID: keyID, Secret: secret, Plan: domain.PlanFree}, nil
}

// CreateKey issues a new key on the actor's account. The secret is returned once.
func (h *Handler) CreateKey(ctx context.Context, actor Actor, s domain.KeySettings) (*domain.Key, string, error) {
	keyID := NewID("key")
	secret, prefix := newSecret(s.Env)
	created, err := domain.NewKey(keyID, actor.Key.AccountID(), s, actor.Key, prefix, domain.HashSecret(h.pepper, secret), h.now())
	if err != nil {
		return nil, "", err
	}
	_, err = h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		return tx.Append(ctx, domain.KeyStream(keyID), domain.StreamKey, 0, actor.meta(), event(created))
	})
	if err != nil {
		return nil, "", err
	}
	return domain.RehydrateKey([]domain.Event{created}), secret, nil
}

// UpdateKey changes label, scopes or budgets of one of the actor's keys.
func (h *Handler) UpdateKey(ctx context.Context, actor Actor, keyID string, c domain.KeyChange) (*domain.Key, error) {
	return h.onKey(ctx, actor, keyID, func(k *domain.Key) (domain.Event, error) {
		return k.Update(c, actor.Key, h.now())
	})
}

// RotateKey gives a key a new secret; the old one keeps working for grace.
func (h *Handler) RotateKey(ctx context.Context, actor Actor, keyID string, grace time.Duration) (*domain.Key, string, error) {
	var secret string
	k, err := h.onKey(ctx, actor, keyID, func(k *domain.Key) (domain.Event, error) {
		var prefix string
		secret, prefix = newSecret(k.Env())
		return k.Rotate(actor.Key, prefix, domain.HashSecret(h.pepper, secret), grace, h.now())
	})
	return k, secret, err
}

// RevokeKey ends a key for good.
func (h *Handler) RevokeKey(ctx context.Context, actor Actor, keyID string) (*domain.Key, error) {
	return h.onKey(ctx, actor, keyID, func(k *domain.Key) (domain.Event, error) {
		if k.Status() == domain.StatusRevoked {
			return nil, nil // DELETE is idempotent: revoked once, nothing more to record
		}
		return k.Revoke(actor.Key, h.now())
	})
}

// onKey loads one of the actor's keys, decides, and appends at the version it loaded.
// Another account's key is reported exactly like a missing one.
func (h *Handler) onKey(ctx context.Context, actor Actor, keyID string, decide func(*domain.Key) (domain.Event, error)) (*domain.Key, error) {
	var out *domain.Key
	_, err := h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		k, err := LoadKey(ctx, tx, keyID)
		if err != nil {
			return err
		}
		if !k.BelongsTo(actor.Key.AccountID()) {
			return domain.Errorf(domain.CodeNotFound, "no key %q on this account", keyID)
		}
		e, err := decide(k)
		if err != nil {
			return err
		}
		out = k
		if e == nil {
			return nil
		}
		if err := tx.Append(ctx, domain.KeyStream(keyID), domain.StreamKey, k.Version(), actor.meta(), event(e)); err != nil {
			return err
		}
		k.Apply(e)
		return nil
	})
	return out, err
}

func event(e domain.Event) eventstore.New {
	return eventstore.New{Type: e.EventType(), SchemaVersion: 1, Payload: e}
}
