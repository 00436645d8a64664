package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"chessd/eventstore"
)

// AccountBudget is an account's budgets in one env as GET /me shows them: what all its
// keys together may spend per period (migrations/0024; the rule itself, meter_lease,
// also counts the servers' leases against it).
type AccountBudget struct {
	BudgetUnits            *int64 // nil: no budget of this kind
	BudgetUSD              *decimal.Decimal
	Period                 string
	PeriodStart, PeriodEnd *time.Time // null without a budget, or for "total"
	PeriodUnits            int64      // spent in the current period
	PeriodUSD              decimal.Decimal
	// HeldUnits is what running jobs hold of the budget; servers' leases are left out,
	// as in Balance (they serve the account's own next calls).
	HeldUnits int64
}

// RemainingUnits is what the account may still spend in units this period: budget −
// spent − held, never below 0; nil without a units budget.
func (b AccountBudget) RemainingUnits() *int64 {
	if b.BudgetUnits == nil {
		return nil
	}
	v := max(0, *b.BudgetUnits-b.PeriodUnits-b.HeldUnits)
	return &v
}

// RemainingUSD is RemainingUnits for the USD budget.
func (b AccountBudget) RemainingUSD() *decimal.Decimal {
	if b.BudgetUSD == nil {
		return nil
	}
	v := decimal.Max(decimal.Zero, b.BudgetUSD.Sub(b.PeriodUSD).Sub(UnitsUSD(b.HeldUnits)))
	return &v
}

// AccountBudgetOf reads an account's budgets in env as GET /me shows them; an account
// that never reserved anything there has none.
func AccountBudgetOf(ctx context.Context, q eventstore.Querier, accountID, env string) (AccountBudget, error) {
	var b AccountBudget
	err := q.QueryRow(ctx, `SELECT budget_units, budget_usd, budget_period, period_start, period_end, period_units, period_usd,
			coalesce((SELECT sum(units) FROM leases l WHERE l.account_id = a.account_id AND l.env = a.env AND l.owner LIKE $3), 0)
		FROM account_periods a WHERE account_id = $1 AND env = $2`, accountID, env, jobOwners).
		Scan(&b.BudgetUnits, &b.BudgetUSD, &b.Period, &b.PeriodStart, &b.PeriodEnd, &b.PeriodUnits, &b.PeriodUSD, &b.HeldUnits)
	if errors.Is(err, pgx.ErrNoRows) {
		return AccountBudget{Period: "month", PeriodUSD: decimal.Zero}, nil
	}
	if err != nil {
		return b, fmt.Errorf("account budget: %w", err)
	}
	if b.BudgetUnits == nil && b.BudgetUSD == nil {
		b.PeriodStart, b.PeriodEnd = nil, nil // no budget: its period means nothing
	}
	return b, nil
}
