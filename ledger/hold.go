package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/shopspring/decimal"

	"chessd/eventstore"
)

// Holds reserve a job's whole price on its key's budget when the job is accepted; each
// analysed position is charged against the hold, and the end of the job releases what
// is left. All three run inside the caller's transaction, with the job's own events.

// Hold reserves units and usd on the key's budget, or returns ErrBudget.
func Hold(ctx context.Context, tx *eventstore.Tx, keyID string, units int64, usd decimal.Decimal) error {
	var outcome string
	if err := tx.QueryRow(ctx, `SELECT ledger_hold($1, $2, $3)`, keyID, units, usd).Scan(&outcome); err != nil {
		return fmt.Errorf("hold: %w", err)
	}
	switch outcome {
	case "ok":
		return nil
	case "budget_units":
		return fmt.Errorf("%w: units", ErrBudget)
	default:
		return fmt.Errorf("%w: usd", ErrBudget)
	}
}

// Release gives back what is left of a hold.
func Release(ctx context.Context, tx *eventstore.Tx, keyID string, units int64, usd decimal.Decimal) error {
	if units <= 0 && !usd.IsPositive() {
		return nil
	}
	_, err := tx.Exec(ctx, `SELECT ledger_release($1, $2, $3)`, keyID, units, usd)
	return err
}

// ChargeHeld charges one call against the key's hold (the budget was reserved; the
// daily allowance is checked here) and appends its UnitsCharged event. ErrAllowance
// when the day's allowance is used up.
func ChargeHeld(ctx context.Context, tx *eventstore.Tx, ch Charge, now time.Time) (*UnitsCharged, error) {
	now = now.UTC().Truncate(time.Microsecond)
	day := now.Format(time.DateOnly)
	k := ch.Key
	var outcome string
	if err := tx.QueryRow(ctx, `SELECT ledger_charge_held($1, $2, $3, $4, $5, $6, $7)`,
		k.ID(), k.AccountID(), k.Env().String(), day, ch.Units, ch.USD, ch.Allowance).Scan(&outcome); err != nil {
		return nil, fmt.Errorf("charge held: %w", err)
	}
	if outcome != "ok" {
		return nil, ErrAllowance
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
