package ledger

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"chessd/domain"
	"chessd/eventstore"
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

// UnitsCharged is one charge, with every fact needed to explain it and its postings.
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

// Charge asks for one costed call to be charged.
type Charge struct {
	RequestID string
	Key       *domain.Key
	Allowance int64 // the plan's units per day
	Endpoint  domain.Endpoint
	Params    Params
	Engine    string
	Path      string
	Cached    bool
	Units     int64
	USD       decimal.Decimal
	// Idempotency, when set, is stored with the charge: a retry finds it.
	Idempotency *Stored
	// KeyVersion and AccountVersion, when set, are the versions the caller
	// authenticated at from memory: the charge is refused with ErrStaleAuth if either
	// stream has moved since (a revocation, a rotation, a plan change).
	KeyVersion, AccountVersion int64
}

// Stored is a first response kept for an Idempotency-Key.
type Stored struct {
	Scope, Key  string
	RequestHash []byte
	Status      int
	Response    []byte
	Owner       string // the server that claimed it (Meter.Claim)
}

// Refusals.
var (
	ErrBudget    = errors.New("budget exceeded")
	ErrAllowance = errors.New("daily allowance exceeded")
	// ErrStaleAuth: the key or its account changed after the caller authenticated;
	// nothing was charged, and the caller must authenticate afresh.
	ErrStaleAuth = errors.New("key or account changed since authentication")
)

// ErrStopped: the charger stopped before this charge was made; nothing was charged.
var ErrStopped = errors.New("ledger: charger stopped")

// DuplicateError says the Idempotency-Key was used already; Stored is the first answer.
type DuplicateError struct{ Stored Stored }

func (e *DuplicateError) Error() string { return "idempotency key already used" }

// Result of a charge: the event when it was charged.
type Result struct {
	Event *UnitsCharged
	Err   error // ErrBudget (wrapped with which budget), ErrAllowance, *DuplicateError
}

// Charger charges calls in batches: concurrent charges share one transaction and one
// commit (group commit), which is what lets the ledger keep up with cached evals. The
// check of budget and allowance stays one atomic step per charge (ledger_charge).
type Charger struct {
	store    *eventstore.Store
	logger   *slog.Logger
	queue    chan *pending
	stopped  chan struct{} // closed when the loop has ended
	now      func() time.Time
	cursor   eventstore.Cursor // the loop's: where its last append left the log
	settling sync.WaitGroup    // batches whose commit's outcome is being found out
}

type pending struct {
	ctx    context.Context
	charge Charge
	done   chan Result
}

// maxBatch bounds one transaction.
const maxBatch = 256

// NewCharger starts the charging loop; it stops when ctx ends.
func NewCharger(ctx context.Context, store *eventstore.Store, logger *slog.Logger) *Charger {
	c := &Charger{store: store, logger: logger, queue: make(chan *pending, 4*maxBatch), stopped: make(chan struct{}),
		now: func() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }}
	go c.loop(ctx)
	return c
}

