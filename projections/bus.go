package projections

import (
	"context"
	"database/sql"
	"sync"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
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

func newLockingBeginner(pool *pgxpool.Pool) lockingBeginner {
	return lockingBeginner{wmsql.BeginnerFromPgx(pool)}
}

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
}

func (t *lockedTx) ExecContext(ctx context.Context, q string, args ...any) (wmsql.Result, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
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
	return t.inner.Rollback()
}

func (t *lockedTx) Commit() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inner.Commit()
}
