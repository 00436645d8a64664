package projections

import (
	"context"

	"github.com/jackc/pgx/v5"

	"chessd/eventstore"
	"chessd/ledger"
)

// Disputes is the disputes read model. Like the ledger's it is inline
// (ledger.QueueDisputes, written with the events); this type serves the rebuild,
// replay and the set-aside tools.
type Disputes struct{}

func (Disputes) Name() string     { return "disputes_v1" }
func (Disputes) Topic() string    { return "disputes" }
func (Disputes) Tables() []string { return []string{"disputes"} }

func (Disputes) rebuilder() rebuilder { return inlineRebuild{queueRows: ledger.QueueDisputes} }

// Apply writes one event's rows.
func (Disputes) Apply(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	b := &pgx.Batch{}
	if err := ledger.QueueDisputes(b, []eventstore.Event{e}); err != nil {
		return err
	}
	return tx.SendBatch(ctx, b).Close()
}
