package projections

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"chessd/eventstore"
)

// An event a projection cannot apply (a payload its read model refuses) is set aside:
// recorded in set_aside_events with its error, while the projection goes on with every
// other stream. Later events of the same stream are set aside behind it ("held"), so a
// stream's read model never moves past a missing event. The events table is never
// touched. An operator lists, retries or skips set-aside events (`chessd setaside`,
// RetrySetAside, SkipSetAside); every action is recorded in set_aside_actions.

// CannotApply reports whether err, returned by a projection for one event while the
// connection is healthy (the caller rolled back to a savepoint successfully), means that
// this event can never be applied as it is: a value PostgreSQL refuses (SQLSTATE class
// 22 data exception, 23 integrity constraint, 54 program limit such as an index row too
// large), or the projection's own refusal (an undecodable payload, unbalanced postings).
// Anything else is transient, or a fault of the projection's code rather than of the
// event (connection lost, serialization failure or deadlock, cancellation, a missing
// table): the transaction rolls back and the events are delivered again.
func CannotApply(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		class := pgErr.Code[:min(2, len(pgErr.Code))]
		return class == "22" || class == "23" || class == "54"
	}
	var netErr net.Error
	var connectErr *pgconn.ConnectError
	if pgconn.Timeout(err) || pgconn.SafeToRetry(err) || errors.As(err, &netErr) || errors.As(err, &connectErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return false
	}
	return true
}

// applier applies one projection's events in a transaction and sets aside those it
// cannot apply.
//
// The events since the last set-aside one are applied under one savepoint rather than
// one savepoint each: a savepoint per event would cost two more round trips per event,
// and hundreds of subtransactions in one transaction overflow PostgreSQL's per-backend
// subtransaction cache, which slows every other session's snapshots. When an event
// fails, the applier rolls back to the savepoint, applies the events before it again
// (they succeeded a moment ago), and records the failed one.
type applier struct {
	p      Projection
	logger *slog.Logger // nil: silent

	loaded  bool
	held    map[string]int64 // stream -> its earliest set-aside event, which later ones wait behind
	checked map[string]bool  // held streams whose set-aside rows this transaction has locked
	scoped  bool             // the savepoint "apply" is open
	applied []eventstore.Event
	// deferred are the events of a projection that applies runs of them together
	// (bulkApplier), waiting for flush: the end of the batch.
	deferred []eventstore.Event

	setAsideN int64 // events set aside by this applier
}

// bulkApplier is a projection that applies a batch's events in fewer statements than
// one each. applyBulk applies those of evs it can and returns the others (every event
// of a stream, or none), untouched, for Apply one by one; it writes nothing but what it
// reports applied, and an error leaves its writes to be rolled back.
type bulkApplier interface {
	applyBulk(ctx context.Context, tx pgx.Tx, evs []eventstore.Event) (rest, applied []eventstore.Event, err error)
}

type projectionKey struct{}

// withProjection names the projection applying events, so applyInStreamOrder can leave
// out the events an operator skipped.
func withProjection(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, projectionKey{}, name)
}

func projectionOf(ctx context.Context) string {
	name, _ := ctx.Value(projectionKey{}).(string)
	return name
}

// apply applies e, or sets it aside; a bulkApplier's event waits for flush. An error
// means the transaction cannot go on (a transient failure) and must roll back.
func (a *applier) apply(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if _, ok := a.p.(bulkApplier); ok {
		a.deferred = append(a.deferred, e)
		return nil
	}
	return a.applyOne(ctx, tx, e)
}

// flush applies the deferred events: together where the projection can, one by one
// where it cannot. The first event of a stream the projection could not take goes
// alone (it may be the stream's first, or its row may stand elsewhere: Apply's careful
// way) and the stream's others try together again. When the database refuses the bulk
// writes, they are rolled back with the savepoint and the rest goes one by one, which
// finds the event at fault and sets it aside as for any other projection.
func (a *applier) flush(ctx context.Context, tx pgx.Tx) (err error) {
	evs := a.deferred
	a.deferred = nil
	ctx = withProjection(ctx, a.p.Name())
	defer func() {
		if err != nil && a.logger != nil {
			a.logger.Error("projection failed", "projection", a.p.Name(), "err", err)
		}
	}()
	together := true
	for len(evs) > 0 {
		rest := evs
		if together && len(evs) > 1 {
			if rest, together, err = a.applyBulk(ctx, tx, evs); err != nil {
				return err
			}
		}
		evs = nil
		alone := map[string]bool{}
		for _, e := range rest {
			if together && alone[e.StreamID] {
				evs = append(evs, e)
				continue
			}
			alone[e.StreamID] = true
			if err := a.applyOne(ctx, tx, e); err != nil {
				return err
			}
		}
	}
	return nil
}

