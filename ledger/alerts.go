package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"chessd/eventstore"
)

// AlertThresholds are the percentages of a units budget (a key's or an account's)
// whose crossing is told.
var AlertThresholds = []int32{50, 80, 100}

// Crossing is a threshold of a key's budget (or, KeyID empty, of its account's budget
// in Env) its spend has just crossed, in the period that starts at PeriodStart (nil
// for a budget for the whole life).
type Crossing struct {
	KeyID, AccountID, Env string
	Threshold             int32
	Budget, Spent         int64
	Period                string
	PeriodStart           *time.Time
}

// BudgetCrossings records, inside q's transaction, the thresholds crossed since the
// last call and returns them: each crossing once per period, whichever server asks
// first. It first forgets crossings no longer true (a refund lowered the spend, the
// budget was raised or removed, a new period began), so they are told again when
// crossed again. The percentages are reckoned in numeric: a budget set before budgets
// were bounded (domain.MaxBudgetUnits) overflowed bigint, and the statement, which
// runs for every account at once, failed for all of them.
func BudgetCrossings(ctx context.Context, q eventstore.Querier) ([]Crossing, error) {
	if _, err := q.Exec(ctx, `DELETE FROM budget_alerts a USING budget_holders b
		WHERE a.key_id = b.holder AND (b.budget_units IS NULL OR b.budget_units <> a.budget
			OR b.period_units::numeric * 100 < b.budget_units::numeric * a.threshold
			OR a.period_start IS DISTINCT FROM b.period_start)`); err != nil {
		return nil, fmt.Errorf("budget alerts: %w", err)
	}
	rows, err := q.Query(ctx, `WITH crossed AS (
			INSERT INTO budget_alerts (key_id, threshold, budget, spent, period_start)
			SELECT b.holder, t, b.budget_units, b.period_units, b.period_start
			  FROM budget_holders b, unnest($1::int[]) AS t
			 WHERE b.budget_units > 0 AND b.period_units::numeric * 100 >= b.budget_units::numeric * t
			ON CONFLICT (key_id, threshold) DO NOTHING
			RETURNING key_id, threshold, budget, spent, period_start)
		SELECT coalesce(b.key_id, ''), b.account_id, b.env, c.threshold, c.budget, c.spent, b.budget_period, c.period_start
		  FROM crossed c JOIN budget_holders b ON b.holder = c.key_id ORDER BY c.key_id, c.threshold`, AlertThresholds)
	if err != nil {
		return nil, fmt.Errorf("budget alerts: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Crossing, error) {
		var c Crossing
		err := r.Scan(&c.KeyID, &c.AccountID, &c.Env, &c.Threshold, &c.Budget, &c.Spent, &c.Period, &c.PeriodStart)
		return c, err
	})
}
