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

// ChargeHeld charges analysed positions of a job against the job's hold, drawn on day,
// in one settle, and appends their UnitsCharged events: one line item each, as for any
// call, whose rows in the ledger's read model are written when tx commits
// (QueueReadModel). The events come back in the order of chs.
func ChargeHeld(ctx context.Context, tx *eventstore.Tx, jobID, day string, chs []Charge, now time.Time) ([]*UnitsCharged, error) {
	if len(chs) == 0 {
		return nil, nil
	}
	now = now.UTC().Truncate(time.Microsecond)
	units := make([]int64, len(chs))
	for i, ch := range chs {
		units[i] = ch.Units
	}
	none := make([]*string, len(chs)) // no Idempotency-Key: the job's own claim covers it
	var kept []bool
	if err := tx.QueryRow(ctx, `SELECT meter_settle($1, $2, $3, $4, $4, $5, $6, $7, $8, false)`,
		holdLease(jobID), holdOwner(jobID), units, none, make([]*int32, len(chs)), make([][]byte, len(chs)),
		UnitPriceUSD, now).Scan(&kept); err != nil {
		return nil, fmt.Errorf("charge held: %w", err)
	}
	if len(kept) != len(chs) {
		return nil, fmt.Errorf("charge held: %d outcomes for %d positions", len(kept), len(chs))
	}
	for _, k := range kept {
		if !k {
			// the hold covers the whole job at the fresh price: this cannot happen
			// unless the job charged more than it held
			return nil, fmt.Errorf("charge held: the hold of job %s does not cover %d positions' units %v", jobID, len(units), units)
		}
	}
	out := make([]*UnitsCharged, len(chs))
	evs := make([]eventstore.New, len(chs))
	for i, ch := range chs {
		e, err := chargeEvent(ch, now, day)
		if err != nil {
			return nil, err
		}
		out[i] = e
		evs[i] = eventstore.New{Type: e.EventType(), SchemaVersion: 1, Payload: e,
			Meta: &eventstore.Metadata{RequestID: ch.RequestID, AccountID: e.AccountID, KeyID: e.KeyID}}
	}
	// one key's job: one ledger stream
	if err := tx.Append(ctx, Stream(out[0].KeyID), StreamLedger, eventstore.AnyVersion, eventstore.Metadata{}, evs...); err != nil {
		return nil, err
	}
	return out, nil
}
