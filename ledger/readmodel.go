package ledger

import (
	"fmt"
	"time"

	gojson "github.com/goccy/go-json"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/postgres"
)

// The ledger's read model, what GET /usage, GET /me and the set-aside tools read:
// charge_batches (one row per ChargesSettled, whose lines are read from the event:
// readmodel_batches.go), charges (one row per UnitsCharged) and credits (one per
// credited charge), keyed by the event's position, and usage_hours, their hourly rollup
// (rollup.go); charge_lines() is every charge, one row each. Their double-entry
// postings stay in the events alone: ledger_entries is a view of them (migration
// 0032), so the books are checked against the log. It is an inline projection: the transaction
// that appends a charge writes its rows too (the settler's group commit, a job's
// position), so it is never behind the log and the charge costs no bus message.
// projections.Ledger rebuilds it from the events with the same code.
func init() {
	eventstore.RegisterInline(eventstore.TopicOf(StreamLedger), QueueReadModel)
}

// QueueReadModel queues the read-model rows of evs (events of ledger streams, their
// positions known) on b: a statement per table, however many charges. A charge whose
// postings do not balance is refused, and with it the transaction that would append
// it. Rows are keyed by position, so queueing an event twice (a rebuild, a replay)
// changes nothing: usage_hours, the hourly rollup, adds only the rows its statement
// inserted.
func QueueReadModel(b *pgx.Batch, evs []eventstore.Event) error { return queueReadModel(b, evs, true) }

// QueueRebuildRows is QueueReadModel without the rollups, for a rebuild, which fills
// them from the rebuilt charges and credits once they are loaded (FillRollup into its
// copies, RefreshRollup in place) and adds later charges' with QueueReadModel.
func QueueRebuildRows(b *pgx.Batch, evs []eventstore.Event) error {
	return queueReadModel(b, evs, false)
}

func queueReadModel(b *pgx.Batch, evs []eventstore.Event, rollup bool) error {
	rm, err := readModelOf(evs)
	if err != nil {
		return err
	}
	if len(rm.charges.pos) > 0 {
		rm.charges.queue(b, rollup)
	}
	if len(rm.batches.pos) > 0 {
		rm.batches.queue(b, rollup)
	}
	if len(rm.credits.pos) > 0 { // after the charges: a credit's rollup row is its charge's
		rm.credits.queue(b, rollup)
	}
	return nil
}

// RebuildCopy is the read-model rows of evs (charges and credits; not the rollups, see
// QueueRebuildRows) for COPY into empty tables: the fast way to rebuild.
// It refuses what QueueReadModel refuses.
func RebuildCopy(evs []eventstore.Event) ([]eventstore.TableRows, error) {
	rm, err := readModelOf(evs)
	if err != nil {
		return nil, err
	}
	var out []eventstore.TableRows
	if len(rm.charges.pos) > 0 {
		rows, err := rm.charges.copyRows()
		if err != nil {
			return nil, err
		}
		out = append(out, rows)
	}
	if len(rm.batches.pos) > 0 {
		rows, err := rm.batches.copyRows()
		if err != nil {
			return nil, err
		}
		out = append(out, rows...)
	}
	if len(rm.credits.pos) > 0 {
		rows, err := rm.credits.copyRows()
		if err != nil {
			return nil, err
		}
		out = append(out, rows)
	}
	return out, nil
}

// readModel is the rows of some ledger events, column by column.
type readModel struct {
	charges chargeColumns
	batches batchColumns
	credits creditColumns
}