// applyBulk applies what the projection can of evs together and returns the rest;
// together is false when the rest must go one by one: some event waits behind a
// set-aside one, or the database refused the bulk writes (rolled back).
func (a *applier) applyBulk(ctx context.Context, tx pgx.Tx, evs []eventstore.Event) (rest []eventstore.Event, together bool, err error) {
	for _, e := range evs {
		if _, held, err := a.heldBy(ctx, tx, e); err != nil || held {
			return evs, false, err
		}
	}
	if err := a.scope(ctx, tx); err != nil {
		return nil, false, err
	}
	rest, applied, bulkErr := a.p.(bulkApplier).applyBulk(ctx, tx, evs)
	if bulkErr == nil {
		a.applied = append(a.applied, applied...)
		return rest, true, nil
	}
	if err := a.undo(ctx, tx, bulkErr, "bulk"); err != nil {
		return nil, false, err
	}
	return evs, false, nil
}

// scope opens the savepoint "apply" unless it is open.
func (a *applier) scope(ctx context.Context, tx pgx.Tx) error {
	if a.scoped {
		return nil
	}
	if _, err := tx.Exec(ctx, `SAVEPOINT apply`); err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	a.scoped = true
	return nil
}

// undo rolls back to the savepoint after cause, a failure of the writes of what
// (an event's position, or "bulk"), and applies again the events applied under it,
// which succeeded a moment ago. Unless cause says the writes can never be applied,
// the transaction cannot go on: undo returns cause.
func (a *applier) undo(ctx context.Context, tx pgx.Tx, cause error, what string) error {
	if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT apply`); err != nil {
		return fmt.Errorf("%s: %w (rolling back: %w)", what, cause, err)
	}
	if !CannotApply(cause) {
		return fmt.Errorf("%s: %w", what, cause)
	}
	for _, m := range a.applied { // undone with the savepoint
		if err := a.p.Apply(ctx, tx, m); err != nil {
			return fmt.Errorf("position %d, applied again: %w", m.Position, err)
		}
	}
	return nil
}

// applyOne applies e, or sets it aside.
func (a *applier) applyOne(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	ctx = withProjection(ctx, a.p.Name())
	blocker, held, err := a.heldBy(ctx, tx, e)
	if err != nil {
		return err
	}
	if held {
		return a.setAside(ctx, tx, e, heldError(e.StreamID, blocker), blocker)
	}
	if err := a.scope(ctx, tx); err != nil {
		return err
	}
	applyErr := a.p.Apply(ctx, tx, e)
	if applyErr == nil {
		a.applied = append(a.applied, e)
		return nil
	}
	if err := a.undo(ctx, tx, applyErr, fmt.Sprintf("position %d", e.Position)); err != nil {
		return err
	}
	return a.setAside(ctx, tx, e, applyErr, 0)
}

// heldBy says whether e waits behind an earlier set-aside event of its stream, and which.
// An inline projection's events never wait: its writers cannot hold one back.
func (a *applier) heldBy(ctx context.Context, tx pgx.Tx, e eventstore.Event) (int64, bool, error) {
	inline := Inline(a.p)
	if !a.loaded {
		a.held, a.checked = map[string]int64{}, map[string]bool{}
		if !inline {
			rows, err := tx.Query(ctx, `SELECT stream_id, min(position) FROM set_aside_events
				WHERE projection = $1 AND state = 'open' GROUP BY stream_id`, a.p.Name())
			if err != nil {
				return 0, false, fmt.Errorf("read set-aside streams: %w", err)
			}
			var stream string
			var pos int64
			if _, err := pgx.ForEachRow(rows, []any{&stream, &pos}, func() error { a.held[stream] = pos; return nil }); err != nil {
				return 0, false, fmt.Errorf("read set-aside streams: %w", err)
			}
		}
		a.loaded = true
	}
	blocker, ok := a.held[e.StreamID]
	if inline || !ok || blocker >= e.Position {
		return 0, false, nil
	}
	if a.checked[e.StreamID] {
		return blocker, true, nil
	}
	// An operator may be releasing this stream right now (RetrySetAside): lock its open
	// rows. A release that committed after this transaction's snapshot (the subscriber's
	// is REPEATABLE READ) makes this fail with a serialization error, and the batch runs
	// again on a fresh snapshot instead of holding an event behind a released one.
	rows, err := tx.Query(ctx, `SELECT position FROM set_aside_events
		WHERE projection = $1 AND stream_id = $2 AND state = 'open' ORDER BY position FOR UPDATE`, a.p.Name(), e.StreamID)
	if err != nil {
		return 0, false, fmt.Errorf("lock set-aside events of %s: %w", e.StreamID, err)
	}
	open, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, false, fmt.Errorf("lock set-aside events of %s: %w", e.StreamID, err)
	}
	a.checked[e.StreamID] = true
	if len(open) == 0 || open[0] >= e.Position {
		delete(a.held, e.StreamID)
		return 0, false, nil
	}
	a.held[e.StreamID] = open[0]
	return open[0], true, nil
}

// noteHeld records that the events of stream after pos wait behind it.
func (a *applier) noteHeld(stream string, pos int64) {
	if b, ok := a.held[stream]; !ok || pos < b {
		a.held[stream] = pos
	}
	a.checked[stream] = true
}

// setAside records e as set aside (blocker: the event it is held behind, 0 when it
// failed itself), closing the savepoint so what was applied before it stays.
func (a *applier) setAside(ctx context.Context, tx pgx.Tx, e eventstore.Event, cause error, blocker int64) error {
	b := &pgx.Batch{}
	if a.scoped {
		b.Queue(`RELEASE SAVEPOINT apply`)
	}
	queueSetAside(b, a.p.Name(), e, cause, blocker)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("set aside position %d: %w", e.Position, err)
	}
	a.scoped, a.applied = false, nil
	a.noted(e, cause, blocker)
	return nil
}

// noted counts and logs a set-aside event whose row is written.
func (a *applier) noted(e eventstore.Event, cause error, blocker int64) {
	a.noteHeld(e.StreamID, e.Position)
	a.setAsideN++
	if a.logger != nil {
		a.logger.Error("event set aside", "projection", a.p.Name(), "position", e.Position, "stream", e.StreamID,
			"event_type", e.Type, "held_by", blocker, "err", cause)
	}
}

// release applies the deferred events and closes the savepoint, keeping what was
// applied under it.
func (a *applier) release(ctx context.Context, tx pgx.Tx) error {
	if err := a.flush(ctx, tx); err != nil {
		return err
	}
	if !a.scoped {
		return nil
	}
	if _, err := tx.Exec(ctx, `RELEASE SAVEPOINT apply`); err != nil {
		return fmt.Errorf("release savepoint: %w", err)
	}
	a.scoped, a.applied = false, nil
	return nil
}

func heldError(stream string, blocker int64) error {
	return fmt.Errorf("held: an earlier event of stream %s (position %d) is set aside", stream, blocker)
}

// queueSetAside queues the set-aside row of e. Seen again (a rebuild), the row counts
// one more attempt and reopens unless an operator skipped it.
func queueSetAside(b *pgx.Batch, projection string, e eventstore.Event, cause error, blocker int64) {
	var heldBy *int64
	if blocker != 0 {
		heldBy = &blocker
	}
	b.Queue(`INSERT INTO set_aside_events (projection, position, stream_id, event_type, error, held_by)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (projection, position) DO UPDATE SET error = excluded.error, held_by = excluded.held_by,
			attempts = set_aside_events.attempts + 1, last_seen = now(),
			state = CASE set_aside_events.state WHEN 'skipped' THEN 'skipped' ELSE 'open' END`,
		projection, e.Position, storable(e.StreamID), storable(e.Type), storable(cause.Error()), heldBy)
}

// storable makes s acceptable to a PostgreSQL text column (an error message may quote
// the very bytes that were refused).
func storable(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", `\u0000`)
}

// skippedIn lists the events of stream that an operator skipped for the projection
// applying in ctx: applyInStreamOrder must not apply them on the way to a later one.
func skippedIn(ctx context.Context, q eventstore.Querier, stream string) (map[int64]bool, error) {
	name := projectionOf(ctx)
	if name == "" {
		return nil, nil
	}
	rows, err := q.Query(ctx, `SELECT position FROM set_aside_events
		WHERE projection = $1 AND stream_id = $2 AND state = 'skipped'`, name, stream)
	if err != nil {
		return nil, fmt.Errorf("read skipped events of %s: %w", stream, err)
	}
	positions, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("read skipped events of %s: %w", stream, err)
	}
	skipped := make(map[int64]bool, len(positions))
	for _, p := range positions {
		skipped[p] = true
	}
	return skipped, nil
}
