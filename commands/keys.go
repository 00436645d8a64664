package commands

import (
	"context"
	"time"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/ledger"
	"chessd/postgres"
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
	key, _, err := domain.NewKey(keyID, accountID, domain.KeySettings{Label: "signup", Scopes: domain.AllScopes, Env: domain.EnvLive},
		nil, domain.Headroom{}, prefix, domain.HashSecret(h.pepper, secret), now)
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
		if err := ledger.OpenKeyBalance(ctx, tx, key); err != nil {
			return err
		}
		return h.queueVerification(ctx, tx, domain.RehydrateAccount([]domain.Event{created}), now)
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
	var created *domain.KeyCreated
	_, err := h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		// The account's keys lock first, then the acting key: a recovery revoking every
		// key holds the lock, and the acting key read after it is revoked, not made anew
		// beside the keys the recovery revoked.
		if err := lockKeys(ctx, tx, actor.Key.AccountID()); err != nil {
			return err
		}
		by, left, err := acting(ctx, tx, actor)
		if err != nil {
			return err
		}
		var handed domain.Handover
		created, handed, err = domain.NewKey(keyID, by.AccountID(), s, by, left, prefix, domain.HashSecret(h.pepper, secret), h.now())
		if err != nil {
			return err
		}
		if err := keyRoom(ctx, tx, created); err != nil {
			return err
		}
		if err := tx.Append(ctx, domain.KeyStream(keyID), domain.StreamKey, 0, actor.meta(), event(created)); err != nil {
			return err
		}
		if err := ledger.OpenKeyBalance(ctx, tx, created); err != nil {
			return err
		}
		handOut, err := h.appendHandOut(ctx, tx, actor, by, handed)
		if err != nil {
			return err
		}
		return handOut()
	})
	if err != nil {
		return nil, "", err
	}
	return domain.RehydrateKey([]domain.Event{created}), secret, nil
}

// keyRoom refuses a key past domain.MaxActiveKeys in its account's env. The creations of
// one account take turns here (a transaction lock), so two cannot both take the last
// place; the count is exact, since a balance opens and closes with its key.
func keyRoom(ctx context.Context, tx *eventstore.Tx, k *domain.KeyCreated) error {
	if err := lockKeys(ctx, tx, k.AccountID); err != nil {
		return err
	}
	n, err := ledger.OpenKeyBalances(ctx, tx, k.AccountID, k.Env)
	if err != nil {
		return err
	}
	if n >= domain.MaxActiveKeys {
		return domain.Errorf(domain.CodeConflict, "this account already has %d active %s keys, the most it may hold: revoke one (DELETE /v1/keys/{id}) before creating another", n, k.Env)
	}
	return nil
}

// lockKeys makes the creations of an account's keys take turns until the transaction
// ends.
func lockKeys(ctx context.Context, tx *eventstore.Tx, accountID string) error {
	return postgres.LockXact(ctx, tx, "keys-of-"+accountID, false)
}

// UpdateKey changes label, scopes or budgets of one of the actor's keys.
func (h *Handler) UpdateKey(ctx context.Context, actor Actor, keyID string, c domain.KeyChange) (*domain.Key, error) {
	return h.onKey(ctx, actor, keyID, func(k, by *domain.Key, left domain.Headroom) (domain.Event, domain.Handover, error) {
		return k.Update(c, by, left, h.now())
	})
}

// RotateKey gives a key a new secret; the old one keeps working for grace.
func (h *Handler) RotateKey(ctx context.Context, actor Actor, keyID string, grace time.Duration) (*domain.Key, string, error) {
	var secret string
	k, err := h.onKey(ctx, actor, keyID, func(k, by *domain.Key, left domain.Headroom) (domain.Event, domain.Handover, error) {
		var prefix string
		secret, prefix = newSecret(k.Env())
		e, err := k.Rotate(by, left, prefix, domain.HashSecret(h.pepper, secret), grace, h.now())
		return e, domain.Handover{}, err
	})
	if err != nil {
		return nil, "", err
	}
	return k, secret, nil
}

