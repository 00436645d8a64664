package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"chessd/domain"
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
	SpentUnits  int64 // over the key's whole life, credits deducted
	SpentUSD    decimal.Decimal
	// Period is how long the budgets last ("total": the key's life; "day", "month": the
	// calendar period of the account's time zone, PeriodStart to PeriodEnd). PeriodUnits
	// and PeriodUSD are what the current period spent: what the budgets cap.
	Period                 string
	PeriodStart, PeriodEnd *time.Time
	PeriodUnits            int64
	PeriodUSD              decimal.Decimal
	// HeldUnits is what the key's running jobs hold: the fresh price of their positions
	// not analysed yet, which no other call can use. The servers' leases on the key are
	// not counted: they are reserved for the key's own next calls and given back within
	// seconds when unused, so they are the key's to spend.
	HeldUnits  int64
	HeldUSD    decimal.Decimal
	LastUsedAt *time.Time // the key's last charged call
}

// RemainingUnits is what the key may still spend in units this period: budget −
// spent in the period − held by jobs, never below 0; nil without a units budget.
func (b Balance) RemainingUnits() *int64 {
	if b.BudgetUnits == nil {
		return nil
	}
	v := max(0, *b.BudgetUnits-b.PeriodUnits-b.HeldUnits)
	return &v
}

// RemainingUSD is RemainingUnits for the USD budget.
func (b Balance) RemainingUSD() *decimal.Decimal {
	if b.BudgetUSD == nil {
		return nil
	}
	v := decimal.Max(decimal.Zero, b.BudgetUSD.Sub(b.PeriodUSD).Sub(b.HeldUSD))
	return &v
}

// jobOwners matches the owner of every job's hold (a lease owned by the job).
var jobOwners = holdOwner("") + "%"

