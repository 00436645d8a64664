// Package projections builds the read models from the events. Each projection is a
// Watermill subscriber (consumer group = the projection's name) on the event bus; it
// writes its rows in the very transaction in which Watermill reads the messages and
// stores its offset, so a read model and its checkpoint never disagree. An inline
// projection (the ledger's) is written by the appends themselves instead (inline.go).
// Read models can always be dropped and rebuilt from the events table alone.
package projections

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/eventstore"
	"chessd/ledger"
	"chessd/postgres"
)

// Projection turns events into rows of a read model.
type Projection interface {
	// Name is the consumer group and checkpoint name: part of the schema, never renamed.
	Name() string
	// Topic is the bus topic the projection follows.
	Topic() string
	// Tables are the read model's tables, truncated by a rebuild.
	Tables() []string
	// Apply folds one event into the read model inside tx. It must be idempotent per
	// event (a rebuild and the live subscriber may both see it) and must cope with
	// events of one stream arriving out of order (see applyInStreamOrder).
	Apply(ctx context.Context, tx pgx.Tx, e eventstore.Event) error
	// rebuilder is how Rebuild applies the projection's events many at a time.
	rebuilder() rebuilder
}

// A finisher is a projection some of whose tables (recomputed) are derived from its
// others. A rebuild in a shadow has fill compute them into the copies (fresh) once the
// others are loaded, and applies what was appended later with tail's rebuilder, which
// adds to them; a rebuild in place leaves them alone until its last event and has fill
// recompute them there.
type finisher interface {
	recomputed() []string
	fill(ctx context.Context, tx pgx.Tx, fresh bool) error
	tail() rebuilder
}

// Runner runs projections as Watermill handlers until its context ends.
type Runner struct {
	pool        *pgxpool.Pool
	projections []Projection
	logger      *slog.Logger
	// BatchSize is how many messages one subscriber transaction takes.
	BatchSize int
	// Waiting is how a subscriber that has caught up waits for more (notifications
	// on eventstore.NotifyChannel, gathered for a few milliseconds).
	Waiting eventstore.Waiting
}

// NewRunner prepares the projections; Run starts them.
func NewRunner(pool *pgxpool.Pool, logger *slog.Logger, ps ...Projection) *Runner {
	return &Runner{pool: pool, projections: ps, logger: logger, BatchSize: 500,
		Waiting: eventstore.Waiting{Idle: time.Second, Poll: 10 * time.Millisecond, Gather: 10 * time.Millisecond, Retry: time.Second}}
}

// Run blocks until ctx ends. It returns once the router is running via ready (closed).
func (r *Runner) Run(ctx context.Context, ready chan<- struct{}) error {
	wlog := watermill.NewSlogLoggerWithLevelMapping(r.logger, map[slog.Level]slog.Level{slog.LevelInfo: slog.LevelDebug})
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, wlog)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wake := eventstore.Listen(ctx, r.pool, r.logger)
	ackDeadline := 5 * time.Second
	for _, p := range r.projections {
		if Inline(p) { // written by the appends themselves: no subscriber
			if err := r.catchUpInline(ctx, p); err != nil {
				return err
			}
			continue
		}
		sub, err := wmsql.NewSubscriber(NewBusBeginner(r.pool), wmsql.SubscriberConfig{
			ConsumerGroup:  p.Name(),
			SchemaAdapter:  wmsql.DefaultPostgreSQLSchema{SubscribeBatchSize: r.BatchSize, GeneratePayloadType: eventstore.BusSchema.GeneratePayloadType},
			OffsetsAdapter: wmsql.DefaultPostgreSQLOffsetsAdapter{},
			BackoffManager: wake.Backoff(p.Topic(), r.Waiting),
			ResendInterval: 50 * time.Millisecond,
			AckDeadline:    &ackDeadline,
		}, wlog)
		if err != nil {
			return err
		}
		router.AddConsumerHandler(p.Name(), p.Topic(), sub, r.handler(p))
	}
	go func() {
		<-router.Running()
		if ready != nil {
			close(ready)
		}
	}()
	return router.Run(ctx)
}