func readModelOf(evs []eventstore.Event) (*readModel, error) {
	rm := &readModel{}
	for i := range evs {
		ev := &evs[i]
		if ev.Type != "UnitsCharged" && ev.Type != "ChargesSettled" && ev.Type != "UnitsCredited" {
			continue
		}
		v := ev.Value()
		if v == nil { // read back from the log (a rebuild)
			d, err := domain.Decode(ev.Type, ev.SchemaVersion, ev.Payload)
			if err != nil {
				return nil, fmt.Errorf("position %d: %w", ev.Position, err)
			}
			v = d
		}
		var postings []Posting
		switch x := v.(type) {
		case *UnitsCharged:
			if err := rm.charges.add(ev.Position, x); err != nil {
				return nil, err
			}
			postings = x.Postings
		case *ChargesSettled: // its postings are checked to be its lines' charge, balanced
			if err := x.check(); err != nil {
				return nil, fmt.Errorf("ChargesSettled at position %d: %w", ev.Position, err)
			}
			rm.batches.add(ev.Position, x)
			continue
		case *UnitsCredited:
			rm.credits.add(ev.Position, x)
			postings = x.Postings
		default:
			return nil, fmt.Errorf("position %d: %s decodes to %T", ev.Position, ev.Type, v)
		}
		if !Balanced(postings) {
			return nil, fmt.Errorf("%s at position %d: postings do not balance", ev.Type, ev.Position)
		}
	}
	return rm, nil
}

// keyRollup adds rows to usage_key_hours (aliased u), the narrower rollup per key and
// hour (migration 0025): a SELECT grouped by 1, 2, 3, 4 (account, hour, key, env) and
// ordered so, then keyConflict.
const keyRollup = `INSERT INTO usage_key_hours AS u (account_id, hour, key_id, env,
		calls, units, usd, credits, credited_units, credited_usd) `
const keyConflict = ` ON CONFLICT (account_id, hour, key_id, env) DO UPDATE SET
		calls = u.calls + excluded.calls, units = u.units + excluded.units, usd = u.usd + excluded.usd,
		credits = u.credits + excluded.credits, credited_units = u.credited_units + excluded.credited_units,
		credited_usd = u.credited_usd + excluded.credited_usd`

// rollupUpsert adds rows to usage_hours (aliased u), each combination once.
const rollupUpsert = `INSERT INTO usage_hours AS u (account_id, hour, key_id, env, endpoint, engine, cached,
		calls, units, usd, credits, credited_units, credited_usd) `
const rollupConflict = ` ON CONFLICT (account_id, hour, key_id, env, endpoint, engine, cached) DO UPDATE SET
		calls = u.calls + excluded.calls, units = u.units + excluded.units, usd = u.usd + excluded.usd,
		credits = u.credits + excluded.credits, credited_units = u.credited_units + excluded.credited_units,
		credited_usd = u.credited_usd + excluded.credited_usd`

// queue adds the charges' insert to b and, with rollup, their hours in usage_hours
// (those inserted now: a charge already there was counted when it was). The groups
// are sorted, so two writers would lock rows in one order.
func (c *chargeColumns) queue(b *pgx.Batch, rollup bool) {
	insert := `INSERT INTO charges (position, charge_id, request_id, account_id, key_id, env, day, charged_at,
			endpoint, engine, path, cached, units, usd, params)
		SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
			$7::text[]::date[], $8::timestamptz[], $9::text[], $10::text[], $11::text[], $12::boolean[],
			$13::bigint[], $14::text[]::numeric[], $15::text[]::json[])
		ON CONFLICT (position) DO NOTHING`
	if rollup {
		insert = `WITH ins AS (` + insert + `
			RETURNING account_id, charged_at, key_id, env, endpoint, engine, cached, units, usd),
		rolled AS (` + rollupUpsert + `SELECT account_id, date_trunc('hour', charged_at, 'UTC'), key_id, env, endpoint, engine, cached,
			count(*), sum(units), sum(usd), 0, 0, 0
		  FROM ins GROUP BY 1, 2, 3, 4, 5, 6, 7 ORDER BY 1, 2, 3, 4, 5, 6, 7` + rollupConflict + `)
		` + keyRollup + `SELECT account_id, date_trunc('hour', charged_at, 'UTC'), key_id, env, count(*), sum(units), sum(usd), 0, 0, 0
		  FROM ins GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4` + keyConflict
	}
	b.Queue(insert, c.pos, c.chargeID, c.requestID, c.accountID, c.keyID, c.env, c.day, c.chargedAt,
		c.endpoint, c.engine, c.path, c.cached, c.units, texts(c.usd), c.params)
}

