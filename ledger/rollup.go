package ledger

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"chessd/eventstore"
)

// usage_hours (migration 0023) is the hourly rollup of the ledger's read model: per
// account, key, env, endpoint, engine, cached and UTC hour, the charges charged and the
// credits credited in that hour. The inline writer keeps it (readmodel.go), so it is
// exactly the charges and credits tables summed by hour, in every transaction.
//
// Usage reads it for the whole UTC hours of its range, and the charges and credits
// themselves for a ragged start or end (an RFC 3339 bound, an as_of), when that gives
// the very answer the charges alone would: when the report has no time bucket, or when
// each of those hours lies within one hour of the asked zone's clock (its offset is a
// whole number of hours, changing only on a UTC hour: UTC, America/New_York across its
// daylight-saving changes; not Asia/Kolkata, +05:30). Otherwise it sums the charges.

// RefreshRollup recomputes usage_hours and usage_key_hours from the charges and credits
// tables (usage_refresh, as the migrations backfilled them): the end of a rebuild of the
// ledger's read model in place, a benchmark's seeding. It takes the chain's head first,
// which every append holds while it writes its inline rows: appends wait until q's
// transaction ends.
func RefreshRollup(ctx context.Context, q eventstore.Querier) error {
	if _, err := q.Exec(ctx, `SELECT usage_refresh()`); err != nil {
		return fmt.Errorf("refresh the usage rollups: %w", err)
	}
	return nil
}

// FillRollup fills usage_hours and usage_key_hours, both empty, from the charges and
// credits, taking no lock (usage_fill): a rebuild's copies of the tables, which no append
// writes.
func FillRollup(ctx context.Context, q eventstore.Querier) error {
	if _, err := q.Exec(ctx, `SELECT usage_fill()`); err != nil {
		return fmt.Errorf("fill the usage rollups: %w", err)
	}
	return nil
}

// hourSpan splits [from, to) into the whole UTC hours [hourFrom, hourTo), which
// usage_hours answers, and the ragged ends [from, hourFrom) and [hourTo, to), which
// the charges answer; ok is false when the range holds no whole hour.
func hourSpan(from, to time.Time) (hourFrom, hourTo time.Time, ok bool) {
	// Truncate rounds since the zero time, a UTC midnight: to UTC hours
	hourFrom, hourTo = from.Truncate(time.Hour), to.Truncate(time.Hour)
	if hourFrom.Before(from) {
		hourFrom = hourFrom.Add(time.Hour)
	}
	return hourFrom, hourTo, hourFrom.Before(hourTo)
}

// zoneKeepsUTCHours says whether each UTC hour of [from, to) lies within one hour of
// zone's clock: the zone's offset is a whole number of hours all along and changes
// only at the start of a UTC hour. Then an hour of usage_hours falls in exactly the
// local hour, day and month its charges fall in. An unknown zone is not.
func zoneKeepsUTCHours(zone string, from, to time.Time) bool {
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return false
	}
	for t := from; t.Before(to); {
		local := t.In(loc)
		if _, offset := local.Zone(); offset%3600 != 0 {
			return false
		}
		_, end := local.ZoneBounds()
		if end.IsZero() { // no change after this one
			return true
		}
		if !end.Equal(end.Truncate(time.Hour)) {
			return false
		}
		t = end
	}
	return true
}

// timeBuckets says whether groups bucket by the zone's calendar.
func timeBuckets(groups []string) bool {
	for _, g := range groups {
		if g == "hour" || g == "day" || g == "month" {
			return true
		}
	}
	return false
}

// exactUsage is the rows Usage sums from the charges and credits tables, over
// [lo, hi) (SQL parameters; $1 the account, $4 the env or ”): each charge, and each
// credit under its charge's key, endpoint, engine, env and cached, at its own time.
func exactUsage(lo, hi string) string {
	return `SELECT key_id, endpoint, engine, env, cached, charged_at AS at, 1::bigint AS calls, units, usd,
			0::bigint AS credits, 0::bigint AS credited_units, 0::numeric AS credited_usd
		  FROM charge_lines() WHERE account_id = $1 AND charged_at >= ` + lo + ` AND charged_at < ` + hi + `
			AND last_at >= ` + lo + ` AND first_at < ` + hi + ` AND ($4 = '' OR env = $4)
		UNION ALL
		SELECT c.key_id, c.endpoint, c.engine, c.env, c.cached, r.credited_at, 0, 0, 0, 1, r.units, r.usd
		  FROM credits r JOIN charge_lines() c ON c.position = r.charge_position AND c.line = r.charge_line
		 WHERE r.account_id = $1 AND r.credited_at >= ` + lo + ` AND r.credited_at < ` + hi + ` AND ($4 = '' OR r.env = $4)`
}

// rolledUsage is those rows from the rollup for its hours in [lo, hi), each at the
// start of its hour: from usage_key_hours when groups name nothing it lacks (endpoint,
// engine, cached read as constants there), usage_hours otherwise.
func rolledUsage(lo, hi string, groups []string) string {
	from := `key_id, '' AS endpoint, '' AS engine, env, false AS cached, hour AS at, calls, units, usd, credits,
			credited_units, credited_usd FROM usage_key_hours`
	if slices.ContainsFunc(groups, func(g string) bool { return g == "endpoint" || g == "engine" || g == "cached" }) {
		from = `key_id, endpoint, engine, env, cached, hour AS at, calls, units, usd, credits, credited_units, credited_usd
		  FROM usage_hours`
	}
	return `SELECT ` + from + ` WHERE account_id = $1 AND hour >= ` + lo + ` AND hour < ` + hi + ` AND ($4 = '' OR env = $4)`
}

