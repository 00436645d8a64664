package ledger

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"chessd/eventstore"
	"chessd/postgres"
)

// A ChargesSettled is one row of charge_batches: its key, its sums and the bounds of
// its lines' times and days, by which readers find the batches that may hold a range's
// charges; and its lines summed per hour, endpoint, engine and cached, what the rollups
// add for it (and what filling them again sums): on its own row when its lines are all
// of one such group, as nearly every batch's are, else in charge_batch_hours
// (charge_batch_groups(), migration 0036). The lines themselves are read from the event
// (charge_lines(), migration 0035), so a settled call costs the read model no row of
// its own.

// batchColumns are charge_batches rows, column by column, and the groups of those of
// several groups.
type batchColumns struct {
	pos, units, lines                        []int64
	accountID, keyID, env, firstDay, lastDay []string
	usd                                      []decimal.Decimal
	firstAt, lastAt                          []time.Time
	endpoint, engine                         []*string // the one group's, or nil
	cached                                   []*bool
	roll                                     rollColumns
}

// rollColumns are the groups of batches of several groups (their batch's position:
// its key, account and env are the batch's).
type rollColumns struct {
	pos, calls, units []int64
	endpoint, engine  []string
	hour              []time.Time
	cached            []bool
	usd               []decimal.Decimal
}

// group is a batch's lines of one UTC hour, endpoint, engine and cached.
type group struct {
	hour             time.Time
	endpoint, engine string
	cached           bool
	calls, units     int64
	usd              decimal.Decimal
}

// groupsOf are e's lines summed per group, and the bounds of their times and days.
func groupsOf(e *ChargesSettled) (groups []group, first, last time.Time, firstDay, lastDay string) {
	first, last = e.Lines[0].ChargedAt, e.Lines[0].ChargedAt
	firstDay, lastDay = e.Lines[0].Day, e.Lines[0].Day
	for _, l := range e.Lines {
		first, last = minTime(first, l.ChargedAt), maxTime(last, l.ChargedAt)
		firstDay, lastDay = min(firstDay, l.Day), max(lastDay, l.Day)
		// the hour as PostgreSQL truncates the time it is given (to the microsecond,
		// then to the hour): first_at's, for a batch of one group
		hour := l.ChargedAt.UTC().Truncate(time.Hour)
		i := 0 // few groups: a slice, searched, rather than a map per event
		for i < len(groups) && !(groups[i].hour.Equal(hour) && groups[i].endpoint == l.Endpoint && groups[i].engine == l.Engine &&
			groups[i].cached == l.Cached) {
			i++
		}
		if i == len(groups) {
			groups = append(groups, group{hour: hour, endpoint: l.Endpoint, engine: l.Engine, cached: l.Cached, usd: decimal.Zero})
		}
		g := &groups[i]
		g.calls, g.units, g.usd = g.calls+1, g.units+l.Units, g.usd.Add(l.USD)
	}
	return groups, first, last, firstDay, lastDay
}

