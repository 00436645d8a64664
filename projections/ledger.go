package projections

import (
	"context"

	"github.com/jackc/pgx/v5"

	"chessd/eventstore"
	"chessd/ledger"
)

// Ledger is the charges and ledger_entries read model: one row per charge, and its
// double-entry postings. It is an inline projection (ledger.QueueReadModel): the
// transaction that appends a charge writes its rows, so no subscriber runs for it and
// it is never behind. This type serves what works from the events table alone: the
// rebuild, replay and the set-aside tools. Rows are keyed by the event's position, so
// applying an event twice changes nothing.
type Ledger struct{}

func (Ledger) Name() string  { return "ledger_v1" }
func (Ledger) Topic() string { return "ledger" }
func (Ledger) Tables() []string {
	return []string{"charges", "credits", "ledger_entries", "usage_hours", "usage_key_hours"}
}

// A rebuild loads a chunk's charges, credits and postings with COPY or, carefully, writes
// them with the inline writer's set-based statements; either way not the hourly rollups,
// which it recomputes at its end.
func (Ledger) rebuilder() rebuilder {
	return inlineRebuild{queueRows: ledger.QueueRebuildRows, copyRows: ledger.RebuildCopy}
}

// usage_hours is left as it is until the end of a rebuild: the appends meanwhile add
// to its rows, and would wait for the rebuild to commit on any row it had emptied.
func (Ledger) recomputed() []string { return []string{"usage_hours", "usage_key_hours"} }

// finish recomputes usage_hours from the rebuilt charges and credits, holding the
// chain's head: appends wait for it, not for the whole rebuild.
func (Ledger) finish(ctx context.Context, tx pgx.Tx) error { return ledger.RefreshRollup(ctx, tx) }

// Apply writes one event's rows (the set-aside tools; what an older version left on
// the bus).
func (Ledger) Apply(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	b := &pgx.Batch{}
	if err := ledger.QueueReadModel(b, []eventstore.Event{e}); err != nil {
		return err
	}
	return tx.SendBatch(ctx, b).Close()
}