// handler applies one message inside the subscriber's transaction. An event the
// projection cannot apply is set aside and the batch goes on (see applier); any other
// error rolls the whole batch back (offset included) and Watermill delivers it again.
func (r *Runner) handler(p Projection) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		ctx := msg.Context()
		wtx, ok := wmsql.TxFromContext(ctx)
		if !ok {
			return errors.New("no subscriber transaction in the message context")
		}
		locked, ok := wtx.(*lockedTx)
		if !ok {
			return fmt.Errorf("unexpected transaction type %T", wtx)
		}
		locked.mu.Lock()
		defer locked.mu.Unlock()
		if locked.broken != nil {
			return locked.broken
		}
		if ctx.Err() != nil { // Watermill gave up on this message; it may roll back now
			return ctx.Err()
		}
		var e eventstore.Event
		if err := json.Unmarshal(msg.Payload, &e); err != nil {
			// the envelope is our own json.Marshal of an Event: this is not the event's fault
			return fmt.Errorf("decode event envelope: %w", err)
		}
		if err := locked.applierFor(p, r.logger).apply(ctx, locked.pgx(), e); err != nil {
			r.logger.Error("projection failed", "projection", p.Name(), "position", e.Position, "err", err)
			locked.broken = err
			return err
		}
		locked.advance(e.Position)
		return nil
	}
}

// RebuildReport is what a rebuild did with the projection's events.
type RebuildReport struct {
	Applied  int64 // events applied
	SetAside int64 // events it could not apply, and those held behind them (set_aside_events)
	Skipped  int64 // events an operator skipped, left out again
}

// Rebuild empties p's read model and refills it from the events table alone, in one
// transaction. It holds the projection's bus offset row meanwhile, so the live
// subscriber waits and afterwards skips what the rebuild already applied. Events it
// cannot apply are set aside as the live projection does; a set-aside event that
// applies now (its projection was fixed) is marked retried, and skipped ones stay out.
//
// The events are applied in chunks (see rebuilder): a chunk's writes go in one round
// trip, with no read of the read model. When the database refuses a chunk and no open
// set-aside event was known, the rebuild starts again with a savepoint around each
// chunk (careful), which finds the refused events by halving the chunk; without that, a long
// rebuild would hold one subtransaction per chunk, and past 64 of them PostgreSQL's
// snapshots slow down for every session.
//
// An inline projection's rows are written by every append meanwhile: its tables are
// emptied with DELETE rather than TRUNCATE, so those appends neither wait for the
// rebuild (TRUNCATE's lock would stop them, and the chain's head with them) nor lose
// their rows; an event both write is written once (rows are keyed by position).
func Rebuild(ctx context.Context, pool *pgxpool.Pool, p Projection) (RebuildReport, error) {
	careful := false
	for {
		var rb *rebuilding
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			rb = &rebuilding{p: p, r: p.rebuilder(), tx: tx, inline: Inline(p), careful: careful,
				a: &applier{p: p, loaded: true, held: map[string]int64{}, checked: map[string]bool{}}}
			return rb.run(ctx)
		})
		var refused refusedError
		if errors.As(err, &refused) && !careful {
			careful = true
			continue
		}
		if err != nil {
			return RebuildReport{}, err
		}
		return rb.rep, nil
	}
}

// RebuildAll rebuilds the projections ps side by side, each as Rebuild does, in a
// transaction of its own: what one waits for (its reads, its indexes, a lock) another
// uses. Reports and errors are in the order of ps; one that fails leaves the others be.
func RebuildAll(ctx context.Context, pool *pgxpool.Pool, ps ...Projection) ([]RebuildReport, []error) {
	reps, errs := make([]RebuildReport, len(ps)), make([]error, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() { reps[i], errs[i] = Rebuild(ctx, pool, p) })
	}
	wg.Wait()
	return reps, errs
}

// rebuildChunk is how many events a rebuild reads, and writes, at a time.
var rebuildChunk = 2000

// beforeSwap runs between a shadow's loading and its swap (tests: appends in between).
var beforeSwap = func() {}

