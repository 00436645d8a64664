package ledger

import (
	"context"
	"fmt"
	"time"

	"chessd/domain"
	"chessd/eventstore"
)

// A job's hold is a lease owned by the job (the same reservation as a server's, made by
// the same budget rule, meter_lease): its whole price is reserved against the key's
// budgets and the account's daily allowance of the day it is accepted, each analysed
// position is settled against it in the transaction that records the position, and the
// end of the job gives back what is left. All three run inside the caller's
// transaction, with the job's own events.

// holdLease names a job's hold, and holdOwner its owner.
func holdLease(jobID string) string { return "hold_" + jobID }
func holdOwner(jobID string) string { return "job:" + jobID }

// jobHoldTTL: a job's hold does not expire; the job's end releases it.
const jobHoldTTL = 100 * 365 * 24 * time.Hour

// HoldJob reserves a job's whole price (units) for key on day (the UTC date of the
// allowance it draws on), or returns a refusal (*Refusal: budget or allowance).
func HoldJob(ctx context.Context, tx *eventstore.Tx, jobID string, key *domain.Key, allowance int64, day string, units int64) error {
	var outcome string
	var granted int64
	err := tx.QueryRow(ctx, `SELECT outcome, granted FROM meter_lease($1, $2, $3, $4, $5, $6, $7, $7, $8, $9, $10)`,
		holdLease(jobID), holdOwner(jobID), key.ID(), key.AccountID(), key.Env().String(), day, units,
		UnitPriceUSD, allowance, jobHoldTTL).Scan(&outcome, &granted)
	if err != nil {
		return fmt.Errorf("hold: %w", err)
	}
	if outcome != OutcomeOK {
		return refusal(outcome)
	}
	return nil
}

// ReleaseHold gives back what is left of a job's hold.
func ReleaseHold(ctx context.Context, tx *eventstore.Tx, jobID string) error {
	if _, err := tx.Exec(ctx, `SELECT meter_release($1, $2, $3)`, holdLease(jobID), holdOwner(jobID), UnitPriceUSD); err != nil {
		return fmt.Errorf("release hold: %w", err)
	}
	return nil
}

// ChargeHeld charges one analysed position of a job against the job's hold, drawn on
// day, and appends its UnitsCharged event: one line item, as for any call, whose rows
// in the ledger's read model are written when tx commits (QueueReadModel).
func ChargeHeld(ctx context.Context, tx *eventstore.Tx, jobID, day string, ch Charge, now time.Time) (*UnitsCharged, error) {
	now = now.UTC().Truncate(time.Microsecond)
	var kept []bool
	if err := tx.QueryRow(ctx, `SELECT meter_settle($1, $2, $3, $4, $4, $5, $6, $7, $8, false)`,
		holdLease(jobID), holdOwner(jobID), []int64{ch.Units}, []*string{nil}, []*int32{nil}, [][]byte{nil},
		UnitPriceUSD, now).Scan(&kept); err != nil {
		return nil, fmt.Errorf("charge held: %w", err)
	}
	if len(kept) != 1 || !kept[0] {
		// the hold covers the whole job at the fresh price: this cannot happen unless
		// the job charged more than it held
		return nil, fmt.Errorf("charge held: the hold of job %s does not cover %d units", jobID, ch.Units)
	}
	e, err := chargeEvent(ch, now, day)
	if err != nil {
		return nil, err
	}
	md := eventstore.Metadata{RequestID: ch.RequestID, AccountID: e.AccountID, KeyID: e.KeyID}
	if err := tx.Append(ctx, Stream(e.KeyID), StreamLedger, eventstore.AnyVersion, md,
		eventstore.New{Type: e.EventType(), SchemaVersion: 1, Payload: e}); err != nil {
		return nil, err
	}
	return e, nil
}