// KeyBalances reads the balances of an account's keys, by key id.
func KeyBalances(ctx context.Context, q eventstore.Querier, accountID string) (map[string]Balance, error) {
	rows, err := q.Query(ctx, `SELECT b.key_id, b.env, b.budget_units, b.budget_usd, b.spent_units, b.spent_usd,
			coalesce(j.units, 0), b.last_used_at, b.budget_period, b.period_start, b.period_end, b.period_units, b.period_usd
		FROM key_periods b
		LEFT JOIN (SELECT key_id, sum(units) AS units FROM leases WHERE account_id = $1 AND owner LIKE $2 GROUP BY key_id) j
			ON j.key_id = b.key_id
		WHERE b.account_id = $1`, accountID, jobOwners)
	if err != nil {
		return nil, fmt.Errorf("key balances: %w", err)
	}
	out := map[string]Balance{}
	var b Balance
	_, err = pgx.ForEachRow(rows, []any{&b.KeyID, &b.Env, &b.BudgetUnits, &b.BudgetUSD, &b.SpentUnits, &b.SpentUSD,
		&b.HeldUnits, &b.LastUsedAt, &b.Period, &b.PeriodStart, &b.PeriodEnd, &b.PeriodUnits, &b.PeriodUSD}, func() error {
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
// a request reaches the SQL text. The time buckets are computed in the query's time
// zone (the transaction's TimeZone, set by Usage): a bucket is labelled by its local
// start with its offset, so the two 01:00 hours of a daylight-saving night stay apart.
var usageColumns = map[string]string{
	"key": "key_id", "endpoint": "endpoint", "engine": "engine", "env": "env",
	"cached": "CASE WHEN cached THEN 'true' ELSE 'false' END",
	"hour":   `to_char(date_trunc('hour', at), 'YYYY-MM-DD"T"HH24:MI:SSTZH:TZM')`,
	"day":    `to_char(date_trunc('day', at), 'YYYY-MM-DD')`,
	"month":  `to_char(date_trunc('month', at), 'YYYY-MM')`,
}

// UsageGroups lists the groups of Usage, in the order the API documents them.
var UsageGroups = []string{"key", "hour", "day", "month", "endpoint", "engine", "env", "cached"}

// IsUsageGroup says whether name is a group of Usage (UsageGroups).
func IsUsageGroup(name string) bool {
	_, ok := usageColumns[name]
	return ok
}

// UsageQuery asks for an account's charges charged in [From, To), grouped.
type UsageQuery struct {
	AccountID string
	Env       string    // one book ("live", "test"), or "" for both
	From, To  time.Time // instants: charged_at in [From, To)
	Zone      string    // IANA time zone of the hour/day/month buckets; "" is UTC
	GroupBy   []string  // usage groups, each at most once
	// Page: at most Limit groups (0: all) after the group whose values are After (a
	// cursor: the previous page's last Values), in the groups' order.
	Limit int
	After []string
	// Exact sums the charges and credits tables even where the hourly rollup would
	// give the same answer (rollup.go): a benchmark's or a test's comparison.
	Exact bool
}

// UsageGroup is the charges and credits of one combination of the grouping values.
// A credit counts where its charge's key, endpoint, engine, env and cached put it, and
// in the time bucket of when it was credited.
type UsageGroup struct {
	Values []string // one per UsageQuery.GroupBy name, in its order
	Calls  int64
	Units  int64
	USD    decimal.Decimal
	UsageCredits
}

// UsageCredits is what was credited back: Units and USD less these is the net.
type UsageCredits struct {
	Credits       int64
	CreditedUnits int64
	CreditedUSD   decimal.Decimal
}

// UsageReport is what Usage found: a page of its groups, sorted by their values (none
// without GroupBy), More when further groups follow the page, and the totals of the
// whole range (every page's groups add up to them).
type UsageReport struct {
	Groups []UsageGroup
	More   bool
	Calls  int64
	Units  int64
	USD    decimal.Decimal
	UsageCredits
	// Rollup: the whole hours of the range were read from usage_hours (rollup.go).
	Rollup bool
}

// Usage sums an account's charges and credits from the ledger's read model (written
// with the charges themselves): from usage_hours, its hourly rollup, where that gives
// the answer the charges would give, from the charges otherwise (rollup.go). It reads
// in one read-only transaction: the page and the totals are of the same snapshot.
func Usage(ctx context.Context, pool *pgxpool.Pool, uq UsageQuery) (UsageReport, error) {
	cols := make([]string, len(uq.GroupBy))
	for i, g := range uq.GroupBy {
		c, ok := usageColumns[g]
		if !ok {
			return UsageReport{}, fmt.Errorf("usage: unknown group %q", g)
		}
		cols[i] = c
	}
	if len(uq.After) != 0 && len(uq.After) != len(cols) {
		return UsageReport{}, fmt.Errorf("usage: a cursor of %d values for %d groups", len(uq.After), len(cols))
	}
	zone := uq.Zone
	if zone == "" {
		zone = "UTC"
	}
	rep := UsageReport{USD: decimal.Zero}
	err := readOnly(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('TimeZone', $1, true)`, zone); err != nil {
			// A zone Go's tz database has and PostgreSQL's refuses (the right/ zones,
			// which count leap seconds) is the caller's to fix, not a 500.
			if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "22023" {
				return domain.Invalid("tz", fmt.Sprintf("the time zone %q is not one the database knows; use an IANA zone such as Europe/Paris", zone))
			}
			return fmt.Errorf("time zone %q: %w", zone, err)
		}
		src, args, rolled := usageSource(uq, zone)
		rep.Rollup = rolled
		srcArgs := slices.Clip(args) // the page's query appends its own
		totals := func() error {
			return tx.QueryRow(ctx, `SELECT coalesce(sum(calls), 0), coalesce(sum(units), 0), coalesce(sum(usd), 0),
				coalesce(sum(credits), 0), coalesce(sum(credited_units), 0), coalesce(sum(credited_usd), 0)
				FROM (`+src+`) src`, srcArgs...).
				Scan(&rep.Calls, &rep.Units, &rep.USD, &rep.Credits, &rep.CreditedUnits, &rep.CreditedUSD)
		}
		if len(cols) == 0 {
			return totals()
		}
		from := ` FROM (` + src + `) src`
		if rolled {
			// the rollup's rows summed by the columns the groups read first: their bucket
			// expressions then run once per hour and combination, not once per row
			raw := rawUsageColumns(uq.GroupBy)
			from = ` FROM (SELECT ` + raw + `, sum(calls) AS calls, sum(units) AS units, sum(usd) AS usd,
				sum(credits) AS credits, sum(credited_units) AS credited_units, sum(credited_usd) AS credited_usd
				FROM (` + src + `) u GROUP BY ` + raw + `) src`
		}
		names := make([]string, len(cols))
		for i := range cols {
			names[i] = fmt.Sprintf("g%d", i)
		}
		list := strings.Join(names, ", ")
		sql := `SELECT ` + list + `, calls, units, usd, credits, credited_units, credited_usd FROM (SELECT `
		for i, c := range cols {
			sql += c + ` AS ` + names[i] + `, `
		}
		sql += `sum(calls) AS calls, sum(units) AS units, sum(usd) AS usd, sum(credits) AS credits,
			sum(credited_units) AS credited_units, sum(credited_usd) AS credited_usd` + from + ` GROUP BY ` + list + `) g`
		if len(uq.After) > 0 {
			ps := make([]string, len(uq.After))
			for i, v := range uq.After {
				args = append(args, v)
				ps[i] = fmt.Sprintf("$%d::text", len(args))
			}
			sql += ` WHERE (` + list + `) > (` + strings.Join(ps, ", ") + `)`
		}
		sql += ` ORDER BY ` + list
		if uq.Limit > 0 {
			args = append(args, uq.Limit+1)
			sql += fmt.Sprintf(` LIMIT $%d`, len(args))
		}
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		for rows.Next() {
			g := UsageGroup{Values: make([]string, len(cols))}
			dst := make([]any, 0, len(cols)+3)
			for i := range g.Values {
				dst = append(dst, &g.Values[i])
			}
			if err := rows.Scan(append(dst, &g.Calls, &g.Units, &g.USD, &g.Credits, &g.CreditedUnits, &g.CreditedUSD)...); err != nil {
				rows.Close()
				return err
			}
			rep.Groups = append(rep.Groups, g)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if uq.Limit > 0 && len(rep.Groups) > uq.Limit {
			rep.Groups, rep.More = rep.Groups[:uq.Limit], true
		}
		if len(uq.After) > 0 || rep.More {
			return totals()
		}
		for _, g := range rep.Groups { // every group: the totals are their sums
			rep.Calls, rep.Units, rep.USD = rep.Calls+g.Calls, rep.Units+g.Units, rep.USD.Add(g.USD)
			rep.Credits, rep.CreditedUnits = rep.Credits+g.Credits, rep.CreditedUnits+g.CreditedUnits
			rep.CreditedUSD = rep.CreditedUSD.Add(g.CreditedUSD)
		}
		return nil
	})
	if err != nil {
		return UsageReport{}, fmt.Errorf("usage: %w", err)
	}
	return rep, nil
}

// ChargesSince counts the charges recorded after position after (a charges row each, a
// batch's lines: the read model is written with the events) and the transactions that
// committed them.
func ChargesSince(ctx context.Context, q eventstore.Querier, after int64) (charges, transactions int64, err error) {
	err = q.QueryRow(ctx, `SELECT (SELECT count(*) FROM charges WHERE position > $1)
			+ (SELECT coalesce(sum(lines), 0) FROM charge_batches WHERE position > $1),
			(SELECT count(DISTINCT xmin::text) FROM events WHERE position > $1 AND event_type IN ('UnitsCharged', 'ChargesSettled'))`,
		after).Scan(&charges, &transactions)
	if err != nil {
		return 0, 0, fmt.Errorf("count charges: %w", err)
	}
	return charges, transactions, nil
}