// RevokeKey ends a key for good. DELETE is idempotent: a revoked key records nothing more.
func (h *Handler) RevokeKey(ctx context.Context, actor Actor, keyID string) (*domain.Key, error) {
	return h.onKey(ctx, actor, keyID, func(k, by *domain.Key, _ domain.Headroom) (domain.Event, domain.Handover, error) {
		e, err := k.Revoke(by, h.now())
		if e == nil {
			return nil, domain.Handover{}, err // a nil *KeyRevoked is not a nil Event
		}
		return e, domain.Handover{}, err
	})
}

// acting loads the acting key as it stands in this transaction (a PATCH or revocation
// of it a moment ago counts) and what it has left to hand over.
func acting(ctx context.Context, tx *eventstore.Tx, actor Actor) (*domain.Key, domain.Headroom, error) {
	by, err := LoadKey(ctx, tx, actor.Key.ID())
	if err != nil {
		return nil, domain.Headroom{}, err
	}
	if by.Status() != domain.StatusActive {
		return nil, domain.Headroom{}, domain.Errorf(domain.CodeBadCredential, "this API key is revoked")
	}
	left, err := ledger.KeyHeadroom(ctx, tx, by.ID())
	return by, left, err
}

// onKey loads one of the actor's keys, decides, and appends at the version it loaded,
// then takes what the decision hands over out of the acting key's budget. decide gets
// the target, the acting key and what the acting key has left to hand over. A key the
// actor may not see (another account's; a live key for a test key) is reported exactly
// like a missing one.
func (h *Handler) onKey(ctx context.Context, actor Actor, keyID string, decide func(k, by *domain.Key, left domain.Headroom) (domain.Event, domain.Handover, error)) (*domain.Key, error) {
	var out *domain.Key
	_, err := h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		// the account's key changes take turns, as creations do: what one hands over
		// is read and taken in one go
		if err := lockKeys(ctx, tx, actor.Key.AccountID()); err != nil {
			return err
		}
		by, left, err := acting(ctx, tx, actor)
		if err != nil {
			return err
		}
		k, err := LoadKey(ctx, tx, keyID)
		if err != nil {
			return err
		}
		if !by.Sees(k) {
			return domain.Errorf(domain.CodeNotFound, "no key %q on this account", keyID)
		}
		e, handed, err := decide(k, by, left)
		if err != nil {
			return err
		}
		out = k
		if e == nil {
			if revokedAt := k.RevokedAt(); revokedAt != nil {
				// A DELETE again: the balance closes if the revocation left it open (an
				// older chessd revoked the key during a rolling upgrade).
				return ledger.CloseKeyBalance(ctx, tx, keyID, *revokedAt)
			}
			return nil
		}
		if err := tx.Append(ctx, domain.KeyStream(keyID), domain.StreamKey, k.Version(), actor.meta(), event(e)); err != nil {
			return err
		}
		k.Apply(e)
		handOut, err := h.appendHandOut(ctx, tx, actor, by, handed)
		if err != nil {
			return err
		}
		// The budget the charge path checks, and whether the key's balance is open, move
		// with the key, in this transaction: the key streams first, then the balances
		// in key_id order, as the jobs' and the settles' paths take them.
		switch e := e.(type) {
		case *domain.KeyUpdated:
			if handed.To != "" {
				if err := ledger.LockBalances(ctx, tx, k.ID(), by.ID()); err != nil {
					return err
				}
			}
			if err := ledger.SetKeyBudget(ctx, tx, k); err != nil {
				return err
			}
		case *domain.KeyRevoked:
			return ledger.CloseKeyBalance(ctx, tx, keyID, e.RevokedAt)
		}
		return handOut()
	})
	return out, err
}