// queue adds the credits' insert to b and, with rollup, their hours in usage_hours,
// under their charges' key, env, endpoint, engine and cached.
func (cr *creditColumns) queue(b *pgx.Batch, rollup bool) {
	insert := `INSERT INTO credits (position, credit_id, charge_id, charge_position, account_id, key_id, env, day,
				credited_at, units, usd, reason, actor, dispute_id, charge_line)
			SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[],
				$8::text[]::date[], $9::timestamptz[], $10::bigint[], $11::text[]::numeric[], $12::text[], $13::text[], $14::text[],
				$15::int[])
			ON CONFLICT (position) DO NOTHING`
	if rollup {
		insert = `WITH ins AS (` + insert + `
			RETURNING charge_position, charge_line, credited_at, units, usd, account_id, key_id, env),
		rolled AS (` + rollupUpsert + `SELECT c.account_id, date_trunc('hour', ins.credited_at, 'UTC'), c.key_id, c.env, c.endpoint,
			c.engine, c.cached, 0, 0, 0, count(*), sum(ins.units), sum(ins.usd)
		  FROM ins JOIN charge_lines() c ON c.position = ins.charge_position AND c.line = ins.charge_line
		 GROUP BY 1, 2, 3, 4, 5, 6, 7 ORDER BY 1, 2, 3, 4, 5, 6, 7` + rollupConflict + `)
		` + keyRollup + `SELECT account_id, date_trunc('hour', credited_at, 'UTC'), key_id, env, 0, 0, 0, count(*), sum(units), sum(usd)
		  FROM ins GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4` + keyConflict
	}
	b.Queue(insert, cr.pos, cr.creditID, cr.chargeID, cr.chargePos, cr.accountID, cr.keyID, cr.env, cr.day,
		cr.creditedAt, cr.units, texts(cr.usd), cr.reason, cr.actor, cr.disputeID, cr.chargeLine)
}

// creditColumns are credits rows, column by column.
type creditColumns struct {
	pos, chargePos, units                                  []int64
	creditID, chargeID, accountID, keyID, env, day, reason []string
	actor                                                  []string
	usd                                                    []decimal.Decimal
	disputeID                                              []*string
	creditedAt                                             []time.Time
	chargeLine                                             []int32
}

func (c *creditColumns) add(pos int64, cr *UnitsCredited) {
	var dispute *string
	if cr.DisputeID != "" {
		dispute = &cr.DisputeID
	}
	c.pos, c.chargePos, c.units = append(c.pos, pos), append(c.chargePos, cr.ChargePosition), append(c.units, cr.Units)
	c.creditID, c.chargeID = append(c.creditID, cr.CreditID), append(c.chargeID, cr.ChargeID)
	c.accountID, c.keyID, c.env, c.day = append(c.accountID, cr.AccountID), append(c.keyID, cr.KeyID), append(c.env, cr.Env), append(c.day, cr.Day)
	c.usd, c.reason, c.actor = append(c.usd, cr.USD), append(c.reason, cr.Reason), append(c.actor, cr.Actor)
	c.disputeID, c.creditedAt = append(c.disputeID, dispute), append(c.creditedAt, cr.CreditedAt)
	c.chargeLine = append(c.chargeLine, int32(cr.ChargeLine))
}

// chargeColumns are charges rows, column by column (one array parameter each).
type chargeColumns struct {
	pos, units                                      []int64
	chargeID, requestID, accountID, keyID, env, day []string
	endpoint, engine, path, params                  []string
	usd                                             []decimal.Decimal
	chargedAt                                       []time.Time
	cached                                          []bool
}

func (c *chargeColumns) add(pos int64, ch *UnitsCharged) error {
	// goccy/go-json writes what encoding/json does, faster: a rebuild writes every
	// charge's parameters again
	params, err := gojson.Marshal(ch.Params)
	if err != nil {
		return fmt.Errorf("position %d: %w", pos, err)
	}
	c.pos, c.units = append(c.pos, pos), append(c.units, ch.Units)
	c.chargeID, c.requestID = append(c.chargeID, ch.ChargeID), append(c.requestID, ch.RequestID)
	c.accountID, c.keyID = append(c.accountID, ch.AccountID), append(c.keyID, ch.KeyID)
	c.env, c.day = append(c.env, ch.Env), append(c.day, ch.Day)
	c.endpoint, c.engine, c.path = append(c.endpoint, ch.Endpoint), append(c.engine, ch.Engine), append(c.path, ch.Path)
	c.usd, c.params = append(c.usd, ch.USD), append(c.params, string(params))
	c.chargedAt, c.cached = append(c.chargedAt, ch.ChargedAt), append(c.cached, ch.Cached)
	return nil
}