func (c *batchColumns) add(pos int64, e *ChargesSettled) {
	groups, first, last, firstDay, lastDay := groupsOf(e)
	c.pos, c.units, c.lines = append(c.pos, pos), append(c.units, e.Units), append(c.lines, int64(len(e.Lines)))
	c.accountID, c.keyID, c.env = append(c.accountID, e.AccountID), append(c.keyID, e.KeyID), append(c.env, e.Env)
	c.firstDay, c.lastDay, c.usd = append(c.firstDay, firstDay), append(c.lastDay, lastDay), append(c.usd, e.USD)
	c.firstAt, c.lastAt = append(c.firstAt, first), append(c.lastAt, last)
	if len(groups) == 1 {
		g := &groups[0]
		c.endpoint, c.engine, c.cached = append(c.endpoint, &g.endpoint), append(c.engine, &g.engine), append(c.cached, &g.cached)
		return
	}
	c.endpoint, c.engine, c.cached = append(c.endpoint, nil), append(c.engine, nil), append(c.cached, nil)
	r := &c.roll
	for _, g := range groups {
		r.pos, r.calls, r.units = append(r.pos, pos), append(r.calls, g.calls), append(r.units, g.units)
		r.endpoint, r.engine, r.hour = append(r.endpoint, g.endpoint), append(r.engine, g.engine), append(r.hour, g.hour)
		r.cached, r.usd = append(r.cached, g.cached), append(r.usd, g.usd)
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// queue adds the batches' insert to b, with the groups of those of several
// (charge_batch_hours) and, with rollup, every batch's groups added to usage_hours and
// usage_key_hours: for the batches inserted now (a batch already there was counted
// when it was). The groups are sorted, so two writers would lock rows in one order.
func (c *batchColumns) queue(b *pgx.Batch, rollup bool) {
	r := &c.roll
	insert := `WITH ins AS (INSERT INTO charge_batches (position, account_id, key_id, env, lines, units, usd, first_at, last_at,
			first_day, last_day, endpoint, engine, cached)
		SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[],
			$7::text[]::numeric[], $8::timestamptz[], $9::timestamptz[], $10::text[]::date[], $11::text[]::date[],
			$12::text[], $13::text[], $14::boolean[])
		ON CONFLICT (position) DO NOTHING
		RETURNING position, account_id, key_id, env, first_at, lines, units, usd, endpoint, engine, cached),
	h AS (SELECT h.pos, ins.account_id, h.hour, ins.key_id, ins.env, h.endpoint, h.engine, h.cached, h.calls, h.units, h.usd
		FROM unnest($15::bigint[], $16::timestamptz[], $17::text[], $18::text[], $19::boolean[], $20::bigint[], $21::bigint[],
			$22::text[]::numeric[]) AS h(pos, hour, endpoint, engine, cached, calls, units, usd)
		JOIN ins ON ins.position = h.pos)`
	hours := `INSERT INTO charge_batch_hours (position, hour, endpoint, engine, cached, calls, units, usd)
		SELECT pos, hour, endpoint, engine, cached, calls, units, usd FROM h`
	if rollup {
		insert += `,
	hours AS (` + hours + `),
	g AS (SELECT account_id, date_trunc('hour', first_at, 'UTC') AS hour, key_id, env, endpoint, engine, cached,
			lines AS calls, units, usd FROM ins WHERE endpoint IS NOT NULL
		UNION ALL SELECT account_id, hour, key_id, env, endpoint, engine, cached, calls, units, usd FROM h),
	rolled AS (` + rollupUpsert + `SELECT account_id, hour, key_id, env, endpoint, engine, cached,
			sum(calls), sum(units), sum(usd), 0, 0, 0
		  FROM g GROUP BY 1, 2, 3, 4, 5, 6, 7 ORDER BY 1, 2, 3, 4, 5, 6, 7` + rollupConflict + `)
	` + keyRollup + `SELECT account_id, hour, key_id, env, sum(calls), sum(units), sum(usd), 0, 0, 0
		  FROM g GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4` + keyConflict
	} else {
		insert += `
	` + hours
	}
	b.Queue(insert, c.pos, c.accountID, c.keyID, c.env, c.lines, c.units, texts(c.usd), c.firstAt, c.lastAt, c.firstDay, c.lastDay,
		c.endpoint, c.engine, c.cached, r.pos, r.hour, r.endpoint, r.engine, r.cached, r.calls, r.units, texts(r.usd))
}

// copyRows are the batches and their hours in COPY's binary format, their columns in
// the tables' order.
func (c *batchColumns) copyRows() ([]eventstore.TableRows, error) {
	cols := []string{"position", "account_id", "key_id", "env", "lines", "units", "usd", "first_at", "last_at",
		"first_day", "last_day", "endpoint", "engine", "cached"}
	batches, err := copyTable("charge_batches", cols, len(c.pos), 180, func(w *postgres.CopyRows, i int) error {
		first, err := day(c.pos[i], c.firstDay[i])
		if err != nil {
			return err
		}
		last, err := day(c.pos[i], c.lastDay[i])
		if err != nil {
			return err
		}
		w.Int8(c.pos[i])
		w.Text(c.accountID[i])
		w.Text(c.keyID[i])
		w.Text(c.env[i])
		w.Int8(c.lines[i])
		w.Int8(c.units[i])
		if err := w.Numeric(c.usd[i]); err != nil {
			return fmt.Errorf("position %d: %w", c.pos[i], err)
		}
		w.Timestamptz(c.firstAt[i])
		w.Timestamptz(c.lastAt[i])
		w.Date(first)
		w.Date(last)
		if c.endpoint[i] == nil {
			w.Null()
			w.Null()
			w.Null()
		} else {
			w.Text(*c.endpoint[i])
			w.Text(*c.engine[i])
			w.Bool(*c.cached[i])
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	r := &c.roll
	if len(r.pos) == 0 {
		return []eventstore.TableRows{batches}, nil
	}
	cols = []string{"position", "hour", "endpoint", "engine", "cached", "calls", "units", "usd"}
	hours, err := copyTable("charge_batch_hours", cols, len(r.pos), 80, func(w *postgres.CopyRows, i int) error {
		w.Int8(r.pos[i])
		w.Timestamptz(r.hour[i])
		w.Text(r.endpoint[i])
		w.Text(r.engine[i])
		w.Bool(r.cached[i])
		w.Int8(r.calls[i])
		w.Int8(r.units[i])
		if err := w.Numeric(r.usd[i]); err != nil {
			return fmt.Errorf("position %d: %w", r.pos[i], err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return []eventstore.TableRows{batches, hours}, nil
}
