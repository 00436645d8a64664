package ledger

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"chessd/eventstore"
)

// Reads of the ledger's tables for the API: balances and allowance use (key_balances,
// account_days, and the job holds among the leases) and usage (the charges read model).
// Callers above the ledger read money through these, never through SQL of their own.

// Balance is a key's budgets, spend and holds as the budget rule sees them.
type Balance struct {
	KeyID, Env  string
	BudgetUnits *int64 // nil: no budget of this kind
	BudgetUSD   *decimal.Decimal
	SpentUnits  int64
	SpentUSD    decimal.Decimal
	// HeldUnits is what the key's running jobs hold: the fresh price of their positions
	// not analysed yet, which no other call can use. The servers' leases on the key are
	// not counted: they are reserved for the key's own next calls and given back within
	// seconds when unused, so they are the key's to spend.
	HeldUnits  int64
	HeldUSD    decimal.Decimal
	LastUsedAt *time.Time // the key's last charged call
}

// RemainingUnits is what the key may still spend in units: budget − spent − held by
// jobs, never below 0; nil without a units budget.
func (b Balance) RemainingUnits() *int64 {
	if b.BudgetUnits == nil {
		return nil
	}
	v := max(0, *b.BudgetUnits-b.SpentUnits-b.HeldUnits)
	return &v
}

// RemainingUSD is RemainingUnits for the USD budget.
func (b Balance) RemainingUSD() *decimal.Decimal {
	if b.BudgetUSD == nil {
		return nil
	}
	v := decimal.Max(decimal.Zero, b.BudgetUSD.Sub(b.SpentUSD).Sub(b.HeldUSD))
	return &v
}

// jobOwners matches the owner of every job's hold (a lease owned by the job).
var jobOwners = holdOwner("") + "%"

