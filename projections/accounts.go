package projections

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"chessd/domain"
	"chessd/eventstore"
)

// Accounts maintains the accounts, api_keys and key_secrets read models.
type Accounts struct{}

func (Accounts) Name() string     { return "accounts_v1" }
func (Accounts) Topic() string    { return "accounts" }
func (Accounts) Tables() []string { return []string{"accounts", "api_keys", "key_secrets"} }

func (a Accounts) Apply(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	switch e.StreamType {
	case domain.StreamAccount:
		return a.applyAccount(ctx, tx, e)
	case domain.StreamKey:
		keyID := strings.TrimPrefix(e.StreamID, "key-")
		var current int64
		err := tx.QueryRow(ctx, `SELECT version FROM api_keys WHERE key_id = $1 FOR UPDATE`, keyID).Scan(&current)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		return applyInStreamOrder(ctx, tx, e, current, func(e eventstore.Event) error { return applyKey(ctx, tx, keyID, e) })
	}
	return nil // e-mail claims have no read model
}

func (Accounts) applyAccount(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	accountID := strings.TrimPrefix(e.StreamID, "account-")
	var current int64
	err := tx.QueryRow(ctx, `SELECT version FROM accounts WHERE account_id = $1 FOR UPDATE`, accountID).Scan(&current)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	return applyInStreamOrder(ctx, tx, e, current, func(e eventstore.Event) error {
		ev, err := domain.Decode(e.Type, e.SchemaVersion, e.Payload)
		if err != nil {
			return err
		}
		switch ev := ev.(type) {
		case *domain.AccountCreated:
			_, err = tx.Exec(ctx, `INSERT INTO accounts (account_id, email, name, agent, source, plan, email_verified, created_at, version)
				VALUES ($1, $2, $3, $4, $5, $6, false, $7, $8)`,
				ev.AccountID, ev.Email, ev.Name, ev.Agent, ev.Source, ev.Plan, ev.CreatedAt, e.Version)
		case *domain.PlanChanged:
			_, err = tx.Exec(ctx, `UPDATE accounts SET plan = $2, version = $3 WHERE account_id = $1`, accountID, ev.Plan, e.Version)
		case *domain.EmailVerified:
			_, err = tx.Exec(ctx, `UPDATE accounts SET email_verified = true, version = $2 WHERE account_id = $1`, accountID, e.Version)
		default:
			_, err = tx.Exec(ctx, `UPDATE accounts SET version = $2 WHERE account_id = $1`, accountID, e.Version)
		}
		return err
	})
}

func applyKey(ctx context.Context, tx pgx.Tx, keyID string, e eventstore.Event) error {
	ev, err := domain.Decode(e.Type, e.SchemaVersion, e.Payload)
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	switch ev := ev.(type) {
	case *domain.KeyCreated:
		b.Queue(`INSERT INTO api_keys (key_id, account_id, label, scopes, env, budget_units, budget_usd, status, prefix, created_at, version)
			VALUES ($1, $2, $3, $4, $5, $6, $7, 'active', $8, $9, $10)`,
			keyID, ev.AccountID, ev.Label, scopeStrings(ev.Scopes), ev.Env, ev.BudgetUnits, ev.BudgetUSD, ev.Prefix, ev.CreatedAt, e.Version)
		b.Queue(`INSERT INTO key_secrets (secret_hash, key_id) VALUES ($1, $2)`, unhex(ev.SecretHash), keyID)
	case *domain.KeyUpdated:
		b.Queue(`UPDATE api_keys SET label = $2, scopes = $3, budget_units = $4, budget_usd = $5, version = $6 WHERE key_id = $1`,
			keyID, ev.Label, scopeStrings(ev.Scopes), ev.BudgetUnits, ev.BudgetUSD, e.Version)
	case *domain.KeyRotated:
		b.Queue(`UPDATE key_secrets SET expires_at = $2 WHERE key_id = $1 AND expires_at IS NULL`, keyID, ev.OldExpires)
		b.Queue(`DELETE FROM key_secrets WHERE key_id = $1 AND expires_at <= $2`, keyID, ev.RotatedAt)
		b.Queue(`INSERT INTO key_secrets (secret_hash, key_id) VALUES ($1, $2)`, unhex(ev.SecretHash), keyID)
		b.Queue(`UPDATE api_keys SET prefix = $2, rotated_at = $3, version = $4 WHERE key_id = $1`, keyID, ev.Prefix, ev.RotatedAt, e.Version)
	case *domain.KeyRevoked:
		b.Queue(`UPDATE api_keys SET status = 'revoked', revoked_at = $2, version = $3 WHERE key_id = $1`, keyID, ev.RevokedAt, e.Version)
	default:
		return fmt.Errorf("key stream: unexpected event %s", e.Type)
	}
	return tx.SendBatch(ctx, b).Close()
}

func scopeStrings(s []domain.Scope) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = string(v)
	}
	return out
}

func unhex(s string) []byte {
	b, _ := hex.DecodeString(s)
	return b
}
