package ledger

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"chessd/eventstore"
)

// BalanceCheck compares one kind of write-side balance with what the charges give.
// Live and Replayed are rows rendered as text, sorted, so equal slices mean equal
// tables.
type BalanceCheck struct {
	Name     string
	Live     []string
	Replayed []string
}

// Equal reports whether the live balances are what the charges say.
func (c BalanceCheck) Equal() bool {
	return slices.Equal(c.Live, c.Replayed)
}

// Recompute runs RecomputeBalances and RecomputeSettings on one snapshot of the
// database (a read-only repeatable-read transaction), so that on a running service a
// settle committing between a check's live read and its recount is not reported as a
// difference.
func Recompute(ctx context.Context, db interface {
	BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
}) (balances, settings []BalanceCheck, err error) {
	err = pgx.BeginTxFunc(ctx, db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if balances, err = RecomputeBalances(ctx, tx); err != nil {
			return err
		}
		settings, err = RecomputeSettings(ctx, tx)
		return err
	})
	return balances, settings, err
}

// RecomputeBalances recomputes what the write side keeps of the charges from the
// charges and credits read model (charges less what was credited), which the ledger
// projection derives from the UnitsCharged, ChargesSettled and UnitsCredited events, and
// which key balances are closed from the keys' KeyRevoked events; it returns both for
// comparison (`chessd replay`, after rebuilding the projection):
//
//   - key_balances.spent: each key's lifetime spend;
//   - key_balances.period and account_budgets.period: the spend of each key's and each
//     account's (per env) current budget period, what meter_lease checks the budgets
//     against and GET /me and GET /keys show;
//   - key_balances.revoked: which balances are closed;
//   - account_days: each day's allowance use.
//
// Every row of either side is compared: a key, account or day the charges never
// touched is 0 by them, so a live row wrong at zero or below shows, and so does a row
// missing from the live side.
//
// A period's spend is counted by charged_since, the rule the ledger itself recounts a
// period with when a budget is set (meter_set_budget, meter_set_account_budget): the
// charges made since the period's start (period_start as stored, whatever the zone is
// now; all of them for a total budget, and for an account budget that never had a
// period) less the credits of those charges, which is what Credit gives back. Settling
// counts a charge in the period current at the later of the database's clock when it
// settles and the batch's latest charged_at (migrations/0054), and the log keeps the
// charge's own time (the server's clock when it was answered), not that: a charge
// answered in the last moments of a period and settled in the next one (a group
// commit's few milliseconds, or a server's clock behind the database's) is in the new
// period live and in the old one here, so the check can report such a period until it
// ends, and is exact otherwise. An account budget row made by migration 0024 for an account charged before
// it, and never given a budget since, counts from the migration (setting a budget
// recounts it).
func RecomputeBalances(ctx context.Context, q eventstore.Querier) ([]BalanceCheck, error) {
	var out []BalanceCheck
	for _, c := range []struct{ name, live, replayed string }{
		{"key_balances.spent",
			`SELECT key_id || ' ' || spent_units || ' ' || spent_usd FROM key_balances ORDER BY 1`,
			`SELECT key_id || ' ' || sum(units) || ' ' || sum(usd)::numeric(20,6) FROM (
				SELECT key_id, 0 AS units, 0 AS usd FROM key_balances
				UNION ALL SELECT key_id, units, usd FROM charge_lines() UNION ALL SELECT key_id, -units, -usd FROM credits) x
			GROUP BY key_id ORDER BY 1`},
		{"key_balances.period",
			`SELECT key_id || ' ' || ` + periodFrom("period_start") + ` || ' ' || period_units || ' ' || period_usd
			FROM key_balances ORDER BY 1`,
			`SELECT b.key_id || ' ' || ` + periodFrom("b.period_start") + ` || ' ' || s.units || ' ' || s.usd::numeric(20,6)
			FROM key_balances b CROSS JOIN LATERAL charged_since(b.account_id, b.env, b.key_id, b.period_start) s ORDER BY 1`},
		// A balance a revocation left open (an older chessd revoked the key) shows here;
		// DELETE of the key again closes it.
		{"key_balances.revoked",
			`SELECT key_id FROM key_balances WHERE revoked_at IS NOT NULL ORDER BY 1`,
			`SELECT DISTINCT substr(stream_id, length('key-') + 1) FROM events WHERE event_type = 'KeyRevoked' ORDER BY 1`},
		// An account's row exists from its first reservation in the env, so every account
		// and env charged has one.
		{"account_budgets.period",
			`SELECT account_id || ' ' || env || ' ' || ` + periodFrom("period_start") + ` || ' ' || period_units || ' ' || period_usd
			FROM account_budgets ORDER BY 1`,
			`SELECT a.account_id || ' ' || a.env || ' ' || ` + periodFrom("a.period_start") + ` || ' ' || s.units || ' ' || s.usd::numeric(20,6)
			FROM (SELECT account_id, env, period_start FROM account_budgets
				UNION SELECT account_id, env, NULL FROM charge_lines() c
				WHERE NOT EXISTS (SELECT 1 FROM account_budgets b WHERE b.account_id = c.account_id AND b.env = c.env)) a
			CROSS JOIN LATERAL charged_since(a.account_id, a.env, NULL, a.period_start) s ORDER BY 1`},
		{"account_days",
			`SELECT account_id || ' ' || env || ' ' || day || ' ' || units FROM account_days ORDER BY 1`,
			`SELECT account_id || ' ' || env || ' ' || day || ' ' || sum(units) FROM (
				SELECT account_id, env, day, 0 AS units FROM account_days
				UNION ALL SELECT account_id, env, day, units FROM charge_lines() UNION ALL SELECT account_id, env, day, -units FROM credits) x
			GROUP BY account_id, env, day ORDER BY 1`},
	} {
		check := BalanceCheck{Name: c.name}
		var err error
		if check.Live, err = textRows(ctx, q, c.live); err != nil {
			return nil, fmt.Errorf("ledger: recompute %s: %w", c.name, err)
		}
		if check.Replayed, err = textRows(ctx, q, c.replayed); err != nil {
			return nil, fmt.Errorf("ledger: recompute %s: %w", c.name, err)
		}
		out = append(out, check)
	}
	return out, nil
}

// periodFrom renders a period's start column for a check's rows: the UTC instant, or
// "all" when the period is the whole history (a total budget).
func periodFrom(col string) string {
	return `coalesce(to_char(` + col + ` AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), 'all')`
}

func textRows(ctx context.Context, q eventstore.Querier, sql string) ([]string, error) {
	rows, err := q.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
