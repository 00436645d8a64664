package projections

import (
	"context"
	"database/sql"
	"sync"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
	// pending holds the writes of Queuer projections for this Watermill batch; they
	// are sent in one round trip before Watermill stores the batch's offset (its only
	// ExecContext call on the transaction), so both commit together.
	pending *pgx.Batch
	// advanced is the highest position per projection among the pending writes: one
	// checkpoint update per batch, not one per event on the same row.
	advanced map[string]int64
}

func (t *lockedTx) pgx() pgx.Tx { return t.inner.(*wmsql.PgxTx).Tx }

// queue adds writes to the pending batch (the caller holds mu).
func (t *lockedTx) queue(add func(*pgx.Batch) error) error {
	if t.pending == nil {
		t.pending = &pgx.Batch{}
	}
	return add(t.pending)
}

// advance notes that projection name has applied position pos (the caller holds mu).
func (t *lockedTx) advance(name string, pos int64) {
	if t.advanced == nil {
		t.advanced = map[string]int64{}
	}
	t.advanced[name] = max(t.advanced[name], pos)
}

// flush sends the pending writes and checkpoints (the caller holds mu).
func (t *lockedTx) flush(ctx context.Context) error {
	if (t.pending == nil || t.pending.Len() == 0) && len(t.advanced) == 0 {
		return nil
	}
	b := t.pending
	if b == nil {
		b = &pgx.Batch{}
	}
	for name, pos := range t.advanced {
		queueAdvance(b, name, pos)
	}
	t.pending, t.advanced = nil, nil
	return t.pgx().SendBatch(ctx, b).Close()
}

func (t *lockedTx) ExecContext(ctx context.Context, q string, args ...any) (wmsql.Result, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.flush(ctx); err != nil {
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
	t.pending, t.advanced = nil, nil
	return t.inner.Rollback()
}

func (t *lockedTx) Commit() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if (t.pending != nil && t.pending.Len() > 0) || len(t.advanced) > 0 {
		// never reached in practice: Watermill stores the offset (flushing) first
		if err := t.flush(context.Background()); err != nil {
			t.inner.Rollback() //nolint:errcheck // reporting the flush error
			return err
		}
	}
	return t.inner.Commit()
}
