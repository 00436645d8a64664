package ledger

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"chessd/domain"
)

// Read-model rows written directly, for benchmarks at a scale (a million charges) no
// benchmark could append events for. Nothing but cmd/chessbench calls these.

// SeedBenchCharges COPYs n charges of account over [from, to), in time order, into the
// charges read model, and credits of some of them into credits: the columns
// QueueReadModel writes for charges of these keys, priced by Quote.
// Their positions lie far past the log's, which these reads never consult. For
// benchmarks at a size no test could append events for (cmd/chessbench -parts usage);
// RefreshRollup and PrepareForReads follow it.
func SeedBenchCharges(ctx context.Context, pool *pgxpool.Pool, account string, keys []string, from, to time.Time, n, credits int) error {
	r := mrand.New(mrand.NewPCG(14, 2026))
	const base = int64(1) << 40
	step := to.Sub(from) / time.Duration(n)
	endpoints := []domain.Endpoint{domain.EndpointEval, domain.EndpointEval, domain.EndpointEval, domain.EndpointBestMove,
		domain.EndpointAnalyze, domain.EndpointBatch}
	id := func(prefix string) string {
		var b [12]byte
		rand.Read(b[:]) //nolint:errcheck // crypto/rand does not fail on Linux
		return prefix + hex.EncodeToString(b[:])
	}
	numeric := func(d decimal.Decimal) pgtype.Numeric {
		return pgtype.Numeric{Int: d.Coefficient(), Exp: d.Exponent(), Valid: true}
	}
	type charge struct {
		pos           int64
		chargeID, key string
		at            time.Time
		units         int64
		usd           decimal.Decimal
	}
	credited := map[int]bool{}
	for len(credited) < credits {
		credited[r.IntN(n)] = true
	}
	var toCredit []charge
	rows := make([][]any, 0, 50_000)
	flush := func() error {
		_, err := pool.CopyFrom(ctx, pgx.Identifier{"charges"}, []string{"position", "charge_id", "request_id", "account_id",
			"key_id", "env", "day", "charged_at", "endpoint", "engine", "path", "cached", "units", "usd", "params"}, pgx.CopyFromRows(rows))
		rows = rows[:0]
		return err
	}
	for i := range n {
		ep := endpoints[r.IntN(len(endpoints))]
		p := Params{Depth: 8 + 2*r.IntN(7), MultiPV: 1, Positions: 1}
		requestID := id("req_")
		if ep == domain.EndpointBatch {
			p.JobID = id("job_")
			requestID = "job:" + p.JobID
		}
		q, err := Quote(domain.Call{Endpoint: ep, Depth: p.Depth, MultiPV: p.MultiPV, Positions: p.Positions})
		if err != nil {
			return err
		}
		cached := r.IntN(10) < 3
		units := q.Charged(cached)
		engine := "sf-17.1"
		if r.IntN(100) < 15 {
			engine = "sf-15.1"
		}
		params, err := json.Marshal(p)
		if err != nil {
			return err
		}
		c := charge{pos: base + int64(i), chargeID: id("chg_"), key: keys[r.IntN(len(keys))],
			at: from.Add(time.Duration(i)*step + time.Duration(r.Int64N(int64(step)))).UTC(), units: units, usd: UnitsUSD(units)}
		rows = append(rows, []any{c.pos, c.chargeID, requestID, account, c.key, "live", c.at.Truncate(24 * time.Hour), c.at,
			string(ep), engine, "native", cached, c.units, numeric(c.usd), string(params)})
		if credited[i] {
			toCredit = append(toCredit, c)
		}
		if len(rows) == cap(rows) {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	for i, c := range toCredit {
		at := c.at.Add(time.Duration(1+r.IntN(48)) * time.Hour)
		rows = append(rows, []any{base + int64(n+i), id("crd_"), c.chargeID, c.pos, account, c.key, "live", c.at.Truncate(24 * time.Hour),
			at, c.units, numeric(c.usd), "benchmark", "ops@example.com", nil})
	}
	_, err := pool.CopyFrom(ctx, pgx.Identifier{"credits"}, []string{"position", "credit_id", "charge_id", "charge_position", "account_id",
		"key_id", "env", "day", "credited_at", "units", "usd", "reason", "actor", "dispute_id"}, pgx.CopyFromRows(rows))
	return err
}

// PrepareForReads leaves the ledger's read tables as a database some time after its
// charges: vacuumed (autovacuum would otherwise work through fresh rows during the
// measurements) and analysed. It returns the account's rows in usage_hours.
func PrepareForReads(ctx context.Context, pool *pgxpool.Pool, account string) (int64, error) {
	if _, err := pool.Exec(ctx, `VACUUM (ANALYZE) charges, credits, usage_hours, usage_key_hours`); err != nil {
		return 0, err
	}
	var hours int64
	err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_hours WHERE account_id = $1`, account).Scan(&hours)
	return hours, err
}

// CountLiveCharges counts the account's live charges: the statement's totals as they
// were summed before the rollup, for comparison.
func CountLiveCharges(ctx context.Context, pool *pgxpool.Pool, account string) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT count(*) FROM charges WHERE account_id = $1 AND env = 'live'`, account).Scan(&n)
	return n, err
}

// ExplainUsage prints the plans of the statement's first page and totals and of
// GET /usage's sums (rollup and exact), at the seeded size.
func ExplainUsage(ctx context.Context, pool *pgxpool.Pool, account string) error {
	show := func(title, sql string, args ...any) error {
		rows, err := pool.Query(ctx, `EXPLAIN (ANALYZE, BUFFERS) `+sql, args...)
		if err != nil {
			return err
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		fmt.Printf("\n%s\n", title)
		for _, l := range lines {
			fmt.Println("    " + l)
		}
		return nil
	}
	if err := show("statement first page", `SELECT position, charge_id, (SELECT r.credit_id FROM credits r WHERE r.charge_position = charges.position)
		FROM charges WHERE account_id = $1 AND env = 'live' AND position > 0 ORDER BY position LIMIT 101`, account); err != nil {
		return err
	}
	if err := show("statement totals from usage_hours", `SELECT sum(calls), sum(units), sum(usd) FROM usage_hours
		WHERE account_id = $1 AND env = 'live' AND hour >= '-infinity' AND hour < 'infinity'`, account); err != nil {
		return err
	}
	if err := show("statement credits (no range)", `SELECT count(*), sum(r.units) FROM credits r
		WHERE r.account_id = $1 AND r.env = 'live'`, account); err != nil {
		return err
	}
	return show("usage by key and day from usage_hours (summed by key and hour first)", `SELECT key_id, to_char(date_trunc('day', at), 'YYYY-MM-DD'), sum(calls), sum(units)
		FROM (SELECT key_id, hour AS at, sum(calls) AS calls, sum(units) AS units FROM usage_hours
			WHERE account_id = $1 AND hour >= now() - interval '30 days' GROUP BY 1, 2) u GROUP BY 1, 2`, account)
}
