package projections

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sync"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/eventstore"
)

// lockingBeginner hands Watermill's subscriber transactions that a handler can hold.
//
// Watermill gives up on a message when its context ends (shutdown, ack deadline) and
// rolls the transaction back from the subscriber's goroutine, possibly while the handler
// is still using that transaction from another goroutine; a pgx connection used from two
// goroutines at once panics. The handler holds the transaction's lock while it works, and
// every call Watermill makes takes the same lock, so the two never overlap.
type lockingBeginner struct{ inner wmsql.Beginner }

// NewBusBeginner is how every Watermill subscriber of ours opens its transactions.
func NewBusBeginner(pool *pgxpool.Pool) wmsql.Beginner {
	return lockingBeginner{wmsql.BeginnerFromPgx(pool)}
}

// BeginTx opens a subscriber transaction that commits without waiting for the WAL
// flush. Its only writes are read-model rows and the consumer's offset, all derived
// from the events: if a crash of the machine lost the last few milliseconds of them,
// Watermill delivers those messages again and the projections, which skip what they
// already applied, converge. Waiting for an fsync on every poll would cost more than
// the whole projection.
func (b lockingBeginner) BeginTx(ctx context.Context, opts *sql.TxOptions) (wmsql.Tx, error) {
	tx, err := b.inner.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
		tx.Rollback() //nolint:errcheck // reporting the first error
		return nil, err
	}
	return &lockedTx{inner: tx}, nil
}

func (b lockingBeginner) ExecContext(ctx context.Context, q string, args ...any) (wmsql.Result, error) {
	return b.inner.ExecContext(ctx, q, args...)
}

func (b lockingBeginner) QueryContext(ctx context.Context, q string, args ...any) (wmsql.Rows, error) {
	return b.inner.QueryContext(ctx, q, args...)
}

type lockedTx struct {
	mu    sync.Mutex
	inner wmsql.Tx
	// app applies the events of the projection this transaction serves (one consumer
	// group per subscriber); nil until its first message, and for other subscribers.
	app *applier
	// pending holds the writes of a Queuer projection for this Watermill batch; they
	// are sent in one round trip before Watermill stores the batch's offset (its only
	// ExecContext call on the transaction), so both commit together.
	pending []pendingEvent
	// advanced is the highest position among this batch's events: one checkpoint
	// update per batch, not one per event on the same row.
	advanced int64
	// broken is a failure after which nothing of this batch may commit: Watermill
	// delivers it again in a new transaction.
	broken error
}

// pendingEvent is one event's queued writes, or its set-aside row.
type pendingEvent struct {
	e       eventstore.Event
	queries []*pgx.QueuedQuery
	cause   error // not nil: set aside for this reason
	blocker int64 // the event it is held behind, 0 when it failed itself
}

func (t *lockedTx) pgx() pgx.Tx { return t.inner.(*wmsql.PgxTx).Tx }

// applierFor binds the transaction to p on its first message.
func (t *lockedTx) applierFor(p Projection, logger *slog.Logger) *applier {
	if t.app == nil {
		t.app = &applier{p: p, logger: logger}
	}
	return t.app
}

// queue adds e's writes (or, when it cannot be applied, its set-aside row) to the
// pending batch (the caller holds mu).
func (t *lockedTx) queue(ctx context.Context, q Queuer, e eventstore.Event) error {
	ctx = withProjection(ctx, t.app.p.Name())
	pe := pendingEvent{e: e}
	blocker, held, err := t.app.heldBy(ctx, t.pgx(), e)
	switch {
	case err != nil:
		return err
	case held:
		pe.cause, pe.blocker = heldError(e.StreamID, blocker), blocker
	default:
		b := &pgx.Batch{}
		if err := q.Queue(b, e); err != nil {
			if !CannotApply(err) {
				return fmt.Errorf("position %d: %w", e.Position, err)
			}
			pe.cause = err
			t.app.noteHeld(e.StreamID, e.Position)
		}
		pe.queries = b.QueuedQueries
	}
	t.pending = append(t.pending, pe)
	return nil
}

// advance notes that the projection has processed position pos (the caller holds mu).
func (t *lockedTx) advance(pos int64) { t.advanced = max(t.advanced, pos) }

