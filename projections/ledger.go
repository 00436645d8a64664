package projections

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/ledger"
)

// Ledger maintains the charges and ledger_entries read models: one row per charge, and
// its double-entry postings. Rows are keyed by the event's position, so applying an
// event twice (a rebuild racing the live subscriber) changes nothing.
type Ledger struct{}

func (Ledger) Name() string     { return "ledger_v1" }
func (Ledger) Topic() string    { return "ledger" }
func (Ledger) Tables() []string { return []string{"charges", "ledger_entries"} }

// Apply writes one event at once (rebuilds).
func (l Ledger) Apply(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	b := &pgx.Batch{}
	if err := l.Queue(b, e); err != nil {
		return err
	}
	return tx.SendBatch(ctx, b).Close()
}

// Queue adds the event's rows to b.
func (Ledger) Queue(b *pgx.Batch, e eventstore.Event) error {
	if e.Type != "UnitsCharged" {
		return nil
	}
	ev, err := domain.Decode(e.Type, e.SchemaVersion, e.Payload)
	if err != nil {
		return err
	}
	c := ev.(*ledger.UnitsCharged)
	if !ledger.Balanced(c.Postings) {
		return fmt.Errorf("charge %s at position %d: postings do not balance", c.ChargeID, e.Position)
	}
	params, err := json.Marshal(c.Params)
	if err != nil {
		return err
	}
	b.Queue(`INSERT INTO charges (position, charge_id, request_id, account_id, key_id, env, day, charged_at,
			endpoint, engine, path, cached, units, usd, params)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) ON CONFLICT (position) DO NOTHING`,
		e.Position, c.ChargeID, c.RequestID, c.AccountID, c.KeyID, c.Env, c.Day, c.ChargedAt,
		c.Endpoint, c.Engine, c.Path, c.Cached, c.Units, c.USD, params)
	for i, p := range c.Postings {
		b.Queue(`INSERT INTO ledger_entries (position, line, book, account, currency, debit, credit)
			VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (position, line) DO NOTHING`,
			e.Position, i, p.Book, p.Account, string(p.Currency), p.Debit, p.Credit)
	}
	return nil
}