// A rebuilder is how Rebuild applies a projection's events many at a time. A rebuild
// starts from empty tables and hands it every event of the projection's topic in
// position order, less those held behind a set-aside one, so it reads nothing of the
// read model back: what it needs (a job's aggregate) it keeps in memory, and the writes
// of a chunk of events are queued together, set-based where the rows allow.
type rebuilder interface {
	// fold takes the next event and returns its writes (a value queue knows); an error
	// is the event's own: it is set aside. skipped: an operator skipped the event; it
	// writes nothing, but what is kept in memory follows it as the live projection's
	// reading of the stream does.
	fold(ctx context.Context, q eventstore.Querier, e eventstore.Event, skipped bool) (any, error)
	// queue queues on b the writes of consecutive events, in order. It is called again
	// with fewer of them when the database refuses a chunk.
	queue(b *pgx.Batch, ws []any) error
}

// inlineRebuild rebuilds an inline projection with its writer (eventstore.InlineFunc):
// its events are independent, and the writer takes many at once. With copyRows, a
// rebuild that expects no refusal loads the rows with COPY instead (see shadow).
type inlineRebuild struct {
	queueRows func(b *pgx.Batch, evs []eventstore.Event) error
	copyRows  func(evs []eventstore.Event) ([]eventstore.TableRows, error)
}

func (inlineRebuild) fold(_ context.Context, _ eventstore.Querier, e eventstore.Event, _ bool) (any, error) {
	return e, nil
}

func (r inlineRebuild) queue(b *pgx.Batch, ws []any) error { return r.queueRows(b, asEvents(ws)) }

func asEvents(ws []any) []eventstore.Event {
	evs := make([]eventstore.Event, len(ws))
	for i, w := range ws {
		evs[i] = w.(eventstore.Event)
	}
	return evs
}

// refusedError is a chunk the database refused in a rebuild without savepoints.
type refusedError struct{ err error }

func (e refusedError) Error() string { return "rebuild refused: " + e.err.Error() }
func (e refusedError) Unwrap() error { return e.err }

// rebuilding is one attempt at a rebuild, in its transaction.
type rebuilding struct {
	p       Projection
	r       rebuilder
	tx      pgx.Tx
	inline  bool
	careful bool     // a savepoint around each chunk
	shadow  *shadow  // where the rows go; nil: the tables are emptied in place
	fast    bool     // COPY into the shadow's tables, which have no constraints yet
	a       *applier // the held streams and the set-aside count, as the live path keeps them
	rep     RebuildReport

	states   map[int64]string // set-aside events' states by position
	last     int64            // the position of the last event read
	resolved []int64          // open set-aside events the rebuild applied
}

// pending is an event of a chunk: its writes, or why it is set aside.
type pending struct {
	e       eventstore.Event
	w       any
	cause   error // not nil: set aside for this reason
	blocker int64 // the event it is held behind, 0 when it failed itself
}

