package ledger

import (
	"context"
	"fmt"
	"slices"

	"github.com/shopspring/decimal"

	"chessd/domain"
	"chessd/eventstore"
)

// RecomputeSettings compares the budgets and zones the meter enforces, and GET /me
// shows, with what the keys' and accounts' events set (`chessd replay`): a drifted row
// is a budget the customer never set, enforced, beside the one GET /keys shows.
//
//   - key_balances.budget: each key's budgets and period (KeyCreated, KeyUpdated);
//   - account_budgets.budget: each account's per env (AccountBudgetSet), for the rows
//     the meter keeps and every budget the events set;
//   - account_zones: each account's zone other than UTC (TimezoneSet).
func RecomputeSettings(ctx context.Context, q eventstore.Querier) ([]BalanceCheck, error) {
	keys, err := foldStreams(ctx, q, domain.StreamKey, domain.RehydrateKey)
	if err != nil {
		return nil, err
	}
	accounts, err := foldStreams(ctx, q, domain.StreamAccount, domain.RehydrateAccount)
	if err != nil {
		return nil, err
	}
	keyCheck := BalanceCheck{Name: "key_balances.budget"}
	if keyCheck.Live, err = textRows(ctx, q, `SELECT key_id || ' ' || `+budgetText("budget_units", "budget_usd")+` || ' ' || budget_period
		FROM key_balances ORDER BY 1`); err != nil {
		return nil, fmt.Errorf("ledger: key budgets: %w", err)
	}
	for _, k := range keys {
		keyCheck.Replayed = append(keyCheck.Replayed, settingText(k.ID(), k.BudgetUnits(), k.BudgetUSD(), k.BudgetPeriod()))
	}
	accountCheck := BalanceCheck{Name: "account_budgets.budget"}
	if accountCheck.Live, err = textRows(ctx, q, `SELECT account_id || ' ' || env || ' ' || `+budgetText("budget_units", "budget_usd")+` || ' ' || budget_period
		FROM account_budgets ORDER BY 1`); err != nil {
		return nil, fmt.Errorf("ledger: account budgets: %w", err)
	}
	rowList, err := textRows(ctx, q, `SELECT account_id || ' ' || env FROM account_budgets`)
	if err != nil {
		return nil, fmt.Errorf("ledger: account budgets: %w", err)
	}
	rowed := make(map[string]bool, len(rowList))
	for _, r := range rowList {
		rowed[r] = true
	}
	zoneCheck := BalanceCheck{Name: "account_zones"}
	if zoneCheck.Live, err = textRows(ctx, q, `SELECT account_id || ' ' || tz FROM account_zones WHERE tz <> 'UTC' ORDER BY 1`); err != nil {
		return nil, fmt.Errorf("ledger: account zones: %w", err)
	}
	for _, a := range accounts {
		for _, env := range []domain.Env{domain.EnvLive, domain.EnvTest} {
			b := a.Budget(env)
			if b.Units == nil && b.USD == nil && !rowed[a.ID()+" "+env.String()] {
				continue // no budget, and the meter keeps no row for it
			}
			accountCheck.Replayed = append(accountCheck.Replayed, settingText(a.ID()+" "+env.String(), b.Units, b.USD, b.Period))
		}
		if tz := a.Timezone(); tz != "UTC" {
			zoneCheck.Replayed = append(zoneCheck.Replayed, a.ID()+" "+tz)
		}
	}
	for _, c := range []*BalanceCheck{&keyCheck, &accountCheck, &zoneCheck} {
		slices.Sort(c.Live)
		slices.Sort(c.Replayed)
	}
	return []BalanceCheck{keyCheck, accountCheck, zoneCheck}, nil
}

// budgetText renders a row's budgets as settingText does.
func budgetText(units, usd string) string {
	return `coalesce(` + units + `::text, 'none') || ' ' || coalesce(` + usd + `::numeric(20,6)::text, 'none')`
}

// settingText renders one holder's budgets and period as the check's rows.
func settingText(holder string, units *int64, usd *decimal.Decimal, period domain.BudgetPeriod) string {
	u, d := "none", "none"
	if units != nil {
		u = fmt.Sprint(*units)
	}
	if usd != nil {
		d = usd.StringFixed(6)
	}
	return holder + " " + u + " " + d + " " + string(period)
}

// foldStreams folds every stream of streamType with fold, reading their events in one
// query, in stream and version order.
func foldStreams[T any](ctx context.Context, q eventstore.Querier, streamType string, fold func([]domain.Event) T) ([]T, error) {
	rows, err := q.Query(ctx, `SELECT stream_id, version, event_type, schema_version, payload FROM events
		WHERE stream_type = $1 ORDER BY stream_id, version`, streamType)
	if err != nil {
		return nil, fmt.Errorf("ledger: %s streams: %w", streamType, err)
	}
	defer rows.Close()
	var out []T
	var stream string
	var evs []domain.Event
	for rows.Next() {
		var id, typ string
		var version int64
		var schema int
		var payload []byte
		if err := rows.Scan(&id, &version, &typ, &schema, &payload); err != nil {
			return nil, fmt.Errorf("ledger: %s streams: %w", streamType, err)
		}
		if id != stream && evs != nil {
			out = append(out, fold(evs))
			evs = nil
		}
		stream = id
		e, err := domain.Decode(typ, schema, payload)
		if err != nil {
			return nil, fmt.Errorf("ledger: stream %s version %d: %w", id, version, err)
		}
		evs = append(evs, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: %s streams: %w", streamType, err)
	}
	if evs != nil {
		out = append(out, fold(evs))
	}
	return out, nil
}
