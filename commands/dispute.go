package commands

import (
	"context"

	"chessd/eventstore"
	"chessd/ledger"
)

// OpenDispute opens a dispute of the actor's account on charges of its env.
func (h *Handler) OpenDispute(ctx context.Context, actor Actor, chargeIDs []string, reason string) (*ledger.DisputeOpened, error) {
	var out *ledger.DisputeOpened
	_, err := h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) (err error) {
		out, err = ledger.OpenDispute(ctx, tx, actor.Key, chargeIDs, reason, actor.RequestID, h.now())
		return err
	})
	return out, err
}

// ResolveDispute accepts (crediting every charge of it) or rejects an open dispute, on
// by's decision, with a note or reason the customer sees (operators: `chessd dispute`).
func (h *Handler) ResolveDispute(ctx context.Context, disputeID string, accept bool, by, note, requestID string) error {
	_, err := h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		return ledger.ResolveDispute(ctx, tx, disputeID, accept, by, note, requestID, h.now())
	})
	return err
}
