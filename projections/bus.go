package projections

import (
	"context"
	"database/sql"
	"log/slog"
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
	return lockingBeginner{wmsql.BeginnerFromPgx(asyncCommits{pool})}
}

// asyncCommits opens transactions that commit without waiting for the WAL flush. A
// subscriber transaction's only writes are read-model rows and the consumer's offset,
// all derived from the events: if a crash of the machine lost the last few
// milliseconds of them, Watermill delivers those messages again and the projections,
// which skip what they already applied, converge. Waiting for an fsync on every poll
// would cost more than the whole projection.
//
// The setting is sent with the BEGIN, in one round trip (two statements in one simple
// query): subscribers open a transaction for every poll, most of which find nothing,
// and a second round trip was a quarter of such a poll (54 polls a two-worker job).
type asyncCommits struct{ *pgxpool.Pool }

func (c asyncCommits) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	begin := "BEGIN"
	if opts.IsoLevel != "" {
		begin += " ISOLATION LEVEL " + string(opts.IsoLevel)
	}
	if opts.AccessMode != "" {
		begin += " " + string(opts.AccessMode)
	}
	if opts.DeferrableMode != "" {
		begin += " " + string(opts.DeferrableMode)
	}
	opts.BeginQuery = begin + "; SET LOCAL synchronous_commit = off"
	return c.Pool.BeginTx(ctx, opts)
}

// BeginTx opens a subscriber transaction (asyncCommits) that a handler can hold.
func (b lockingBeginner) BeginTx(ctx context.Context, opts *sql.TxOptions) (wmsql.Tx, error) {
	tx, err := b.inner.BeginTx(ctx, opts)
	if err != nil {
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
	// advanced is the highest position among this batch's events: one checkpoint
	// update per batch, not one per event on the same row. It is written just before
	// Watermill stores the batch's offset (its only ExecContext call on the
	// transaction), so both commit together.
	advanced int64
	// broken is a failure after which nothing of this batch may commit: Watermill
	// delivers it again in a new transaction.
	broken error
}

func (t *lockedTx) pgx() pgx.Tx { return t.inner.(*wmsql.PgxTx).Tx }

// applierFor binds the transaction to p on its first message.
func (t *lockedTx) applierFor(p Projection, logger *slog.Logger) *applier {
	if t.app == nil {
		t.app = &applier{p: p, logger: logger}
	}
	return t.app
}

// advance notes that the projection has processed position pos (the caller holds mu).
func (t *lockedTx) advance(pos int64) { t.advanced = max(t.advanced, pos) }

// checkpoint applies what the batch's projection deferred (applier.flush) and records
// the highest position the batch applied, the measure of the projection's lag (the
// caller holds mu).
func (t *lockedTx) checkpoint(ctx context.Context) error {
	if t.app != nil {
		if err := t.app.flush(ctx, t.pgx()); err != nil {
			return err
		}
	}
	if t.advanced == 0 {
		return nil
	}
	defer func() { t.advanced = 0 }()
	_, err := t.pgx().Exec(ctx, `INSERT INTO projection_checkpoints (name, position) VALUES ($1, $2)
		ON CONFLICT (name) DO UPDATE SET position = GREATEST(projection_checkpoints.position, excluded.position)`,
		t.app.p.Name(), t.advanced)
	return err
}

func (t *lockedTx) ExecContext(ctx context.Context, q string, args ...any) (wmsql.Result, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.broken != nil {
		return nil, t.broken
	}
	if err := t.checkpoint(ctx); err != nil {
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
	t.advanced = 0
	if t.app != nil {
		t.app.deferred = nil
	}
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
	if t.advanced > 0 { // every deferred event advanced the batch: checkpoint flushes them
		// never reached in practice: Watermill stores the offset (and the checkpoint) first
		if err := t.checkpoint(context.Background()); err != nil {
			t.inner.Rollback() //nolint:errcheck // reporting the checkpoint error
			return err
		}
	}
	return t.inner.Commit()
}
