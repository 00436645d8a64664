package projections

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"chessd/domain"
	"chessd/eventstore"
)

// KeyRow is a key as the read model (or the key's own events) describe it.
type KeyRow struct {
	KeyID       string
	AccountID   string
	Label       string
	Scopes      []string
	Env         string
	BudgetUnits *int64
	BudgetUSD   *decimal.Decimal
	Period      string // of the budgets: total, month or day
	// BudgetFrom is the key that handed this one its budget out of its own, if any
	BudgetFrom *string
	Status     string
	Prefix     string
	CreatedAt  time.Time
	RotatedAt  *time.Time
	RevokedAt  *time.Time
	Version    int64
}

// KeyRowFrom renders an aggregate the way the read model would, for answers that must
// not wait for the projection (the response to the command that changed the key).
func KeyRowFrom(k *domain.Key) KeyRow {
	return KeyRow{
		KeyID: k.ID(), AccountID: k.AccountID(), Label: k.Label(), Scopes: scopeStrings(k.Scopes()),
		Env: k.Env().String(), BudgetUnits: k.BudgetUnits(), BudgetUSD: k.BudgetUSD(), Period: string(k.BudgetPeriod()), BudgetFrom: nonEmpty(k.BudgetFrom()), Status: string(k.Status()),
		Prefix: k.Prefix(), CreatedAt: k.CreatedAt(), RotatedAt: k.RotatedAt(), RevokedAt: k.RevokedAt(), Version: k.Version(),
	}
}

const keyColumns = `key_id, account_id, label, scopes, env, budget_units, budget_usd, budget_period, budget_from, status, prefix,
	created_at, rotated_at, revoked_at, version`

func scanKey(row pgx.CollectableRow) (KeyRow, error) {
	var k KeyRow
	err := row.Scan(&k.KeyID, &k.AccountID, &k.Label, &k.Scopes, &k.Env, &k.BudgetUnits, &k.BudgetUSD, &k.Period, &k.BudgetFrom,
		&k.Status, &k.Prefix, &k.CreatedAt, &k.RotatedAt, &k.RevokedAt, &k.Version)
	return k, err
}

// nonEmpty is s, or nil when it is empty (a column's null).
func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// ListKeys lists an account's keys, oldest first; env filters when not empty.
func ListKeys(ctx context.Context, q eventstore.Querier, accountID, env string) ([]KeyRow, error) {
	rows, err := q.Query(ctx, `SELECT `+keyColumns+` FROM api_keys
		WHERE account_id = $1 AND ($2 = '' OR env = $2) ORDER BY created_at, key_id`, accountID, env)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanKey)
}

// AccountRow is an account as the read model has it.
type AccountRow struct {
	AccountID     string
	Email         string
	Name          string
	Plan          string
	EmailVerified bool
	CreatedAt     time.Time
	ActiveKeys    int
	TotalKeys     int
}

// GetAccount reads an account and counts its keys.
func GetAccount(ctx context.Context, q eventstore.Querier, accountID string) (AccountRow, error) {
	var a AccountRow
	err := q.QueryRow(ctx, `SELECT a.account_id, a.email, a.name, a.plan, a.email_verified, a.created_at,
			count(k.key_id) FILTER (WHERE k.status = 'active'), count(k.key_id)
		FROM accounts a LEFT JOIN api_keys k ON k.account_id = a.account_id
		WHERE a.account_id = $1 GROUP BY a.account_id`, accountID).
		Scan(&a.AccountID, &a.Email, &a.Name, &a.Plan, &a.EmailVerified, &a.CreatedAt, &a.ActiveKeys, &a.TotalKeys)
	if errors.Is(err, pgx.ErrNoRows) {
		return a, domain.Errorf(domain.CodeNotFound, "account not found")
	}
	return a, err
}

// WaitForKey waits, at most until ctx ends, until the read model reflects version of a
// key, so that a client's next read shows its own write. Authentication does not
// depend on it (see auth.Authenticator).
func WaitForKey(ctx context.Context, q eventstore.Querier, keyID string, version int64) error {
	return waitForVersion(ctx, q, `SELECT version FROM api_keys WHERE key_id = $1`, keyID, version)
}

// WaitForAccount is WaitForKey for an account row.
func WaitForAccount(ctx context.Context, q eventstore.Querier, accountID string, version int64) error {
	return waitForVersion(ctx, q, `SELECT version FROM accounts WHERE account_id = $1`, accountID, version)
}

func waitForVersion(ctx context.Context, q eventstore.Querier, query, id string, version int64) error {
	for {
		var v int64
		err := q.QueryRow(ctx, query, id).Scan(&v)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if v >= version {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}
