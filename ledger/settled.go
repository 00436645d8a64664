package ledger

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	gojson "github.com/goccy/go-json"
	"github.com/shopspring/decimal"

	"chessd/domain"
)

// ChargesSettled is one group commit's charges of one key: each answered call is one
// of its lines, with every fact needed to explain it, and the event carries the
// postings of all of them together. The settler appends one per key per commit
// instead of a UnitsCharged per call: one events row, one hash and one read-model row
// for hundreds of calls (docs/BILLING.md). A line's charge id is derived from the
// event's position and the line's index (LineChargeID), so it needs no index of its own.
type ChargesSettled struct {
	AccountID string          `json:"account_id"`
	KeyID     string          `json:"key_id"`
	Env       string          `json:"env"`
	Lines     []SettledCharge `json:"lines"`
	// The lines' sums, so that the log adds up by event without reading lines (an
	// event whose sums are not its lines' is refused: check).
	Units    int64           `json:"units"`
	USD      decimal.Decimal `json:"usd"`
	Postings []Posting       `json:"postings"`
}

// SettledCharge is one line of a ChargesSettled: one answered call.
type SettledCharge struct {
	RequestID      string          `json:"request_id"`
	Day            string          `json:"day"` // UTC date the allowance was drawn from
	ChargedAt      time.Time       `json:"charged_at"`
	Endpoint       string          `json:"endpoint"`
	Params         Params          `json:"params"`
	Engine         string          `json:"engine"`
	Path           string          `json:"path"`
	Cached         bool            `json:"cached"`
	Units          int64           `json:"units"`
	USD            decimal.Decimal `json:"usd"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
}

func (*ChargesSettled) EventType() string { return "ChargesSettled" }

func init() {
	domain.RegisterEvent("ChargesSettled", func() domain.Event { return &ChargesSettled{} })
}

// LineChargeID names line i of the ChargesSettled event at position.
func LineChargeID(position int64, i int) string {
	return "chg_" + strconv.FormatInt(position, 10) + "_" + strconv.Itoa(i)
}

// ParseLineChargeID reads a LineChargeID; ok is false for anything else (a
// UnitsCharged's random id included).
func ParseLineChargeID(id string) (position int64, i int, ok bool) {
	rest, found := strings.CutPrefix(id, "chg_")
	if !found {
		return 0, 0, false
	}
	p, l, found := strings.Cut(rest, "_")
	if !found {
		return 0, 0, false
	}
	pos, err := strconv.ParseInt(p, 10, 64)
	if err != nil || pos <= 0 || strconv.FormatInt(pos, 10) != p {
		return 0, 0, false
	}
	line, err := strconv.Atoi(l)
	if err != nil || line < 0 || line >= maxSettleBatch || strconv.Itoa(line) != l {
		return 0, 0, false
	}
	return pos, line, true
}

// settledEvent groups one key's answered calls into their event, with its payload
// encoded from the lines each call encoded (settlement.line). Every line is of key.
func settledEvent(account, key, env string, lines []SettledCharge, encoded [][]byte) (*ChargesSettled, []byte, error) {
	e := &ChargesSettled{AccountID: account, KeyID: key, Env: env, Lines: lines, USD: decimal.Zero}
	for _, l := range lines {
		e.Units += l.Units
		e.USD = e.USD.Add(l.USD)
	}
	t, err := ChargeTransaction(account, env, key, e.Units, e.USD)
	if err != nil {
		return nil, nil, err
	}
	e.Postings = t.Postings()
	if testHookSettled != nil {
		testHookSettled(e)
	}
	// the same fields in the same order as ChargesSettled, with the lines as encoded
	wire := struct {
		AccountID string              `json:"account_id"`
		KeyID     string              `json:"key_id"`
		Env       string              `json:"env"`
		Lines     []gojson.RawMessage `json:"lines"`
		Units     int64               `json:"units"`
		USD       decimal.Decimal     `json:"usd"`
		Postings  []Posting           `json:"postings"`
	}{e.AccountID, e.KeyID, e.Env, make([]gojson.RawMessage, len(encoded)), e.Units, e.USD, e.Postings}
	for i, b := range encoded {
		wire.Lines[i] = b
	}
	payload, err := gojson.Marshal(wire)
	if err != nil {
		return nil, nil, err
	}
	return e, payload, nil
}

// testHookSettled lets tests make events no code makes (postings that do not balance).
var testHookSettled func(*ChargesSettled)

// check refuses an event whose postings do not balance or do not post what its lines
// add up to, or whose lines are not one key's answered calls.
func (e *ChargesSettled) check() error {
	if len(e.Lines) == 0 || len(e.Lines) > maxSettleBatch {
		return fmt.Errorf("%d lines", len(e.Lines))
	}
	units, usd := int64(0), decimal.Zero
	for _, l := range e.Lines {
		if l.Units < 0 || l.USD.IsNegative() {
			return fmt.Errorf("line %s charges a negative amount", l.RequestID)
		}
		if _, err := time.Parse(time.DateOnly, l.Day); err != nil {
			return fmt.Errorf("line %s: day %q is not a date", l.RequestID, l.Day)
		}
		units, usd = units+l.Units, usd.Add(l.USD)
	}
	if units != e.Units || !usd.Equal(e.USD) {
		return fmt.Errorf("lines add up to %d units, %s USD; the event says %d, %s", units, usd, e.Units, e.USD)
	}
	// the lines' charge, which balances by construction (NewTransaction)
	t, err := ChargeTransaction(e.AccountID, e.Env, e.KeyID, e.Units, e.USD)
	if err != nil {
		return err
	}
	if !samePostings(t.Postings(), e.Postings) {
		if !Balanced(e.Postings) {
			return errors.New("postings do not balance")
		}
		return errors.New("postings are not the lines' charge")
	}
	return nil
}

func samePostings(a, b []Posting) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Book != b[i].Book || a[i].Account != b[i].Account || a[i].Currency != b[i].Currency ||
			!a[i].Debit.Equal(b[i].Debit) || !a[i].Credit.Equal(b[i].Credit) {
			return false
		}
	}
	return true
}

// chargeByID is the condition on charge_lines() that finds one charge by its id, with
// chargeIDArgs' two parameters: a line by its event's position and index, a
// UnitsCharged's row by its indexed id (charge_lines' batches then by a position that
// is none of theirs).
const chargeByID = `position = coalesce($1, (SELECT c.position FROM charges c WHERE c.charge_id = $2)) AND charge_id = $2`

// chargeIDArgs are chargeByID's parameters for id.
func chargeIDArgs(id string) []any {
	if pos, _, ok := ParseLineChargeID(id); ok {
		return []any{&pos, id}
	}
	return []any{nil, id}
}

// ChargesOf is the charges a ledger event records, as a statement shows them: a
// UnitsCharged's one, each line of a ChargesSettled; none for anything else. An event
// whose postings do not balance, or do not post what its lines add up to, is an error.
func ChargesOf(position int64, ev domain.Event) ([]ChargeLine, error) {
	if err := checkPostings(ev); err != nil {
		return nil, fmt.Errorf("position %d: %w", position, err)
	}
	return chargeLines(position, ev), nil
}

// checkPostings refuses a charge event whose postings do not balance or, for a
// ChargesSettled, do not post what its lines add up to.
func checkPostings(ev domain.Event) error {
	switch e := ev.(type) {
	case *UnitsCharged:
		if !Balanced(e.Postings) {
			return errors.New("postings do not balance")
		}
	case *ChargesSettled:
		return e.check()
	}
	return nil
}

// chargeLines is ChargesOf without the checks.
func chargeLines(position int64, ev domain.Event) []ChargeLine {
	switch e := ev.(type) {
	case *UnitsCharged:
		return []ChargeLine{{Position: position, ChargeID: e.ChargeID, RequestID: e.RequestID, KeyID: e.KeyID, Env: e.Env,
			Day: e.Day, ChargedAt: e.ChargedAt.UTC(), Endpoint: e.Endpoint, Engine: e.Engine, Path: e.Path,
			Params: e.Params, Cached: e.Cached, Units: e.Units, USD: e.USD}}
	case *ChargesSettled:
		out := make([]ChargeLine, len(e.Lines))
		for i, l := range e.Lines {
			out[i] = ChargeLine{Position: position, Line: i, ChargeID: LineChargeID(position, i), RequestID: l.RequestID,
				KeyID: e.KeyID, Env: e.Env, Day: l.Day, ChargedAt: l.ChargedAt.UTC(), Endpoint: l.Endpoint, Engine: l.Engine,
				Path: l.Path, Params: l.Params, Cached: l.Cached, Units: l.Units, USD: l.USD}
		}
		return out
	}
	return nil
}
