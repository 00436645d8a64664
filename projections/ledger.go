package projections

import (
	"context"
	"slices"

	"github.com/jackc/pgx/v5"

	"chessd/eventstore"
	"chessd/ledger"
)

// Ledger is the charges and credits read model: one row per ChargesSettled (its lines
// stay in the event), per UnitsCharged and per credit (their double-entry postings stay
// in the events: ledger_entries is a view of them).
// It is an inline projection (ledger.QueueReadModel): the transaction that appends a
// charge writes its rows, so no subscriber runs for it and it is never behind. This
// type serves what works from the events table alone: the rebuild, replay and the
// set-aside tools. Rows are keyed by the event's position, so applying an event twice
// changes nothing.
type Ledger struct{}

func (Ledger) Name() string     { return "ledger_v1" }
func (Ledger) Topic() string    { return "ledger" }
func (Ledger) Tables() []string { return slices.Clone(ledger.ReadModelTables) }

// A rebuild loads a chunk's charges and credits with COPY or, carefully, writes
// them with the inline writer's set-based statements; either way not the hourly rollups,
// which fill computes from them.
func (Ledger) rebuilder() rebuilder {
	return inlineRebuild{queueRows: ledger.QueueRebuildRows, copyRows: ledger.RebuildCopy}
}

// The rollups are filled from the rebuilt charges and credits once those are loaded:
// into the shadow's copies while the appends go on, or in place holding the chain's head
// (the appends would otherwise add to rows the rebuild had emptied).
func (Ledger) recomputed() []string { return []string{"usage_hours", "usage_key_hours"} }

func (Ledger) fill(ctx context.Context, tx pgx.Tx, fresh bool) error {
	if fresh {
		return ledger.FillRollup(ctx, tx)
	}
	return ledger.RefreshRollup(ctx, tx)
}

// What was appended after the fill adds to the rollups as the appends themselves do.
func (Ledger) tail() rebuilder { return inlineRebuild{queueRows: ledger.QueueReadModel} }

// Apply writes one event's rows (the set-aside tools; what an older version left on
// the bus).
func (Ledger) Apply(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	b := &pgx.Batch{}
	if err := ledger.QueueReadModel(b, []eventstore.Event{e}); err != nil {
		return err
	}
	return tx.SendBatch(ctx, b).Close()
}
