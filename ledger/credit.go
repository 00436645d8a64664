package ledger

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/postgres"
)

// UnitsCredited gives back one charge whole: the reversing transaction of its
// postings, on the same key's ledger stream, pointing at the charge. Nothing is edited
// or deleted; the key's spend and the day's allowance use go down by what was charged.
type UnitsCredited struct {
	CreditID       string          `json:"credit_id"`
	ChargeID       string          `json:"charge_id"`
	ChargePosition int64           `json:"charge_position"`       // the UnitsCharged or ChargesSettled event
	ChargeLine     int             `json:"charge_line,omitempty"` // the line of a ChargesSettled
	AccountID      string          `json:"account_id"`
	KeyID          string          `json:"key_id"`
	Env            string          `json:"env"`
	Day            string          `json:"day"` // the charge's allowance day
	CreditedAt     time.Time       `json:"credited_at"`
	Units          int64           `json:"units"`
	USD            decimal.Decimal `json:"usd"`
	Reason         string          `json:"reason"`
	Actor          string          `json:"actor"` // who decided it: an operator, a dispute's resolution
	DisputeID      string          `json:"dispute_id,omitempty"`
	Postings       []Posting       `json:"postings"`
}

func (*UnitsCredited) EventType() string { return "UnitsCredited" }

func init() {
	domain.RegisterEvent("UnitsCredited", func() domain.Event { return &UnitsCredited{} })
}

// CreditTransaction reverses ChargeTransaction: the units go back to the allowance and
// their USD value back to revenue, from the key's account.
func CreditTransaction(accountID, env, keyID string, units int64, usd decimal.Decimal) (Transaction, error) {
	var moves []Move
	if units > 0 {
		moves = append(moves, Move{From: KeyAccount(keyID), To: AccountAllowance, Currency: Units, Amount: decimal.NewFromInt(units)})
	}
	if usd.IsPositive() {
		moves = append(moves, Move{From: KeyAccount(keyID), To: AccountRevenue, Currency: USD, Amount: usd})
	}
	return NewTransaction(Book(accountID, env), moves...)
}

// CreditRequest says which charge to credit, why and on whose decision.
type CreditRequest struct {
	ChargeID  string
	AccountID string // when set, the charge must be this account's (a dispute's)
	Reason    string
	Actor     string
	DisputeID string
	RequestID string
}

// LockCharges takes each charge's lock for the rest of tx, in one order whatever the
// caller's (sorted: no deadlock between two callers), so that a refund and a dispute of
// one charge never interleave and the second to commit sees the first: a refund of a
// charge in an open dispute is refused, and so is a dispute of a credited charge.
// Taking a lock again in the same transaction is free.
func LockCharges(ctx context.Context, tx *eventstore.Tx, chargeIDs []string) error {
	for _, id := range slices.Sorted(slices.Values(chargeIDs)) {
		if err := postgres.LockXact(ctx, tx, "charge:"+id, false); err != nil {
			return err
		}
	}
	return nil
}

