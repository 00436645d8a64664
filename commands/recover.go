package commands

import (
	"context"
	"fmt"
	"strings"
	"time"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/ledger"
)

// recoveryTTL is how long a key-recovery token can be used: an hour, since it opens the
// account.
const recoveryTTL = time.Hour

// RequestRecovery queues a key-recovery message to the account that holds the address,
// if one does; for an address no account holds it does nothing and says nothing (the
// caller answers alike). The message shares the verification mail's limits (MailsFull).
func (h *Handler) RequestRecovery(ctx context.Context, email string) error {
	normalized, err := domain.NormalizeEmail(email)
	if err != nil {
		return err
	}
	_, err = h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		evs, err := loadStream(ctx, tx, domain.EmailStream(domain.EmailHash(normalized)))
		if err != nil || len(evs) == 0 {
			return err
		}
		claim, ok := evs[0].(*domain.EmailClaimed)
		if !ok {
			return fmt.Errorf("the address's stream opens with %s", evs[0].EventType())
		}
		a, err := LoadAccount(ctx, tx, claim.AccountID)
		if err != nil {
			return err
		}
		now := h.now()
		if err := mailRoom(ctx, tx, a, now); err != nil {
			return err
		}
		token, err := h.newToken(ctx, tx, "recover", "rk_", a, now, recoveryTTL)
		if err != nil {
			return err
		}
		site := strings.TrimSuffix(h.APIURL, "/v1")
		body := fmt.Sprintf("Someone, you we hope, asked for a new API key for chessd account %s.\r\n\r\n"+
			"This token, valid for one hour and once, issues one (every scope, live):\r\n\r\n"+
			"    %s\r\n\r\n"+
			"Paste it on the console's Account page, %s/account (no key needed), or send it:\r\n\r\n"+
			"curl -X POST %s/recover/confirm -d '{\"token\":\"%s\"}'\r\n\r\n"+
			"The account's other keys keep working, unless you ask for them to be revoked with it\r\n"+
			"(\"revoke_other_keys\": true, or the console's box): do if someone else may hold one.\r\n"+
			"If you did not ask, ignore this message: nothing changes without the token.\r\n", a.ID(), token, site, h.APIURL, token)
		return h.queueMail(ctx, tx, a, "A new API key for your chessd account", body)
	})
	return err
}

// Recovered is what POST /recover/confirm answers: the new key, shown once, and the
// keys it revoked.
type Recovered struct {
	SignupResult
	Revoked []string
}

// RecoverKey issues a new key (every scope, live, labelled "recovered") on the account a
// recovery token was sent to, and verifies its address: the token shows the caller
// reads its mail. The token must be unused, unexpired and for the account's current
// address. With revokeOthers every other key of the account, in every env, is revoked
// in the same transaction: an account someone else opened with the address is then
// the mail reader's alone (the other keys could revoke the new one), and takeover, when
// set, runs in it too (what else of the account a layer above ends: its webhook
// endpoints). The secret is returned once, as at signup.
func (h *Handler) RecoverKey(ctx context.Context, token string, revokeOthers bool, takeover func(context.Context, eventstore.Querier, string) error, requestID string) (Recovered, error) {
	invalid := domain.Invalid("token", "is not a valid recovery token, or it expired or was used: ask for a new one (POST /v1/recover)")
	keyID := NewID("key")
	secret, prefix := newSecret(domain.EnvLive)
	var res Recovered
	_, err := h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		a, err := h.useToken(ctx, tx, "recover", token, invalid)
		if err != nil {
			return err
		}
		now := h.now()
		md := eventstore.Metadata{RequestID: requestID, AccountID: a.ID(), KeyID: keyID}
		if err := lockKeys(ctx, tx, a.ID()); err != nil {
			return err
		}
		if revokeOthers {
			if res.Revoked, err = revokeAll(ctx, tx, a.ID(), md, now); err != nil {
				return err
			}
			if takeover != nil {
				if err := takeover(ctx, tx, a.ID()); err != nil {
					return err
				}
			}
		} else if n, err := ledger.OpenKeyBalances(ctx, tx, a.ID(), domain.EnvLive.String()); err != nil {
			return err
		} else if n >= domain.MaxActiveKeys {
			// the caller has no key to revoke one with: the token stays unused
			return domain.Errorf(domain.CodeConflict, "this account already has %d active live keys, the most it may hold: send the token again with \"revoke_other_keys\": true", n)
		}
		key, _, err := domain.NewKey(keyID, a.ID(), domain.KeySettings{Label: "recovered", Scopes: domain.AllScopes, Env: domain.EnvLive},
			nil, domain.Headroom{}, prefix, domain.HashSecret(h.pepper, secret), now)
		if err != nil {
			return err
		}
		if err := tx.Append(ctx, domain.KeyStream(keyID), domain.StreamKey, 0, md, event(key)); err != nil {
			return err
		}
		if err := ledger.OpenKeyBalance(ctx, tx, key); err != nil {
			return err
		}
		if err := verifyAddress(ctx, tx, a, md, now); err != nil {
			return err
		}
		res.SignupResult = SignupResult{AccountID: a.ID(), KeyID: keyID, Secret: secret, Plan: a.Plan()}
		return nil
	})
	return res, err
}

// revokeAll revokes every active key of the account, in every env, and answers their ids.
// The caller holds the account's keys lock (lockKeys): no key is made meanwhile (a
// creation takes the lock before it reads its acting key).
func revokeAll(ctx context.Context, tx *eventstore.Tx, accountID string, md eventstore.Metadata, now time.Time) ([]string, error) {
	ids, err := ledger.OpenKeyIDs(ctx, tx, accountID)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		k, err := LoadKey(ctx, tx, id)
		if err != nil {
			return nil, err
		}
		e := &domain.KeyRevoked{RevokedAt: now}
		if err := tx.Append(ctx, domain.KeyStream(id), domain.StreamKey, k.Version(), md, event(e)); err != nil {
			return nil, err
		}
		if err := ledger.CloseKeyBalance(ctx, tx, id, now); err != nil {
			return nil, err
		}
	}
	return ids, nil
}
