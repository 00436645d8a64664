package commands

import (
	"context"

	"chessd/eventstore"
	"chessd/ledger"
)

// RefundCharges credits charges whole, all or none, with reason, on actor's decision
// (an operator's `chessd refund`): each gets its UnitsCredited, pointing at it, and
// its key's spend and day's allowance use come back. A charge already credited makes
// the whole refund fail (409), as an unknown one does (404).
func (h *Handler) RefundCharges(ctx context.Context, chargeIDs []string, reason, actor, requestID string) ([]*ledger.UnitsCredited, error) {
	var out []*ledger.UnitsCredited
	_, err := h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		out = out[:0]
		if err := ledger.LockCharges(ctx, tx, chargeIDs); err != nil {
			return err
		}
		for _, id := range chargeIDs {
			c, err := ledger.Credit(ctx, tx, ledger.CreditRequest{ChargeID: id, Reason: reason, Actor: actor, RequestID: requestID}, h.now())
			if err != nil {
				return err
			}
			out = append(out, c)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