// usageSource is the rows Usage sums (a query, its arguments): the rollup for the
// whole hours and the charges for the rest when that gives the same answer (see
// above), the charges alone otherwise.
func usageSource(uq UsageQuery, zone string) (src string, args []any, rolled bool) {
	args = []any{uq.AccountID, uq.From, uq.To, uq.Env}
	hourFrom, hourTo, ok := hourSpan(uq.From, uq.To)
	if uq.Exact || !ok || (timeBuckets(uq.GroupBy) && !zoneKeepsUTCHours(zone, hourFrom, hourTo)) {
		return exactUsage("$2", "$3"), args, false
	}
	args = append(args, hourFrom, hourTo)
	return rolledUsage("$5", "$6", uq.GroupBy) + `
		UNION ALL ` + exactUsage("$2", "$5") + `
		UNION ALL ` + exactUsage("$6", "$3"), args, true
}

// statementTotals sums the charges of a statement's range into st, and their credits:
// usage_hours for its whole UTC hours, the charges for a ragged start or end (since,
// until), so that the cost of a page does not grow with the account's charges. args
// are statementFilter's.
func statementTotals(ctx context.Context, tx pgx.Tx, sq StatementQuery, args []any, st *Statement) error {
	utcDay := func(t time.Time) time.Time {
		t = t.UTC()
		return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	}
	var lo, hi *time.Time // the range's charged_at bounds, nil: none
	if sq.FromDay != nil {
		d := utcDay(*sq.FromDay)
		lo = &d
	}
	if sq.Since != nil && (lo == nil || sq.Since.After(*lo)) {
		lo = sq.Since
	}
	if sq.ToDay != nil {
		d := utcDay(*sq.ToDay).AddDate(0, 0, 1)
		hi = &d
	}
	if sq.Until != nil && (hi == nil || sq.Until.Before(*hi)) {
		hi = sq.Until
	}
	// usage_hours answers [hourFrom, hourTo); the charges [lo, hourFrom) and [hourTo, hi)
	hourFrom := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	hourTo := pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}
	var none time.Time
	edges := [4]time.Time{none, none, none, none} // empty: [none, none)
	switch {
	case lo != nil && hi != nil:
		if hf, ht, ok := hourSpan(*lo, *hi); ok {
			hourFrom, hourTo = pgtype.Timestamptz{Time: hf, Valid: true}, pgtype.Timestamptz{Time: ht, Valid: true}
			edges = [4]time.Time{*lo, hf, ht, *hi}
		} else { // no whole hour: the charges alone
			hourTo = hourFrom
			edges = [4]time.Time{*lo, *hi, none, none}
		}
	case lo != nil:
		hf, _, _ := hourSpan(*lo, *lo)
		hourFrom, edges[0], edges[1] = pgtype.Timestamptz{Time: hf, Valid: true}, *lo, hf
	case hi != nil:
		_, ht, _ := hourSpan(*hi, *hi)
		hourTo, edges[2], edges[3] = pgtype.Timestamptz{Time: ht, Valid: true}, ht, *hi
	}
	const filter = `account_id = $1 AND env = $2 AND ($3 = '' OR key_id = $3) AND ($4 = '' OR endpoint = $4)`
	rolled := `SELECT calls, units, usd FROM usage_hours WHERE ` + filter
	if sq.Endpoint == "" { // the rollup per key and hour has every other filter's columns
		rolled = `SELECT calls, units, usd FROM usage_key_hours WHERE account_id = $1 AND env = $2 AND ($3 = '' OR key_id = $3)
			AND $4 = ''`
	}
	err := tx.QueryRow(ctx, `SELECT coalesce(sum(calls), 0), coalesce(sum(units), 0), coalesce(sum(usd), 0) FROM (
			`+rolled+` AND hour >= $5 AND hour < $6
			UNION ALL
			SELECT 1, units, usd FROM charge_lines() WHERE `+filter+`
				AND ((charged_at >= $7 AND charged_at < $8) OR (charged_at >= $9 AND charged_at < $10))
				AND ((last_at >= $7 AND first_at < $8) OR (last_at >= $9 AND first_at < $10))) t`,
		sq.AccountID, sq.Env, sq.KeyID, sq.Endpoint, hourFrom, hourTo, edges[0], edges[1], edges[2], edges[3]).
		Scan(&st.Calls, &st.Units, &st.USD)
	if err != nil {
		return fmt.Errorf("totals: %w", err)
	}
	// Credits are few: the account's, each charge looked up by its position when the
	// range or the endpoint needs it (a credit has its charge's key and env).
	credits := `SELECT count(*), coalesce(sum(r.units), 0), coalesce(sum(r.usd), 0) FROM credits r
		WHERE r.account_id = $1 AND r.env = $2 AND ($3 = '' OR r.key_id = $3)`
	cargs := args[:3]
	if lo != nil || hi != nil || sq.Endpoint != "" {
		credits += ` AND EXISTS (SELECT 1 FROM charge_lines() WHERE position = r.charge_position AND line = r.charge_line
			AND ` + statementFilter + `)`
		cargs = args
	}
	if err := tx.QueryRow(ctx, credits, cargs...).Scan(&st.Credits, &st.CreditedUnits, &st.CreditedUSD); err != nil {
		return fmt.Errorf("credits: %w", err)
	}
	return nil
}

// rawUsageColumns are the columns of the usage rows that groups' expressions read,
// each once.
func rawUsageColumns(groups []string) string {
	var cols []string
	for _, g := range groups {
		c := map[string]string{"key": "key_id", "hour": "at", "day": "at", "month": "at"}[g]
		if c == "" {
			c = g // endpoint, engine, env, cached
		}
		if !slices.Contains(cols, c) {
			cols = append(cols, c)
		}
	}
	return strings.Join(cols, ", ")
}
