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

// RecomputeBalances recomputes the spend kept on the write side (key_balances' spent
// units and USD, account_days' units) from the charges and credits read model (charges
// less what was credited), which the ledger projection derives from the UnitsCharged
// and ChargesSettled events, and which key balances are closed from the keys'
// KeyRevoked events; it returns both for comparison (`chessd replay`, after rebuilding
// the projection).
func RecomputeBalances(ctx context.Context, q eventstore.Querier) ([]BalanceCheck, error) {
	var out []BalanceCheck
	for _, c := range []struct{ name, live, replayed string }{
		{"key_balances.spent",
			`SELECT key_id || ' ' || spent_units || ' ' || spent_usd FROM key_balances WHERE spent_units > 0 ORDER BY 1`,
			`SELECT key_id || ' ' || sum(units) || ' ' || sum(usd)::numeric(20,6) FROM (
				SELECT key_id, units, usd FROM charge_lines() UNION ALL SELECT key_id, -units, -usd FROM credits) x
			GROUP BY key_id HAVING sum(units) > 0 ORDER BY 1`},
		// A balance a revocation left open (an older chessd revoked the key) shows here;
		// DELETE of the key again closes it.
		{"key_balances.revoked",
			`SELECT key_id FROM key_balances WHERE revoked_at IS NOT NULL ORDER BY 1`,
			`SELECT DISTINCT substr(stream_id, length('key-') + 1) FROM events WHERE event_type = 'KeyRevoked' ORDER BY 1`},
		{"account_days",
			`SELECT account_id || ' ' || env || ' ' || day || ' ' || units FROM account_days WHERE units > 0 ORDER BY 1`,
			`SELECT account_id || ' ' || env || ' ' || day || ' ' || sum(units) FROM (
				SELECT account_id, env, day, units FROM charge_lines() UNION ALL SELECT account_id, env, day, -units FROM credits) x
			GROUP BY account_id, env, day HAVING sum(units) > 0 ORDER BY 1`},
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

func textRows(ctx context.Context, q eventstore.Querier, sql string) ([]string, error) {
	rows, err := q.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
