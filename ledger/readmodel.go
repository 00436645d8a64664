package ledger

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"chessd/domain"
	"chessd/eventstore"
)

// The ledger's read model, what GET /usage, GET /me and the set-aside tools read:
// charges (one row per charge) and ledger_entries (its double-entry postings), keyed
// by the UnitsCharged event's position. It is an inline projection: the transaction
// that appends a charge writes its rows too (the settler's group commit, a job's
// position), so it is never behind the log and the charge costs no bus message.
// projections.Ledger rebuilds it from the events with the same code.
func init() {
	eventstore.RegisterInline(eventstore.TopicOf(StreamLedger), QueueReadModel)
}

// QueueReadModel queues the read-model rows of evs (events of ledger streams, their
// positions known) on b: two statements, however many charges. A charge whose postings
// do not balance is refused, and with it the transaction that would append it. Rows
// are keyed by position, so queueing an event twice (a rebuild, a replay) changes
// nothing.
func QueueReadModel(b *pgx.Batch, evs []eventstore.Event) error {
	var c chargeColumns
	var e entryColumns
	for i := range evs {
		ev := &evs[i]
		if ev.Type != "UnitsCharged" {
			continue
		}
		ch, ok := ev.Value().(*UnitsCharged)
		if !ok { // read back from the log (a rebuild)
			d, err := domain.Decode(ev.Type, ev.SchemaVersion, ev.Payload)
			if err != nil {
				return fmt.Errorf("position %d: %w", ev.Position, err)
			}
			if ch, ok = d.(*UnitsCharged); !ok {
				return fmt.Errorf("position %d: %s decodes to %T", ev.Position, ev.Type, d)
			}
		}
		if !Balanced(ch.Postings) {
			return fmt.Errorf("charge %s at position %d: postings do not balance", ch.ChargeID, ev.Position)
		}
		if err := c.add(ev.Position, ch); err != nil {
			return err
		}
		for line, p := range ch.Postings {
			e.add(ev.Position, line, p)
		}
	}
	if len(c.pos) == 0 {
		return nil
	}
	b.Queue(`INSERT INTO charges (position, charge_id, request_id, account_id, key_id, env, day, charged_at,
			endpoint, engine, path, cached, units, usd, params)
		SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
			$7::text[]::date[], $8::timestamptz[], $9::text[], $10::text[], $11::text[], $12::boolean[],
			$13::bigint[], $14::text[]::numeric[], $15::text[]::json[])
		ON CONFLICT (position) DO NOTHING`,
		c.pos, c.chargeID, c.requestID, c.accountID, c.keyID, c.env, c.day, c.chargedAt,
		c.endpoint, c.engine, c.path, c.cached, c.units, c.usd, c.params)
	if len(e.pos) > 0 {
		b.Queue(`INSERT INTO ledger_entries (position, line, book, account, currency, debit, credit)
			SELECT * FROM unnest($1::bigint[], $2::int[], $3::text[], $4::text[], $5::text[],
				$6::text[]::numeric[], $7::text[]::numeric[])
			ON CONFLICT (position, line) DO NOTHING`,
			e.pos, e.line, e.book, e.account, e.currency, e.debit, e.credit)
	}
	return nil
}

// chargeColumns are charges rows, column by column (one array parameter each).
type chargeColumns struct {
	pos, units                                      []int64
	chargeID, requestID, accountID, keyID, env, day []string
	endpoint, engine, path, usd, params             []string
	chargedAt                                       []time.Time
	cached                                          []bool
}

func (c *chargeColumns) add(pos int64, ch *UnitsCharged) error {
	params, err := json.Marshal(ch.Params)
	if err != nil {
		return fmt.Errorf("position %d: %w", pos, err)
	}
	c.pos, c.units = append(c.pos, pos), append(c.units, ch.Units)
	c.chargeID, c.requestID = append(c.chargeID, ch.ChargeID), append(c.requestID, ch.RequestID)
	c.accountID, c.keyID = append(c.accountID, ch.AccountID), append(c.keyID, ch.KeyID)
	c.env, c.day = append(c.env, ch.Env), append(c.day, ch.Day)
	c.endpoint, c.engine, c.path = append(c.endpoint, ch.Endpoint), append(c.engine, ch.Engine), append(c.path, ch.Path)
	c.usd, c.params = append(c.usd, ch.USD.String()), append(c.params, string(params))
	c.chargedAt, c.cached = append(c.chargedAt, ch.ChargedAt), append(c.cached, ch.Cached)
	return nil
}

// entryColumns are ledger_entries rows, column by column.
type entryColumns struct {
	pos                                    []int64
	line                                   []int32
	book, account, currency, debit, credit []string
}

func (e *entryColumns) add(pos int64, line int, p Posting) {
	e.pos, e.line = append(e.pos, pos), append(e.line, int32(line))
	e.book, e.account, e.currency = append(e.book, p.Book), append(e.account, p.Account), append(e.currency, string(p.Currency))
	e.debit, e.credit = append(e.debit, p.Debit.String()), append(e.credit, p.Credit.String())
}
