package eventstore

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// NotifyChannel is the PostgreSQL channel on which every transaction that publishes on
// the bus names the topics it published on (NOTIFY is delivered at commit, and only
// then). Subscribers wait for it instead of polling their tables every few
// milliseconds: an idle service then costs the database almost nothing, and a busy one
// sees its projections follow at once.
const NotifyChannel = "chessd_bus"

// queueNotify announces, on commit, that topic has new messages.
func queueNotify(b *pgx.Batch, topic string) {
	b.Queue(`SELECT pg_notify($1, $2)`, NotifyChannel, topic)
}

// QueueNotify announces topic, on commit, from a batch of another package (a read model
// whose readers wait for it).
func QueueNotify(b *pgx.Batch, topic string) { queueNotify(b, topic) }

// Notify is queueNotify for a publisher outside this package (the command bus, the
// mail outbox, webhook deliveries): inside a transaction it is delivered at commit.
func Notify(ctx context.Context, q Querier, topic string) error {
	_, err := q.Exec(ctx, `SELECT pg_notify($1, $2)`, NotifyChannel, topic)
	return err
}

// Drain calls work until it reports nothing done, then again whenever topic is
// announced and at least every poll, until ctx ends: the loop of a sender of rows
// other transactions queue (the mail outbox, webhook deliveries).
func Drain(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger, topic string, poll time.Duration, work func(context.Context) int) {
	queued, cancel := Listen(ctx, pool, logger).Subscribe(topic)
	defer cancel()
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		for work(ctx) > 0 {
		}
		select {
		case <-ctx.Done():
			return
		case <-queued:
		case <-tick.C:
		}
	}
}

// Wakeups listens on NotifyChannel over a connection of its own and wakes the waiting
// subscribers of each topic announced.
type Wakeups struct {
	pool      *pgxpool.Pool
	logger    *slog.Logger
	done      <-chan struct{}
	listening atomic.Bool
	mu        sync.Mutex
	waiters   map[string][]chan struct{}
}

// Listen starts listening until ctx ends.
func Listen(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) *Wakeups {
	w := &Wakeups{pool: pool, logger: logger, done: ctx.Done(), waiters: map[string][]chan struct{}{}}
	go w.run(ctx)
	return w
}

func (w *Wakeups) run(ctx context.Context) {
	const firstBackoff = 100 * time.Millisecond
	backoff := firstBackoff
	for ctx.Err() == nil {
		err := w.listen(ctx)
		if w.listening.Swap(false) {
			backoff = firstBackoff // it was listening: a new outage starts
		}
		if ctx.Err() != nil {
			return
		}
		w.logger.Warn("bus notifications lost; subscribers poll until they are back", "err", err, "retry_in", backoff)
		w.wakeAll() // whatever was announced meanwhile is found by polling
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (w *Wakeups) listen(ctx context.Context) error {
	pc, err := w.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pc.Hijack() // LISTEN belongs to the session: it never goes back to the pool
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+NotifyChannel); err != nil {
		return err
	}
	w.listening.Store(true)
	w.wakeAll() // anything announced before we listened
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		w.wake(n.Payload)
	}
}

func (w *Wakeups) wake(topic string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ch := range w.waiters[topic] {
		select {
		case ch <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
}

func (w *Wakeups) wakeAll() {
	w.mu.Lock()
	topics := make([]string, 0, len(w.waiters))
	for t := range w.waiters {
		topics = append(topics, t)
	}
	w.mu.Unlock()
	for _, t := range topics {
		w.wake(t)
	}
}

// Listening says whether notifications are being received now: while not, a waiter must
// poll.
func (w *Wakeups) Listening() bool { return w.listening.Load() }

// Subscribe registers a one-off waiter of topic (a job's event stream): the channel
// receives a value after each announcement (at most one pending), until cancel.
func (w *Wakeups) Subscribe(topic string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	w.waiters[topic] = append(w.waiters[topic], ch)
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		list := w.waiters[topic]
		for i, c := range list {
			if c == ch {
				list = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(w.waiters, topic)
		} else {
			w.waiters[topic] = list
		}
	}
}

// Waiting says how a subscriber waits when it has caught up.
type Waiting struct {
	// Idle is the longest wait for a notification before asking again anyway.
	Idle time.Duration
	// Poll replaces Idle while notifications are not being received.
	Poll time.Duration
	// Gather is the least time between two queries of a subscriber that has caught up:
	// a busy topic is then read in batches of what Gather brought, not once per
	// commit. Zero for subscribers that must react at once.
	Gather time.Duration
	// Retry is the wait after a failed query.
	Retry time.Duration
}

// Backoff is the Watermill BackoffManager of a subscriber of topic. While queries find
// messages it lets the subscriber go on at once. When one finds nothing, it waits
// until topic is announced (or for Idle), and at least until Gather has passed since
// the previous wait ended. A wake-up that came while the subscriber was querying is
// kept, so none is lost. Errors are handled as Watermill's default manager does.
func (w *Wakeups) Backoff(topic string, how Waiting) wmsql.BackoffManager {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	w.waiters[topic] = append(w.waiters[topic], ch)
	w.mu.Unlock()
	return &wakeBackoff{w: w, ch: ch, how: how, errors: wmsql.NewDefaultBackoffManager(how.Poll, how.Retry)}
}

type wakeBackoff struct {
	w      *Wakeups
	ch     chan struct{}
	how    Waiting
	errors wmsql.BackoffManager
	last   time.Time // when the previous wait ended
}

func (b *wakeBackoff) HandleError(logger watermill.LoggerAdapter, noMsg bool, err error) time.Duration {
	if err != nil {
		select {
		case <-b.w.done:
			return 0 // shutting down: the subscriber is about to stop
		default:
		}
		return b.errors.HandleError(logger, noMsg, err)
	}
	if !noMsg {
		return 0
	}
	wait := b.how.Idle
	if !b.w.listening.Load() {
		wait = b.how.Poll
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-b.ch:
	case <-t.C:
	case <-b.w.done:
		return 0
	}
	if rest := b.how.Gather - time.Since(b.last); rest > 0 {
		select {
		case <-time.After(rest):
		case <-b.w.done:
		}
	}
	b.last = time.Now()
	return 0
}