func (rb *rebuilding) run(ctx context.Context) error {
	p, tx := rb.p, rb.tx
	if !rb.inline {
		// The live subscriber locks this row first in each of its transactions, which are
		// REPEATABLE READ: writing it (not only locking it) makes one that took its
		// snapshot before the rebuild committed fail there and start again, rather than
		// apply events to the read model as it stood before the rebuild.
		offsets := pgx.Identifier{fmt.Sprintf(`watermill_offsets_%s`, p.Topic())}.Sanitize()
		if _, err := tx.Exec(ctx, `INSERT INTO `+offsets+` AS o (consumer_group, offset_acked, last_processed_transaction_id)
			VALUES ($1, 0, '0') ON CONFLICT (consumer_group) DO UPDATE SET offset_acked = o.offset_acked`, p.Name()); err != nil {
			return err
		}
	}
	rb.states = map[int64]string{}
	rows, err := tx.Query(ctx, `SELECT position, state FROM set_aside_events WHERE projection = $1 AND state <> 'retried'`, p.Name())
	if err != nil {
		return fmt.Errorf("read set-aside events: %w", err)
	}
	var pos int64
	var state string
	if _, err := pgx.ForEachRow(rows, []any{&pos, &state}, func() error { rb.states[pos] = state; return nil }); err != nil {
		return fmt.Errorf("read set-aside events: %w", err)
	}
	for _, st := range rb.states {
		rb.careful = rb.careful || st == "open" // refusals are to be expected
	}
	ir, copies := rb.r.(inlineRebuild)
	rb.fast = !rb.careful && copies && ir.copyRows != nil
	if rb.shadow, err = openShadow(ctx, tx, p.Name(), p.Tables(), rb.fast); err != nil && !errors.Is(err, errNotShadowed) {
		return err
	}
	rb.fast = rb.fast && rb.shadow != nil
	if rb.shadow == nil {
		if err := rb.emptyInPlace(ctx); err != nil {
			return err
		}
	}
	// Every event whose rows were emptied is at or before the head read now; applyAll
	// reads on until no more had been committed, past it when appends go on meanwhile.
	head, err := eventstore.Head(ctx, tx)
	if err != nil {
		return fmt.Errorf("read head: %w", err)
	}
	if err := rb.applyAll(ctx); err != nil {
		return err
	}
	if rb.shadow != nil {
		if err := rb.swapIn(ctx); err != nil {
			return err
		}
	} else if fin, ok := p.(finisher); ok {
		if err := fin.fill(ctx, tx, false); err != nil {
			return err
		}
	}
	rb.rep.SetAside = rb.a.setAsideN
	if len(rb.resolved) > 0 {
		if _, err := tx.Exec(ctx, `WITH done AS (
				UPDATE set_aside_events SET state = 'retried' WHERE projection = $1 AND position = ANY($2) RETURNING id)
			INSERT INTO set_aside_actions (set_aside_id, action, outcome, actor) SELECT id, 'rebuild', 'applied', 'chessd rebuild' FROM done`,
			p.Name(), rb.resolved); err != nil {
			return fmt.Errorf("resolve set-aside events: %w", err)
		}
	}
	if rb.inline { // never behind: no checkpoint
		_, err = tx.Exec(ctx, `DELETE FROM projection_checkpoints WHERE name = $1`, p.Name())
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO projection_checkpoints (name, position) VALUES ($1, $2)
		ON CONFLICT (name) DO UPDATE SET position = excluded.position`, p.Name(), max(head, rb.last))
	return err
}

// emptyInPlace empties the tables of a projection that cannot be shadowed, but for the
// recomputed ones (its finisher's fill recomputes them at the end).
func (rb *rebuilding) emptyInPlace(ctx context.Context) error {
	fin, finishes := rb.p.(finisher)
	var tables []string
	for _, t := range rb.p.Tables() {
		if !finishes || !slices.Contains(fin.recomputed(), t) {
			tables = append(tables, pgx.Identifier{t}.Sanitize())
		}
	}
	empty := `DELETE FROM ` // the appends write an inline projection's tables meanwhile
	if !rb.inline {
		empty = `TRUNCATE `
		if err := lockTables(ctx, rb.tx, tables, false); err != nil {
			return err
		}
	}
	for _, t := range tables {
		if _, err := rb.tx.Exec(ctx, empty+t); err != nil {
			return err
		}
	}
	return nil
}

// swapIn finishes the shadow's copies (constraints, indexes, the derived tables, while
// the appends go on), then holds the old tables, applies what an inline projection's
// appends added since the last read (a subscriber applies the rest of its own once the
// rebuild lets go of its offset row) and puts the copies in their place.
func (rb *rebuilding) swapIn(ctx context.Context) error {
	sh, tx := rb.shadow, rb.tx
	fin, finishes := rb.p.(finisher)
	var fill func() error
	if finishes {
		fill = func() error { return fin.fill(ctx, tx, true) }
	}
	if err := sh.finishCopies(ctx, tx, fill); err != nil {
		if rb.fast && CannotApply(err) { // a duplicate, say: find it carefully
			return refusedError{err}
		}
		return err
	}
	rb.fast = false
	beforeSwap()
	if err := sh.lock(ctx, tx, rb.inline); err != nil {
		return fmt.Errorf("lock the tables for the swap: %w", err)
	}
	if rb.inline {
		if finishes {
			rb.r = fin.tail()
		}
		if err := rb.applyAll(ctx); err != nil {
			return err
		}
	}
	return sh.swap(ctx, tx)
}

// applyAll applies the events after the last one applied until none is left.
func (rb *rebuilding) applyAll(ctx context.Context) error {
	tx := rb.tx
	// A chunk's writes are made (the payloads decoded) in a goroutine while the
	// previous chunk's go to the database: on two cores, one costs no time beside the
	// other.
	var prev []*pending
	var prevMade <-chan made
	for {
		evs, err := readTopic(ctx, tx, rb.p.Topic(), rb.last, rebuildChunk)
		if err != nil {
			return err
		}
		var chunk []*pending
		for _, e := range evs {
			rb.last = e.Position
			if rb.states[e.Position] == "skipped" {
				rb.rep.Skipped++
				if !rb.held(&pending{e: e}) {
					if _, err := rb.r.fold(ctx, tx, e, true); err != nil && !CannotApply(err) {
						return fmt.Errorf("position %d: %w", e.Position, err)
					}
				}
				continue
			}
			pe := &pending{e: e}
			if !rb.held(pe) {
				if pe.w, err = rb.r.fold(ctx, tx, e, false); err != nil {
					if !CannotApply(err) {
						return fmt.Errorf("position %d: %w", e.Position, err)
					}
					pe.cause = err
					rb.a.noteHeld(e.StreamID, e.Position)
				}
			}
			chunk = append(chunk, pe)
		}
		var next <-chan made
		if len(chunk) > 0 {
			next = rb.makeAhead(chunk)
		}
		if prev != nil {
			if err := rb.apply(ctx, prev, prevMade); err != nil {
				return err
			}
		}
		if len(evs) < rebuildChunk { // a short read: no more had been committed
			if len(chunk) == 0 {
				return nil
			}
			return rb.apply(ctx, chunk, next)
		}
		prev, prevMade = chunk, next
	}
}

// apply writes a chunk and counts what it applied and set aside.
func (rb *rebuilding) apply(ctx context.Context, chunk []*pending, ahead <-chan made) error {
	if err := rb.write(ctx, chunk, ahead); err != nil {
		return err
	}
	for _, pe := range chunk {
		if pe.cause != nil {
			rb.a.noted(pe.e, pe.cause, pe.blocker)
			continue
		}
		rb.rep.Applied++
		if rb.states[pe.e.Position] == "open" {
			rb.resolved = append(rb.resolved, pe.e.Position)
		}
	}
	return nil
}

// held sets pe aside behind an earlier set-aside event of its stream, if there is one
// (never in an inline projection, whose writers cannot hold events back). It reports
// whether pe is set aside.
func (rb *rebuilding) held(pe *pending) bool {
	if rb.inline {
		return pe.cause != nil
	}
	// an event that failed on its own is held all the same once an earlier event of
	// its stream turns out refused (its chunk went to the database after this one was
	// folded): the live projection would not have tried it
	if blocker, ok := rb.a.held[pe.e.StreamID]; ok && blocker < pe.e.Position {
		pe.cause, pe.blocker = heldError(pe.e.StreamID, blocker), blocker
		return true
	}
	return pe.cause != nil
}

// applicable are the events of chunk that are not set aside.
func (rb *rebuilding) applicable(chunk []*pending) []*pending {
	var out []*pending
	for _, pe := range chunk {
		if !rb.held(pe) {
			out = append(out, pe)
		}
	}
	return out
}

// made is a chunk's writes, made ahead for its applicable events as they stood then.
type made struct {
	events []*pending
	b      *pgx.Batch
	rows   []eventstore.TableRows // when fast
	err    error
}

// makeAhead makes the writes of chunk in a goroutine. The rebuilder's queue reads only
// the writes folded already, so it may run beside the next fold.
func (rb *rebuilding) makeAhead(chunk []*pending) <-chan made {
	events := rb.applicable(chunk)
	ws := make([]any, len(events))
	for i, pe := range events {
		ws[i] = pe.w
	}
	out := make(chan made, 1)
	fast := rb.fast
	go func() {
		m := made{events: events, b: &pgx.Batch{}}
		switch {
		case len(ws) == 0:
		case fast:
			m.rows, m.err = copyInParts(rb.r.(inlineRebuild).copyRows, asEvents(ws))
		default:
			m.err = rb.r.queue(m.b, ws)
		}
		out <- m
	}()
	return out
}

// write sends a chunk's writes and set-aside rows in one round trip. When the database
// refuses them, a careful rebuild rolls the chunk back and finds the refused events
// (bisect); any other rebuild gives up with refusedError, to start again carefully.
func (rb *rebuilding) write(ctx context.Context, chunk []*pending, ahead <-chan made) error {
	if rb.fast {
		return rb.copyChunk(ctx, ahead)
	}
	b := &pgx.Batch{}
	if rb.careful {
		b.Queue(`SAVEPOINT chunk`)
	}
	if err := rb.queue(b, chunk, ahead); err != nil {
		return err
	}
	rb.queueSetAside(b, chunk)
	if rb.careful {
		b.Queue(`RELEASE SAVEPOINT chunk`)
	}
	err := rb.tx.SendBatch(ctx, b).Close()
	switch {
	case err == nil:
		return nil
	case !CannotApply(err):
		return err
	case !rb.careful:
		return refusedError{err}
	}
	if _, rbErr := rb.tx.Exec(ctx, `ROLLBACK TO SAVEPOINT chunk`); rbErr != nil {
		return fmt.Errorf("%w (rolling back: %w)", err, rbErr)
	}
	if err := rb.bisect(ctx, chunk); err != nil {
		return err
	}
	b = &pgx.Batch{}
	rb.queueSetAside(b, chunk)
	b.Queue(`RELEASE SAVEPOINT chunk`)
	if err := rb.tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("set aside: %w", err)
	}
	return nil
}

// copyInParts makes the rows of evs in as many parts as there are cores to decode them.
func copyInParts(rows func(evs []eventstore.Event) ([]eventstore.TableRows, error), evs []eventstore.Event) ([]eventstore.TableRows, error) {
	n := min(runtime.GOMAXPROCS(0), max(1, len(evs)/100))
	parts := make([][]eventstore.TableRows, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { parts[i], errs[i] = rows(evs[i*len(evs)/n : (i+1)*len(evs)/n]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return slices.Concat(parts...), nil
}

// copyChunk loads a chunk's rows, made ahead, into the shadow's tables. Anything
// refused starts the rebuild again carefully, which finds the events at fault.
func (rb *rebuilding) copyChunk(ctx context.Context, ahead <-chan made) error {
	m := <-ahead
	err := m.err
	for _, t := range m.rows {
		if err != nil {
			break
		}
		var n int64
		n, err = postgres.Copy(ctx, rb.tx.Conn().PgConn(), pgx.Identifier{rb.shadow.name, t.Table}, t.Columns, t.Rows)
		if err == nil && n != int64(t.N) {
			err = fmt.Errorf("copy into %s: %d rows taken of %d", t.Table, n, t.N)
		}
	}
	if CannotApply(err) {
		return refusedError{err}
	}
	return err
}

// queue queues the writes of the events of chunk that are not set aside, those made
// ahead when they are still for the same events. When the rebuilder cannot make them
// (an undecodable payload, say), it finds the events at fault one by one and sets them
// aside, holding their streams' later events.
func (rb *rebuilding) queue(b *pgx.Batch, chunk []*pending, ahead <-chan made) error {
	events := rb.applicable(chunk)
	if len(events) == 0 {
		return nil
	}
	var all *pgx.Batch
	var err error
	if ahead != nil {
		if m := <-ahead; slices.Equal(m.events, events) {
			all, err = m.b, m.err
		}
	}
	if all == nil {
		ws := make([]any, len(events))
		for i, pe := range events {
			ws[i] = pe.w
		}
		all = &pgx.Batch{}
		err = rb.r.queue(all, ws)
	}
	if err == nil {
		b.QueuedQueries = append(b.QueuedQueries, all.QueuedQueries...)
		return nil
	}
	if !CannotApply(err) {
		return err
	}
	for _, pe := range chunk {
		if rb.held(pe) {
			continue
		}
		one := &pgx.Batch{}
		if err := rb.r.queue(one, []any{pe.w}); err != nil {
			if !CannotApply(err) {
				return fmt.Errorf("position %d: %w", pe.e.Position, err)
			}
			pe.cause = err
			rb.a.noteHeld(pe.e.StreamID, pe.e.Position)
			continue
		}
		b.QueuedQueries = append(b.QueuedQueries, one.QueuedQueries...)
	}
	return nil
}

// bisect sends the writes of events the database refused together, in halves under
// savepoints of their own, down to the single events it refuses: those are set aside,
// and the later events of their streams held. Halves go in order, so an event is held
// before its writes are tried when an earlier one of its stream was refused.
func (rb *rebuilding) bisect(ctx context.Context, events []*pending) error {
	var live []*pending
	for _, pe := range events {
		if !rb.held(pe) {
			live = append(live, pe)
		}
	}
	if len(live) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	b.Queue(`SAVEPOINT part`)
	if err := rb.queue(b, live, nil); err != nil {
		return err
	}
	b.Queue(`RELEASE SAVEPOINT part`)
	err := rb.tx.SendBatch(ctx, b).Close()
	if err == nil {
		return nil
	}
	if _, rbErr := rb.tx.Exec(ctx, `ROLLBACK TO SAVEPOINT part; RELEASE SAVEPOINT part`); rbErr != nil {
		return fmt.Errorf("%w (rolling back: %w)", err, rbErr)
	}
	if !CannotApply(err) {
		return err
	}
	if len(live) == 1 {
		live[0].cause = err
		rb.a.noteHeld(live[0].e.StreamID, live[0].e.Position)
		return nil
	}
	mid := len(live) / 2
	if err := rb.bisect(ctx, live[:mid]); err != nil {
		return err
	}
	return rb.bisect(ctx, live[mid:])
}

// queueSetAside queues the set-aside rows of chunk's events that are set aside.
func (rb *rebuilding) queueSetAside(b *pgx.Batch, chunk []*pending) {
	for _, pe := range chunk {
		if pe.cause != nil {
			queueSetAside(b, rb.p.Name(), pe.e, pe.cause, pe.blocker)
		}
	}
}

// readTopic reads up to limit events of topic after position after, in position
// order: the columns a projection uses.
func readTopic(ctx context.Context, q eventstore.Querier, topic string, after int64, limit int) ([]eventstore.Event, error) {
	var types, known []string
	for t, to := range eventstore.Topics {
		known = append(known, t)
		if to == topic {
			types = append(types, t)
		}
	}
	// stream types Topics does not name go to TopicDefault
	query := `SELECT position, stream_id, stream_type, version, event_type, schema_version, payload::text
		FROM events WHERE position > $1 AND (stream_type = ANY($2) OR ($3 AND stream_type <> ALL($4)))`
	if topic != eventstore.TopicOf(ledger.StreamLedger) {
		// the index of the events that are not charges (migration 0033) holds them all
		query += ` AND stream_type <> 'ledger'`
	}
	rows, err := q.Query(ctx, query+` ORDER BY position LIMIT $5`, after, types, topic == eventstore.TopicDefault, known, limit)
	if err != nil {
		return nil, fmt.Errorf("read events: %w", err)
	}
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (eventstore.Event, error) {
		var e eventstore.Event
		// into the payload's own bytes: a string first would copy each payload twice
		err := r.Scan(&e.Position, &e.StreamID, &e.StreamType, &e.Version, &e.Type, &e.SchemaVersion, (*[]byte)(&e.Payload))
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("read events: %w", err)
	}
	return evs, nil
}

// applyInStreamOrder applies e to a per-stream row that is at version current. Events
// already reflected are skipped; when earlier events of the stream are missing (the bus
// orders by transaction id, not by position), they are read from the events table and
// applied first, so the row always moves one version at a time; those an operator
// skipped (SkipSetAside) stay out.
func applyInStreamOrder(ctx context.Context, tx pgx.Tx, e eventstore.Event, current int64, apply func(eventstore.Event) error) error {
	if e.Version <= current {
		return nil
	}
	if e.Version > current+1 {
		evs, err := eventstore.Load(ctx, tx, e.StreamID)
		if err != nil {
			return err
		}
		skipped, err := skippedIn(ctx, tx, e.StreamID)
		if err != nil {
			return err
		}
		for _, m := range evs {
			if m.Version > current && m.Version < e.Version && !skipped[m.Position] {
				if err := apply(m); err != nil {
					return err
				}
			}
		}
	}
	return apply(e)
}