// Credit credits one charge inside tx: its UnitsCredited event, and the key's spend
// and the day's allowance use given back. A charge is credited once (409 the second
// time); an unknown charge (or another account's) is 404.
func Credit(ctx context.Context, tx *eventstore.Tx, req CreditRequest, now time.Time) (*UnitsCredited, error) {
	if req.Reason == "" {
		return nil, domain.Invalid("reason", "is required: it is kept with the credit and shown to the customer")
	}
	var c UnitsCredited
	var day, chargedAt time.Time
	err := tx.QueryRow(ctx, `SELECT position, line, account_id, key_id, env, day, units, usd, charged_at
		FROM charge_lines() WHERE `+chargeByID, chargeIDArgs(req.ChargeID)...).
		Scan(&c.ChargePosition, &c.ChargeLine, &c.AccountID, &c.KeyID, &c.Env, &day, &c.Units, &c.USD, &chargedAt)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && req.AccountID != "" && c.AccountID != req.AccountID) {
		return nil, domain.Errorf(domain.CodeNotFound, "no charge %q", req.ChargeID)
	}
	if err != nil {
		return nil, fmt.Errorf("credit %s: %w", req.ChargeID, err)
	}
	if err := LockCharges(ctx, tx, []string{req.ChargeID}); err != nil {
		return nil, err
	}
	if req.DisputeID == "" { // a refund: a charge in an open dispute is the dispute's to credit
		var open string
		err := tx.QueryRow(ctx, `SELECT c.dispute_id FROM disputed_charges c
			JOIN streams s ON s.stream_id = 'dispute-' || c.dispute_id
			WHERE c.charge_id = $1 AND s.version = 1`, req.ChargeID).Scan(&open)
		if err == nil {
			return nil, domain.Errorf(domain.CodeConflict, "charge %s is in dispute %s, still open: accepting the dispute credits it", req.ChargeID, open)
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("credit %s: %w", req.ChargeID, err)
		}
	}
	c.CreditID, c.ChargeID, c.Day = newCreditID(), req.ChargeID, day.Format(time.DateOnly)
	c.CreditedAt, c.Reason, c.Actor, c.DisputeID = now.UTC().Truncate(time.Microsecond), req.Reason, req.Actor, req.DisputeID
	tag, err := tx.Exec(ctx, `INSERT INTO credited_charges (charge_id, credit_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, c.ChargeID, c.CreditID)
	if err != nil {
		return nil, fmt.Errorf("credit %s: %w", req.ChargeID, err)
	}
	if tag.RowsAffected() == 0 {
		return nil, domain.Errorf(domain.CodeConflict, "charge %s is already credited", req.ChargeID)
	}
	t, err := CreditTransaction(c.AccountID, c.Env, c.KeyID, c.Units, c.USD)
	if err != nil {
		return nil, err
	}
	c.Postings = t.Postings()
	// The credit gives back to the budget of the period its charge was in, if that is
	// still the current one (migrations/0024): the settle counted it in the period its
	// charged_at falls in or a later one, never an earlier one (0054), so a charge made
	// since the current period's start was counted in it.
	if _, err := tx.Exec(ctx, `SELECT meter_roll($1) FROM key_balances WHERE key_id = $1 FOR UPDATE`, c.KeyID); err != nil {
		return nil, fmt.Errorf("credit %s: %w", req.ChargeID, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE key_balances SET spent_units = spent_units - $2, spent_usd = spent_usd - $3,
			period_units = CASE WHEN period_start IS NULL OR $4 >= period_start THEN greatest(0, period_units - $2) ELSE period_units END,
			period_usd = CASE WHEN period_start IS NULL OR $4 >= period_start THEN greatest(0, period_usd - $3) ELSE period_usd END
		WHERE key_id = $1`, c.KeyID, c.Units, c.USD, chargedAt); err != nil {
		return nil, fmt.Errorf("credit %s: %w", req.ChargeID, err)
	}
	if _, err := tx.Exec(ctx, `SELECT account_roll($1, $2)`, c.AccountID, c.Env); err != nil {
		return nil, fmt.Errorf("credit %s: %w", req.ChargeID, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE account_budgets SET
			period_units = CASE WHEN period_start IS NULL OR $3 >= period_start THEN greatest(0, period_units - $4) ELSE period_units END,
			period_usd = CASE WHEN period_start IS NULL OR $3 >= period_start THEN greatest(0, period_usd - $5) ELSE period_usd END
		WHERE account_id = $1 AND env = $2`, c.AccountID, c.Env, chargedAt, c.Units, c.USD); err != nil {
		return nil, fmt.Errorf("credit %s: %w", req.ChargeID, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE account_days SET units = units - $4 WHERE account_id = $1 AND env = $2 AND day = $3`,
		c.AccountID, c.Env, day, c.Units); err != nil {
		return nil, fmt.Errorf("credit %s: %w", req.ChargeID, err)
	}
	md := eventstore.Metadata{RequestID: req.RequestID, AccountID: c.AccountID, KeyID: c.KeyID, CausationID: c.ChargeID}
	if err := tx.Append(ctx, Stream(c.KeyID), StreamLedger, eventstore.AnyVersion, md,
		eventstore.New{Type: c.EventType(), SchemaVersion: 1, Payload: &c}); err != nil {
		return nil, err
	}
	return &c, nil
}

func newCreditID() string {
	b := make([]byte, 12)
	rand.Read(b) //nolint:errcheck // crypto/rand does not fail on Linux
	return "crd_" + hex.EncodeToString(b)
}
