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

func (Accounts) Apply(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	var query string
	switch e.StreamType {
	case domain.StreamAccount:
		query = `SELECT version FROM accounts WHERE account_id = $1 FOR UPDATE`
	case domain.StreamKey:
		query = `SELECT version FROM api_keys WHERE key_id = $1 FOR UPDATE`
	default:
		return nil // e-mail claims have no read model
	}
	var current int64
	err := tx.QueryRow(ctx, query, rowID(e)).Scan(&current)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	return applyInStreamOrder(ctx, tx, e, current, func(e eventstore.Event) error {
		b := &pgx.Batch{}
		if err := queueAccounts(b, e); err != nil {
			return err
		}
		return tx.SendBatch(ctx, b).Close()
	})
}

// rowID is the id of the account or key whose stream e belongs to.
func rowID(e eventstore.Event) string {
	if e.StreamType == domain.StreamKey {
		return strings.TrimPrefix(e.StreamID, "key-")
	}
	return strings.TrimPrefix(e.StreamID, "account-")
}

// A rebuild applies the events as they come, in position order: each stream's follow
// one another, so the writes need no read of the row's version first.
func (Accounts) rebuilder() rebuilder { return accountsRebuild{} }

type accountsRebuild struct{}

func (accountsRebuild) fold(_ context.Context, _ eventstore.Querier, e eventstore.Event, _ bool) (any, error) {
	return e, nil
}

func (accountsRebuild) queue(b *pgx.Batch, ws []any) error {
	for _, w := range ws {
		if err := queueAccounts(b, w.(eventstore.Event)); err != nil {
			return err
		}
	}
	return nil
}

// queueAccounts queues the writes of e, which follows the last event of its stream that
// was applied.
func queueAccounts(b *pgx.Batch, e eventstore.Event) error {
	if e.StreamType != domain.StreamAccount && e.StreamType != domain.StreamKey {
		return nil
	}
	ev, err := domain.Decode(e.Type, e.SchemaVersion, e.Payload)
	if err != nil {
		return err
	}
	id := rowID(e)
	if e.StreamType == domain.StreamAccount {
		switch ev := ev.(type) {
		case *domain.AccountCreated:
			b.Queue(`INSERT INTO accounts (account_id, email, name, agent, source, plan, email_verified, created_at, version)
				VALUES ($1, $2, $3, $4, $5, $6, false, $7, $8)`,
				ev.AccountID, ev.Email, ev.Name, ev.Agent, ev.Source, ev.Plan, ev.CreatedAt, e.Version)
		case *domain.PlanChanged:
			b.Queue(`UPDATE accounts SET plan = $2, version = $3 WHERE account_id = $1`, id, ev.Plan, e.Version)
		case *domain.EmailVerified:
			b.Queue(`UPDATE accounts SET email_verified = true, version = $2 WHERE account_id = $1`, id, e.Version)
		default:
			b.Queue(`UPDATE accounts SET version = $2 WHERE account_id = $1`, id, e.Version)
		}
		return nil
	}
	switch ev := ev.(type) {
	case *domain.KeyCreated:
		b.Queue(`INSERT INTO api_keys (key_id, account_id, label, scopes, env, budget_units, budget_usd, budget_period, budget_from, status, prefix, created_at, version)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'active', $10, $11, $12)`,
			id, ev.AccountID, ev.Label, scopeStrings(ev.Scopes), ev.Env, ev.BudgetUnits, ev.BudgetUSD, periodOf(ev.BudgetPeriod),
			nonEmpty(ev.BudgetFrom), ev.Prefix, ev.CreatedAt, e.Version)
		b.Queue(`INSERT INTO key_secrets (secret_hash, key_id) VALUES ($1, $2)`, unhex(ev.SecretHash), id)
	case *domain.KeyUpdated:
		b.Queue(`UPDATE api_keys SET label = $2, scopes = $3, budget_units = $4, budget_usd = $5, budget_period = $6, budget_from = $7, version = $8
			WHERE key_id = $1`,
			id, ev.Label, scopeStrings(ev.Scopes), ev.BudgetUnits, ev.BudgetUSD, periodOf(ev.BudgetPeriod), nonEmpty(ev.BudgetFrom), e.Version)
	case *domain.KeyRotated:
		b.Queue(`UPDATE key_secrets SET expires_at = $2 WHERE key_id = $1 AND (expires_at IS NULL OR expires_at > $2)`, id, ev.OldExpires)
		b.Queue(`DELETE FROM key_secrets WHERE key_id = $1 AND expires_at <= $2`, id, ev.RotatedAt)
		b.Queue(`INSERT INTO key_secrets (secret_hash, key_id) VALUES ($1, $2)`, unhex(ev.SecretHash), id)
		b.Queue(`UPDATE api_keys SET prefix = $2, rotated_at = $3, budget_from = $4, version = $5 WHERE key_id = $1`,
			id, ev.Prefix, ev.RotatedAt, nonEmpty(ev.BudgetFrom), e.Version)
	case *domain.KeyRevoked:
		b.Queue(`UPDATE api_keys SET status = 'revoked', revoked_at = $2, version = $3 WHERE key_id = $1`, id, ev.RevokedAt, e.Version)
	default:
		return fmt.Errorf("key stream: unexpected event %s", e.Type)
	}
	return nil
}

// periodOf is the period an event's budgets are per: events before periods had none,
// and their budgets were for the key's whole life.
func periodOf(p domain.BudgetPeriod) string {
	if p == "" {
		return string(domain.PeriodTotal)
	}
	return string(p)
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
