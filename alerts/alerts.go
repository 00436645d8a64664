// Package alerts tells accounts when a key's spend crosses 50, 80 and 100 percent of
// its units budget: each crossing once (ledger.BudgetCrossings), as a
// "budget.threshold" webhook to every endpoint of the key's account and env, queued in
// the transaction that records the crossing.
package alerts

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/ledger"
	"chessd/webhook"
)

// Check records new crossings and queues their webhooks, in one transaction: a
// crossing is never recorded without its message, nor told twice. It returns them.
// The crossings come in key order, so an account's envs may be queued to in any order:
// Enqueue holds each account's endpoints lock shared before their rows, and a key
// recovery's DeleteAll, which takes it exclusive, waits for this transaction instead
// of deadlocking with it.
func Check(ctx context.Context, pool *pgxpool.Pool) ([]ledger.Crossing, error) {
	var out []ledger.Crossing
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		cs, err := ledger.BudgetCrossings(ctx, tx)
		if err != nil {
			return err
		}
		for _, c := range cs {
			data := map[string]any{
				"scope": "key", "key_id": c.KeyID, "threshold_percent": c.Threshold, "budget_units": c.Budget, "spent_units": c.Spent,
				"budget_period": c.Period, "period_start": c.PeriodStart, "at": time.Now().UTC().Format(time.RFC3339Nano),
			}
			if c.KeyID == "" {
				data["scope"], data["key_id"] = "account", nil
			}
			if _, err := webhook.Enqueue(ctx, tx, c.AccountID, c.Env, "", "budget.threshold", data); err != nil {
				return err
			}
		}
		out = cs
		return nil
	})
	return out, err
}

// Run checks every interval until ctx ends.
func Run(ctx context.Context, pool *pgxpool.Pool, every time.Duration, logger *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := Check(ctx, pool); err != nil && ctx.Err() == nil {
			logger.Warn("budget alerts", "err", err)
		}
	}
}