// appendHandOut appends the acting key's event taking what it handed over out of its
// budget (by as loaded in this transaction: its stream's version guards it), and
// returns what moves the budget the charge path checks, to call once the transaction's
// key streams are all written: it checks under the balance's lock that the handover
// still fits in what by has left (a lease taken since the decision may have shrunk it).
func (h *Handler) appendHandOut(ctx context.Context, tx *eventstore.Tx, actor Actor, by *domain.Key, handed domain.Handover) (func() error, error) {
	e := by.HandOut(handed, h.now())
	if e == nil {
		return func() error { return nil }, nil
	}
	if err := tx.Append(ctx, domain.KeyStream(by.ID()), domain.StreamKey, by.Version(), actor.meta(), event(e)); err != nil {
		return nil, err
	}
	return func() error {
		if err := ledger.LockBalances(ctx, tx, by.ID()); err != nil {
			return err
		}
		left, err := ledger.KeyHeadroom(ctx, tx, by.ID())
		if err != nil {
			return err
		}
		if err := handed.Within(left); err != nil {
			return err
		}
		by.Apply(e)
		return ledger.SetKeyBudget(ctx, tx, by)
	}, nil
}

// AccountChange is a PATCH of the account's settings: nil fields stay as they are.
type AccountChange struct {
	// Timezone: the IANA zone whose midnights start budgets by period, from their next
	// period on (the current one keeps its end, so a change of zone never starts a
	// budget over early).
	Timezone *string
	// Budget: what all the account's keys of the actor's env may spend together.
	Budget *domain.BudgetChange
}

// UpdateAccount applies c in one transaction, all or nothing. The zone and the budget
// the money path checks move with their events.
func (h *Handler) UpdateAccount(ctx context.Context, actor Actor, c AccountChange) (*domain.Account, error) {
	if c.Timezone != nil {
		if err := domain.ValidateTimezone(*c.Timezone); err != nil {
			return nil, err
		}
	}
	var out *domain.Account
	_, err := h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		by, _, err := acting(ctx, tx, actor)
		if err != nil {
			return err
		}
		a, err := LoadAccount(ctx, tx, by.AccountID())
		if err != nil {
			return err
		}
		out = a
		appendEvent := func(e domain.Event) error {
			if err := tx.Append(ctx, domain.AccountStream(a.ID()), domain.StreamAccount, a.Version(), actor.meta(), event(e)); err != nil {
				return err
			}
			a.Apply(e)
			return nil
		}
		if c.Timezone != nil {
			if err := h.setTimezone(ctx, tx, a, *c.Timezone, by, appendEvent); err != nil {
				return err
			}
		}
		if c.Budget == nil {
			return nil
		}
		e, err := a.SetBudget(by.Env(), *c.Budget, by, h.now())
		if err != nil {
			return err
		}
		if err := appendEvent(e); err != nil {
			return err
		}
		return ledger.SetAccountBudget(ctx, tx, a.ID(), e)
	})
	return out, err
}

// setTimezone moves account a to zone tz inside tx (nothing when it is there already).
func (h *Handler) setTimezone(ctx context.Context, tx *eventstore.Tx, a *domain.Account, tz string, by *domain.Key, appendEvent func(domain.Event) error) error {
	// the database computes the periods: it must know the zone too
	known, err := ledger.ZoneKnown(ctx, tx, tz)
	if err != nil {
		return err
	}
	if !known {
		return domain.Invalid("timezone", "is not a time zone this service's database knows")
	}
	e, err := a.SetTimezone(tz, by, h.now())
	if err != nil || e == nil {
		return err
	}
	if err := appendEvent(e); err != nil {
		return err
	}
	return ledger.SetAccountZone(ctx, tx, a.ID(), tz)
}

// ChangePlan moves an account to another plan: an operator's command while paid
// subscriptions are not enabled (`chessd plan`).
func (h *Handler) ChangePlan(ctx context.Context, accountID string, plan domain.Plan, reason string) error {
	_, err := h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		a, err := LoadAccount(ctx, tx, accountID)
		if err != nil {
			return err
		}
		e, err := a.ChangePlan(plan, reason)
		if err != nil {
			return err
		}
		return tx.Append(ctx, domain.AccountStream(accountID), domain.StreamAccount, a.Version(),
			eventstore.Metadata{AccountID: accountID}, event(e))
	})
	return err
}

func event(e domain.Event) eventstore.New {
	return eventstore.New{Type: e.EventType(), SchemaVersion: 1, Payload: e}
}
