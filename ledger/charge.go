package ledger

import (
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/shopspring/decimal"

	"chessd/domain"
)

// StreamLedger is the stream type of charges; each key has one stream, "ledger-<key id>".
const StreamLedger = "ledger"

// Stream is a key's ledger stream.
func Stream(keyID string) string { return "ledger-" + keyID }

// Params are the request facts that priced a call.
type Params struct {
	Depth      int    `json:"depth"`
	MultiPV    int    `json:"multipv"`
	MoveTimeMS int    `json:"movetime_ms,omitempty"`
	Positions  int    `json:"positions"`
	FEN        string `json:"fen,omitempty"`
	JobID      string `json:"job_id,omitempty"`
}

// UnitsCharged is one charge, with every fact needed to explain it and its postings: a
// job's position (ChargeHeld). The settler's charges are ChargesSettled lines.
type UnitsCharged struct {
	ChargeID  string          `json:"charge_id"`
	RequestID string          `json:"request_id"`
	AccountID string          `json:"account_id"`
	KeyID     string          `json:"key_id"`
	Env       string          `json:"env"`
	Day       string          `json:"day"` // UTC date the allowance was drawn from
	ChargedAt time.Time       `json:"charged_at"`
	Endpoint  string          `json:"endpoint"`
	Params    Params          `json:"params"`
	Engine    string          `json:"engine"`
	Path      string          `json:"path"`
	Cached    bool            `json:"cached"`
	Units     int64           `json:"units"`
	USD       decimal.Decimal `json:"usd"`
	Postings  []Posting       `json:"postings"`
}

func (*UnitsCharged) EventType() string { return "UnitsCharged" }

func init() {
	domain.RegisterEvent("UnitsCharged", func() domain.Event { return &UnitsCharged{} })
}

// Charge is one job position's line item, before it becomes a UnitsCharged event.
type Charge struct {
	RequestID string
	Key       *domain.Key
	Endpoint  domain.Endpoint
	Params    Params
	Engine    string
	Path      string
	Cached    bool
	Units     int64
	USD       decimal.Decimal
}

// Stored is an Idempotency-Key's claim and, once answered, its first response.
type Stored struct {
	Scope, Key  string
	RequestHash []byte
	Status      int
	Response    []byte
	Owner       string // the server that claimed it (Meter.Claim)
}

// Refusals; see outcome.go for the whole table.
var (
	ErrBudget    = errorString("budget exceeded")
	ErrAllowance = errorString("daily allowance exceeded")
)

// ErrStopped: the meter stopped; nothing more is reserved or settled.
var ErrStopped = errorString("ledger: meter stopped")

func chargeEvent(ch Charge, now time.Time, day string) (*UnitsCharged, error) {
	k := ch.Key
	t, err := ChargeTransaction(k.AccountID(), k.Env().String(), k.ID(), ch.Units, ch.USD)
	if err != nil {
		return nil, err
	}
	e := &UnitsCharged{
		ChargeID: newChargeID(), RequestID: ch.RequestID, AccountID: k.AccountID(), KeyID: k.ID(), Env: k.Env().String(),
		Day: day, ChargedAt: now, Endpoint: string(ch.Endpoint), Params: ch.Params, Engine: ch.Engine, Path: ch.Path,
		Cached: ch.Cached, Units: ch.Units, USD: ch.USD, Postings: t.Postings(),
	}
	return e, nil
}

func newChargeID() string {
	b := make([]byte, 12)
	rand.Read(b) //nolint:errcheck // crypto/rand does not fail on Linux
	return "chg_" + hex.EncodeToString(b)
}