// KeyBalances reads the balances of an account's keys, by key id.
func KeyBalances(ctx context.Context, q eventstore.Querier, accountID string) (map[string]Balance, error) {
	rows, err := q.Query(ctx, `SELECT b.key_id, b.env, b.budget_units, b.budget_usd, b.spent_units, b.spent_usd,
			coalesce(j.units, 0), b.last_used_at
		FROM key_balances b
		LEFT JOIN (SELECT key_id, sum(units) AS units FROM leases WHERE account_id = $1 AND owner LIKE $2 GROUP BY key_id) j
			ON j.key_id = b.key_id
		WHERE b.account_id = $1`, accountID, jobOwners)
	if err != nil {
		return nil, fmt.Errorf("key balances: %w", err)
	}
	out := map[string]Balance{}
	var b Balance
	_, err = pgx.ForEachRow(rows, []any{&b.KeyID, &b.Env, &b.BudgetUnits, &b.BudgetUSD, &b.SpentUnits, &b.SpentUSD,
		&b.HeldUnits, &b.LastUsedAt}, func() error {
		b.HeldUSD = UnitsUSD(b.HeldUnits) // a hold's USD is its units at the unit price (meter_lease)
		out[b.KeyID] = b
		b = Balance{} // fresh pointers for the next row
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("key balances: %w", err)
	}
	return out, nil
}

// AllowanceDay is an account's use of its daily allowance in one env on one UTC day.
type AllowanceDay struct {
	Units int64 // charged
	// HeldUnits is what running jobs accepted that day hold of it; servers' leases are
	// left out, as in Balance.
	HeldUnits int64
}

// Remaining is what is left of allowance: allowance − charged − held by jobs, never
// below 0.
func (d AllowanceDay) Remaining(allowance int64) int64 {
	return max(0, allowance-d.Units-d.HeldUnits)
}

// DayUse reads an account's allowance use in env on day (its UTC date).
func DayUse(ctx context.Context, q eventstore.Querier, accountID, env string, day time.Time) (AllowanceDay, error) {
	var d AllowanceDay
	date := day.UTC().Format(time.DateOnly)
	err := q.QueryRow(ctx, `SELECT
			coalesce((SELECT units FROM account_days WHERE account_id = $1 AND env = $2 AND day = $3), 0),
			coalesce((SELECT sum(units) FROM leases WHERE account_id = $1 AND env = $2 AND day = $3 AND owner LIKE $4), 0)`,
		accountID, env, date, jobOwners).Scan(&d.Units, &d.HeldUnits)
	if err != nil {
		return d, fmt.Errorf("allowance use: %w", err)
	}
	return d, nil
}

// usageColumns are the usage groups and their columns: a closed list, so nothing from
// a request reaches the SQL text.
var usageColumns = map[string]string{
	"key": "key_id", "day": "to_char(day, 'YYYY-MM-DD')", "endpoint": "endpoint", "engine": "engine", "env": "env",
}

// IsUsageGroup says whether name is a group of Usage: key, day, endpoint, engine, env.
func IsUsageGroup(name string) bool {
	_, ok := usageColumns[name]
	return ok
}

// UsageQuery asks for an account's charges over a range of UTC days.
type UsageQuery struct {
	AccountID string
	Env       string    // one book ("live", "test"), or "" for both
	From, To  time.Time // UTC dates, inclusive
	GroupBy   []string  // usage groups, each at most once
}

// UsageGroup is the charges of one combination of the grouping values.
type UsageGroup struct {
	Values []string // one per UsageQuery.GroupBy name, in its order
	Calls  int64
	Units  int64
	USD    decimal.Decimal
}

// UsageReport is what Usage found: its groups, sorted by their values (none without
// GroupBy), and the totals.
type UsageReport struct {
	Groups []UsageGroup
	Calls  int64
	Units  int64
	USD    decimal.Decimal
}

// Usage sums an account's charges from the charges read model (the ledger_v1
// projection of the UnitsCharged events).
func Usage(ctx context.Context, q eventstore.Querier, uq UsageQuery) (UsageReport, error) {
	cols := make([]string, len(uq.GroupBy))
	for i, g := range uq.GroupBy {
		c, ok := usageColumns[g]
		if !ok {
			return UsageReport{}, fmt.Errorf("usage: unknown group %q", g)
		}
		cols[i] = c
	}
	sql := `SELECT ` + strings.Join(append(cols, "count(*)", "coalesce(sum(units), 0)", "coalesce(sum(usd), 0)"), ", ") +
		` FROM charges WHERE account_id = $1 AND day BETWEEN $2 AND $3 AND ($4 = '' OR env = $4)`
	if len(cols) > 0 {
		sql += ` GROUP BY ` + strings.Join(cols, ", ") + ` ORDER BY ` + strings.Join(cols, ", ")
	}
	rows, err := q.Query(ctx, sql, uq.AccountID, uq.From.UTC().Format(time.DateOnly), uq.To.UTC().Format(time.DateOnly), uq.Env)
	if err != nil {
		return UsageReport{}, fmt.Errorf("usage: %w", err)
	}
	defer rows.Close()
	rep := UsageReport{USD: decimal.Zero}
	for rows.Next() {
		g := UsageGroup{Values: make([]string, len(cols))}
		dst := make([]any, 0, len(cols)+3)
		for i := range g.Values {
			dst = append(dst, &g.Values[i])
		}
		if err := rows.Scan(append(dst, &g.Calls, &g.Units, &g.USD)...); err != nil {
			return UsageReport{}, fmt.Errorf("usage: %w", err)
		}
		if g.Calls == 0 {
			continue // no charges at all: the ungrouped sum row
		}
		if len(cols) > 0 { // without groups there are only the totals
			rep.Groups = append(rep.Groups, g)
		}
		rep.Calls += g.Calls
		rep.Units += g.Units
		rep.USD = rep.USD.Add(g.USD)
	}
	if err := rows.Err(); err != nil {
		return UsageReport{}, fmt.Errorf("usage: %w", err)
	}
	return rep, nil
}