// flush sends the pending writes and the checkpoint (the caller holds mu). They go in
// one round trip under a savepoint; when PostgreSQL refuses one event's writes, the
// batch is rolled back to it and sent again event by event, setting aside those it
// refuses.
func (t *lockedTx) flush(ctx context.Context) error {
	if len(t.pending) == 0 && t.advanced == 0 {
		return nil
	}
	defer func() { t.pending, t.advanced = nil, 0 }()
	b := &pgx.Batch{}
	if len(t.pending) > 0 {
		b.Queue(`SAVEPOINT flush`)
		for _, pe := range t.pending {
			t.queueEvent(b, pe)
		}
	}
	queueAdvance(b, t.app.p.Name(), t.advanced)
	if len(t.pending) > 0 {
		b.Queue(`RELEASE SAVEPOINT flush`)
	}
	err := t.pgx().SendBatch(ctx, b).Close()
	if err != nil && len(t.pending) > 0 {
		return t.flushEach(ctx, err)
	}
	if err == nil {
		t.countSetAside()
	}
	return err
}

// queueEvent queues an event's writes, or its set-aside row.
func (t *lockedTx) queueEvent(b *pgx.Batch, pe pendingEvent) {
	if pe.cause != nil {
		queueSetAside(b, t.app.p.Name(), pe.e, pe.cause, pe.blocker)
		return
	}
	for _, q := range pe.queries {
		b.Queue(q.SQL, q.Arguments...) // afresh: a query object is not sent twice
	}
}

// countSetAside counts and logs the set-aside rows that were just written.
func (t *lockedTx) countSetAside() {
	for _, pe := range t.pending {
		if pe.cause != nil {
			t.app.noted(pe.e, pe.cause, pe.blocker)
		}
	}
}

// flushEach is flush's way after PostgreSQL refused the batch with first: each event's
// writes under a savepoint of their own, in order.
func (t *lockedTx) flushEach(ctx context.Context, first error) error {
	tx := t.pgx()
	if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT flush`); err != nil {
		return fmt.Errorf("%w (rolling back: %w)", first, err)
	}
	if !CannotApply(first) {
		return first
	}
	for i := range t.pending {
		pe := &t.pending[i]
		if pe.cause == nil {
			if blocker, ok := t.app.held[pe.e.StreamID]; ok && blocker < pe.e.Position {
				pe.cause, pe.blocker = heldError(pe.e.StreamID, blocker), blocker
			}
		}
		if pe.cause != nil {
			continue
		}
		b := &pgx.Batch{}
		b.Queue(`SAVEPOINT one`)
		t.queueEvent(b, *pe)
		b.Queue(`RELEASE SAVEPOINT one`)
		err := tx.SendBatch(ctx, b).Close()
		if err == nil {
			continue
		}
		if _, rbErr := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT one; RELEASE SAVEPOINT one`); rbErr != nil {
			return fmt.Errorf("position %d: %w (rolling back: %w)", pe.e.Position, err, rbErr)
		}
		if !CannotApply(err) {
			return fmt.Errorf("position %d: %w", pe.e.Position, err)
		}
		pe.cause = err
		t.app.noteHeld(pe.e.StreamID, pe.e.Position)
	}
	b := &pgx.Batch{}
	for _, pe := range t.pending {
		if pe.cause != nil {
			t.queueEvent(b, pe)
		}
	}
	queueAdvance(b, t.app.p.Name(), t.advanced)
	b.Queue(`RELEASE SAVEPOINT flush`)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("set aside: %w", err)
	}
	t.countSetAside()
	return nil
}

func (t *lockedTx) ExecContext(ctx context.Context, q string, args ...any) (wmsql.Result, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.broken != nil {
		return nil, t.broken
	}
	if err := t.flush(ctx); err != nil {
		t.broken = err
		return nil, err
	}
	return t.inner.ExecContext(ctx, q, args...)
}

func (t *lockedTx) QueryContext(ctx context.Context, q string, args ...any) (wmsql.Rows, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inner.QueryContext(ctx, q, args...)
}

func (t *lockedTx) Rollback() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pending, t.advanced = nil, 0
	return t.inner.Rollback()
}

func (t *lockedTx) Commit() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.broken != nil {
		// Watermill commits when no message of the batch was acknowledged; whatever a
		// failed handler left must not.
		t.inner.Rollback() //nolint:errcheck // reporting the failure
		return t.broken
	}
	if len(t.pending) > 0 || t.advanced > 0 {
		// never reached in practice: Watermill stores the offset (flushing) first
		if err := t.flush(context.Background()); err != nil {
			t.inner.Rollback() //nolint:errcheck // reporting the flush error
			return err
		}
	}
	return t.inner.Commit()
}
