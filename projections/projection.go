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
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/eventstore"
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
		app := locked.applierFor(p, r.logger)
		var err error
		if q, ok := p.(Queuer); ok {
			err = locked.queue(ctx, q, e)
		} else {
			err = app.apply(ctx, locked.pgx(), e)
		}
		if err != nil {
			r.logger.Error("projection failed", "projection", p.Name(), "position", e.Position, "err", err)
			locked.broken = err
			return err
		}
		locked.advance(e.Position)
		return nil
	}
}

// Queuer is a projection that only writes: its statements wait in a batch sent once per
// Watermill batch, in the same transaction, instead of one round trip per event.
type Queuer interface {
	Queue(b *pgx.Batch, e eventstore.Event) error
}

// queueAdvance records the highest position a projection has applied: the measure of
// its lag.
func queueAdvance(b *pgx.Batch, name string, pos int64) {
	b.Queue(`INSERT INTO projection_checkpoints (name, position) VALUES ($1, $2)
		ON CONFLICT (name) DO UPDATE SET position = GREATEST(projection_checkpoints.position, excluded.position)`, name, pos)
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
// An inline projection's rows are written by every append meanwhile: its tables are
// emptied with DELETE rather than TRUNCATE, so those appends neither wait for the
// rebuild (TRUNCATE's lock would stop them, and the chain's head with them) nor lose
// their rows; an event both write is written once (rows are keyed by position).
func Rebuild(ctx context.Context, pool *pgxpool.Pool, p Projection) (RebuildReport, error) {
	var rep RebuildReport
	inline := Inline(p)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		rep = RebuildReport{}
		empty := `TRUNCATE `
		if inline {
			empty = `DELETE FROM `
		} else {
			offsets := fmt.Sprintf(`watermill_offsets_%s`, p.Topic())
			if _, err := tx.Exec(ctx, `SELECT 1 FROM `+pgx.Identifier{offsets}.Sanitize()+` WHERE consumer_group = $1 FOR UPDATE`, p.Name()); err != nil {
				return err
			}
		}
		for _, t := range p.Tables() {
			if _, err := tx.Exec(ctx, empty+pgx.Identifier{t}.Sanitize()); err != nil {
				return err
			}
		}
		states := map[int64]string{}
		rows, err := tx.Query(ctx, `SELECT position, state FROM set_aside_events WHERE projection = $1 AND state <> 'retried'`, p.Name())
		if err != nil {
			return fmt.Errorf("read set-aside events: %w", err)
		}
		var pos int64
		var state string
		if _, err := pgx.ForEachRow(rows, []any{&pos, &state}, func() error { states[pos] = state; return nil }); err != nil {
			return fmt.Errorf("read set-aside events: %w", err)
		}
		a := &applier{p: p, fresh: true}
		var resolved []int64
		var last int64
		for {
			evs, err := eventstore.ReadFrom(ctx, tx, last, 1000)
			if err != nil {
				return err
			}
			if len(evs) == 0 {
				break
			}
			for _, e := range evs {
				last = e.Position
				if eventstore.TopicOf(e.StreamType) != p.Topic() {
					continue
				}
				if states[e.Position] == "skipped" {
					rep.Skipped++
					continue
				}
				before := a.setAsideN
				if err := a.apply(ctx, tx, e); err != nil {
					return err
				}
				if a.setAsideN == before {
					rep.Applied++
					if states[e.Position] == "open" {
						resolved = append(resolved, e.Position)
					}
				}
			}
			if err := a.release(ctx, tx); err != nil {
				return err
			}
		}
		rep.SetAside = a.setAsideN
		if len(resolved) > 0 {
			if _, err := tx.Exec(ctx, `WITH done AS (
					UPDATE set_aside_events SET state = 'retried' WHERE projection = $1 AND position = ANY($2) RETURNING id)
				INSERT INTO set_aside_actions (set_aside_id, action, outcome, actor) SELECT id, 'rebuild', 'applied', 'chessd rebuild' FROM done`,
				p.Name(), resolved); err != nil {
				return fmt.Errorf("resolve set-aside events: %w", err)
			}
		}
		if inline { // never behind: no checkpoint
			_, err = tx.Exec(ctx, `DELETE FROM projection_checkpoints WHERE name = $1`, p.Name())
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO projection_checkpoints (name, position) VALUES ($1, $2)
			ON CONFLICT (name) DO UPDATE SET position = excluded.position`, p.Name(), last)
		return err
	})
	return rep, err
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