// texts are ds as the text of numeric array parameters.
func texts(ds []decimal.Decimal) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.String()
	}
	return out
}

// day is a UTC day as COPY reads it; a day that is not one refuses the rows (the
// rebuild then finds the event at fault the careful way).
func day(pos int64, text string) (time.Time, error) {
	t, err := time.Parse(time.DateOnly, text)
	if err != nil {
		return time.Time{}, fmt.Errorf("position %d: day %q is not a date", pos, text)
	}
	return t, nil
}

// copyRows are the charges in COPY's binary format, their columns in the table's order.
func (c *chargeColumns) copyRows() (eventstore.TableRows, error) {
	cols := []string{"position", "charge_id", "request_id", "account_id", "key_id", "env", "day", "charged_at",
		"endpoint", "engine", "path", "cached", "units", "usd", "params"}
	return copyTable("charges", cols, len(c.pos), 400, func(w *postgres.CopyRows, i int) error {
		d, err := day(c.pos[i], c.day[i])
		if err != nil {
			return err
		}
		w.Int8(c.pos[i])
		w.Text(c.chargeID[i])
		w.Text(c.requestID[i])
		w.Text(c.accountID[i])
		w.Text(c.keyID[i])
		w.Text(c.env[i])
		w.Date(d)
		w.Timestamptz(c.chargedAt[i])
		w.Text(c.endpoint[i])
		w.Text(c.engine[i])
		w.Text(c.path[i])
		w.Bool(c.cached[i])
		w.Int8(c.units[i])
		if err := w.Numeric(c.usd[i]); err != nil {
			return fmt.Errorf("position %d: %w", c.pos[i], err)
		}
		w.Text(c.params[i])
		return nil
	})
}

// copyRows are the credits in COPY's binary format, their columns in the table's order.
func (c *creditColumns) copyRows() (eventstore.TableRows, error) {
	cols := []string{"position", "credit_id", "charge_id", "charge_position", "account_id", "key_id", "env", "day",
		"credited_at", "units", "usd", "reason", "actor", "dispute_id", "charge_line"}
	return copyTable("credits", cols, len(c.pos), 250, func(w *postgres.CopyRows, i int) error {
		d, err := day(c.pos[i], c.day[i])
		if err != nil {
			return err
		}
		w.Int8(c.pos[i])
		w.Text(c.creditID[i])
		w.Text(c.chargeID[i])
		w.Int8(c.chargePos[i])
		w.Text(c.accountID[i])
		w.Text(c.keyID[i])
		w.Text(c.env[i])
		w.Date(d)
		w.Timestamptz(c.creditedAt[i])
		w.Int8(c.units[i])
		if err := w.Numeric(c.usd[i]); err != nil {
			return fmt.Errorf("position %d: %w", c.pos[i], err)
		}
		w.Text(c.reason[i])
		w.Text(c.actor[i])
		if c.disputeID[i] == nil {
			w.Null()
		} else {
			w.Text(*c.disputeID[i])
		}
		w.Int4(c.chargeLine[i])
		return nil
	})
}

// copyTable writes n rows of cols with row, which writes row i's fields in cols'
// order; size guesses a row's bytes.
func copyTable(table string, cols []string, n, size int, row func(w *postgres.CopyRows, i int) error) (eventstore.TableRows, error) {
	w := postgres.NewCopyRows(n * size)
	for i := range n {
		w.Row(len(cols))
		if err := row(w, i); err != nil {
			return eventstore.TableRows{}, err
		}
	}
	return eventstore.TableRows{Table: table, Columns: cols, Rows: w.Bytes(), N: w.Rows()}, nil
}