// Charge charges one call and waits until its transaction committed (or failed). A nil
// error with Result.Err set is a refusal; an error means nothing was charged, except an
// *eventstore.UncertainCommitError: the database went away during the commit and did
// not come back within eventstore.SettleWait to say whether it happened.
func (c *Charger) Charge(ctx context.Context, ch Charge) (Result, error) {
	p := &pending{ctx: ctx, charge: ch, done: make(chan Result, 1)}
	select {
	case c.queue <- p:
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
	// Once queued, the charge may commit: wait for the outcome even if the client left,
	// so that what we report matches what the ledger holds. A loop that stopped answers
	// every batch it took, so a charge still queued then was never made.
	var r Result
	select {
	case r = <-p.done:
	case <-c.stopped:
		select {
		case r = <-p.done:
		default:
			return Result{}, ErrStopped
		}
	}
	if r.Err != nil && !isRefusal(r.Err) {
		return Result{}, r.Err
	}
	return r, nil
}

func isRefusal(err error) bool {
	var dup *DuplicateError
	return errors.Is(err, ErrBudget) || errors.Is(err, ErrAllowance) || errors.Is(err, ErrStaleAuth) || errors.As(err, &dup)
}

// loop takes whatever is queued (without waiting for more: an idle ledger adds no
// latency) and charges it in one transaction.
func (c *Charger) loop(ctx context.Context) {
	defer close(c.stopped)
	defer c.settling.Wait() // every batch taken is answered before the loop says it stopped
	defer c.cursor.Close()
	for {
		var batch []*pending
		select {
		case p := <-c.queue:
			batch = append(batch, p)
		case <-ctx.Done():
			return
		}
	drain:
		for len(batch) < maxBatch {
			select {
			case p := <-c.queue:
				batch = append(batch, p)
			default:
				break drain
			}
		}
		results, err := c.charge(ctx, batch)
		var unsure *eventstore.UncertainCommitError
		if errors.As(err, &unsure) {
			// Answered once the database says whether the batch committed; the next
			// batches need not wait for that, they go out on a new connection.
			c.settling.Add(1)
			go func() {
				defer c.settling.Done()
				c.settle(ctx, batch, results, unsure)
			}()
			continue
		}
		for i, p := range batch {
			if err != nil {
				p.done <- Result{Err: err}
			} else {
				p.done <- results[i]
			}
		}
	}
}

// settle answers a batch whose connection failed once its COMMIT may have gone out. The
// charges' ids are in the events the batch would have appended: the database is asked
// (until it answers, for at most eventstore.SettleWait) whether they are in the log.
// If they are, every charge gets the result it would have had; if not, nothing was
// charged, and each gets an error that says so. A call is thus never answered as failed
// when it was charged, nor charged twice by a retry that follows a false failure.
func (c *Charger) settle(ctx context.Context, batch []*pending, results []Result, unsure *eventstore.UncertainCommitError) {
	ctx, cancel := context.WithTimeout(ctx, eventstore.SettleWait)
	defer cancel()
	committed, err := c.store.Settle(ctx, unsure)
	c.logger.Warn("charge batch's commit was uncertain", "charges", len(batch), "committed", committed, "settled", err == nil, "err", unsure.Err)
	if err == nil && committed {
		c.readDuplicates(ctx, results)
	}
	for i, p := range batch {
		switch {
		case err != nil:
			p.done <- Result{Err: unsure}
		case committed:
			p.done <- results[i]
		default:
			p.done <- Result{Err: fmt.Errorf("charge: %w (%w)", eventstore.ErrNotCommitted, unsure.Err)}
		}
	}
}

func (c *Charger) charge(ctx context.Context, batch []*pending) ([]Result, error) {
	results := make([]Result, len(batch))
	now := c.now()
	day := now.Format(time.DateOnly)
	// The common case, every charge passing and nobody else having appended since our
	// last batch, takes one round trip (Fast). Otherwise one pipelined transaction:
	// the checks of every charge go out with BEGIN and the chain's head, the events of
	// those that passed with COMMIT.
	events := make([]*UnitsCharged, len(batch))
	for i, p := range batch {
		e, err := chargeEvent(p.charge, now, day)
		if err != nil {
			return nil, err
		}
		events[i] = e
	}
	queue := func(strict bool) func(*pgx.Batch) {
		fn := "ledger_charge_checked"
		if strict {
			fn = "ledger_charge_strict"
		}
		return func(b *pgx.Batch) {
			for _, p := range batch {
				ch := p.charge
				k := ch.Key
				var idem Stored
				if ch.Idempotency != nil {
					idem = *ch.Idempotency
				}
				b.Queue(`SELECT `+fn+`($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
					ch.KeyVersion, ch.AccountVersion, k.ID(), k.AccountID(), k.Env().String(), day, ch.Units, ch.USD, ch.Allowance,
					idem.Scope, idem.Key, idem.RequestHash, idem.Status, idem.Response)
			}
		}
	}
	// appends puts the charges that passed on their keys' streams, one append per key.
	appends := func(passed func(i int) bool) []eventstore.Appends {
		var out []eventstore.Appends
		index := map[string]int{}
		for i, p := range batch {
			if !passed(i) {
				continue
			}
			e := events[i]
			md := eventstore.Metadata{RequestID: p.charge.RequestID, AccountID: e.AccountID, KeyID: e.KeyID}
			if p.charge.Idempotency != nil {
				md.IdempotencyKey = p.charge.Idempotency.Key
			}
			j, ok := index[e.KeyID]
			if !ok {
				j = len(out)
				index[e.KeyID] = j
				out = append(out, eventstore.Appends{StreamID: Stream(e.KeyID), StreamType: StreamLedger})
			}
			out[j].Events = append(out[j].Events, eventstore.New{Type: e.EventType(), SchemaVersion: 1, Payload: e, Meta: &md})
		}
		return out
	}
	ctx = context.WithoutCancel(ctx)
	_, err := c.store.Fast(ctx, &c.cursor, queue(true), appends(func(int) bool { return true }))
	var unsure *eventstore.UncertainCommitError
	if err == nil || errors.As(err, &unsure) {
		for i := range batch {
			results[i] = Result{Event: events[i]} // what stands if it committed
		}
		return results, err
	}
	if !errors.Is(err, eventstore.ErrStale) {
		return nil, err
	}
	read := func(br pgx.BatchResults) ([]eventstore.Appends, error) {
		for i, p := range batch {
			results[i] = Result{} // a retry reads afresh
			var outcome string
			if err := br.QueryRow().Scan(&outcome); err != nil {
				return nil, fmt.Errorf("charge: %w", err)
			}
			switch outcome {
			case "ok":
				results[i].Event = events[i]
			case "budget_units":
				results[i].Err = fmt.Errorf("%w: units", ErrBudget)
			case "budget_usd":
				results[i].Err = fmt.Errorf("%w: usd", ErrBudget)
			case "allowance":
				results[i].Err = ErrAllowance
			case "stale":
				results[i].Err = ErrStaleAuth
			case "duplicate":
				results[i].Err = &DuplicateError{Stored: *p.charge.Idempotency}
			default:
				return nil, fmt.Errorf("charge: unexpected outcome %q", outcome)
			}
		}
		return appends(func(i int) bool { return results[i].Err == nil }), nil
	}
	var streams []string
	seen := map[string]bool{}
	for _, p := range batch {
		if id := Stream(p.charge.Key.ID()); !seen[id] {
			seen[id] = true
			streams = append(streams, id)
		}
	}
	if _, err := c.store.Pipelined(ctx, &c.cursor, streams, queue(false), read); err != nil {
		if errors.As(err, &unsure) {
			return results, err // as read: what stands if it committed
		}
		return nil, err
	}
	c.readDuplicates(ctx, results)
	return results, nil
}

// readDuplicates reads each duplicate's first answer after the fact (it may have been
// written by a transaction that committed just before ours).
func (c *Charger) readDuplicates(ctx context.Context, results []Result) {
	for i, r := range results {
		var dup *DuplicateError
		if errors.As(r.Err, &dup) {
			s := &dup.Stored
			if err := c.store.Pool().QueryRow(ctx, `SELECT request_hash, status, response FROM idempotency WHERE scope = $1 AND idem_key = $2`,
				s.Scope, s.Key).Scan(&s.RequestHash, &s.Status, &s.Response); err != nil {
				results[i].Err = fmt.Errorf("read stored response: %w", err)
			}
		}
	}
}

func chargeEvent(ch Charge, now time.Time, day string) (*UnitsCharged, error) {
	k := ch.Key
	t, err := ChargeTransaction(k.AccountID(), k.Env().String(), k.ID(), ch.Units, ch.USD)
	if err != nil {
		return nil, err
	}
	return &UnitsCharged{
		ChargeID: newChargeID(), RequestID: ch.RequestID, AccountID: k.AccountID(), KeyID: k.ID(), Env: k.Env().String(),
		Day: day, ChargedAt: now, Endpoint: string(ch.Endpoint), Params: ch.Params, Engine: ch.Engine, Path: ch.Path,
		Cached: ch.Cached, Units: ch.Units, USD: ch.USD, Postings: t.Postings(),
	}, nil
}

func newChargeID() string {
	b := make([]byte, 12)
	rand.Read(b) //nolint:errcheck // crypto/rand does not fail on Linux
	return "chg_" + hex.EncodeToString(b)
}
