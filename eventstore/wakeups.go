package eventstore

import (
	"context"
	"errors"
	"fmt"
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

// Wakeups wakes the waiting subscribers of each topic announced on NotifyChannel. Every
// Wakeups of one pool shares one listening connection (listener): PostgreSQL signals
// every listening session of the database at each NOTIFY, whatever its channel, so each
// listening connection costs every notifying commit of every server a wake-up (about
// 35 µs of the database's CPU).
type Wakeups struct {
	l   *listener
	ctx context.Context // the user's: its waiters go when it ends
}

// Listen returns a Wakeups of pool's listener, started if it is not, until ctx ends.
func Listen(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) *Wakeups {
	return &Wakeups{l: acquireListener(ctx, pool, logger), ctx: ctx}
}

// listener is a pool's one listening connection: bus topics (NotifyChannel) wake their
// waiters, stream announcements (WatchChannel) go to the pool's watchers.
type listener struct {
	pool      *pgxpool.Pool
	logger    *slog.Logger
	listening atomic.Bool
	mu        sync.Mutex
	waiters   map[string][]chan struct{}
	watchers  []*Watcher
	refs      int
	stop      context.CancelFunc
}

var listeners = struct {
	mu sync.Mutex
	m  map[*pgxpool.Pool]*listener
}{m: map[*pgxpool.Pool]*listener{}}

// acquireListener returns pool's listener, starting it for the first user; it stops
// once every user's ctx has ended.
func acquireListener(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) *listener {
	listeners.mu.Lock()
	defer listeners.mu.Unlock()
	l, ok := listeners.m[pool]
	if !ok {
		run, stop := context.WithCancel(context.WithoutCancel(ctx))
		l = &listener{pool: pool, logger: logger, waiters: map[string][]chan struct{}{}, stop: stop}
		listeners.m[pool] = l
		go l.run(run)
	}
	l.refs++
	context.AfterFunc(ctx, func() {
		listeners.mu.Lock()
		defer listeners.mu.Unlock()
		if l.refs--; l.refs == 0 {
			delete(listeners.m, pool)
			l.stop()
		}
	})
	return l
}

func (l *listener) run(ctx context.Context) {
	const firstBackoff = 100 * time.Millisecond
	backoff := firstBackoff
	for ctx.Err() == nil {
		err := l.listen(ctx)
		if l.listening.Swap(false) {
			backoff = firstBackoff // it was listening: a new outage starts
		}
		for _, w := range l.watching() {
			w.lapse(ctx)
		}
		if ctx.Err() != nil {
			return
		}
		l.logger.Warn("notifications lost; subscribers poll, keys and accounts are read on every call, until they are back", "err", err, "retry_in", backoff)
		l.wakeAll() // whatever was announced meanwhile is found by polling
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// A connection a NAT or a firewall has forgotten (half-open) returns no error until TCP
// gives up, minutes later, while announcements are lost: the listener announces itself
// a heartbeat every listenPing and takes the connection for dead when nothing at all
// has been heard on it for listenDead, below maxAwait, so that a commit waiting for
// this server's watcher is released by its lapse, not by giving up.
const (
	listenPing     = time.Second
	listenDead     = 4 * time.Second
	heartbeatTopic = "listener.heartbeat"
)

func (l *listener) listen(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	pc, err := l.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pc.Hijack() // LISTEN belongs to the session: it never goes back to the pool
	defer conn.Close(context.WithoutCancel(ctx))
	listening, stop := context.WithTimeout(ctx, listenDead) // a half-open connection never answers
	_, err = conn.Exec(listening, "LISTEN "+NotifyChannel+"; LISTEN "+WatchChannel)
	stop()
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.listening.Store(true)
	watchers := append([]*Watcher(nil), l.watchers...)
	l.mu.Unlock()
	for _, w := range watchers {
		w.begin()
	}
	l.wakeAll() // anything announced before we listened
	var heard atomic.Int64
	heard.Store(time.Now().UnixNano())
	go l.heartbeat(ctx, &heard, cancel)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil && !errors.Is(cause, context.Canceled) {
				return cause
			}
			return err
		}
		heard.Store(time.Now().UnixNano())
		if n.Channel == WatchChannel {
			l.announce(n.Payload)
			continue
		}
		l.wake(n.Payload)
	}
}

// heartbeat announces heartbeatTopic every listenPing through another connection and
// ends the listening (cancel) once nothing has been heard for listenDead.
func (l *listener) heartbeat(ctx context.Context, heard *atomic.Int64, cancel context.CancelCauseFunc) {
	tick := time.NewTicker(listenPing)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if quiet := time.Since(time.Unix(0, heard.Load())); quiet > listenDead {
			cancel(fmt.Errorf("the listening connection heard nothing, not even its heartbeat, for %v", quiet.Round(time.Millisecond)))
			return
		}
		go func() { // on its own: a ping stuck on a dead connection must not stop the count
			ctx, stop := context.WithTimeout(ctx, listenDead)
			defer stop()
			Notify(ctx, l.pool, heartbeatTopic) //nolint:errcheck // the silence decides
		}()
	}
}

// announce hands a stream announcement to the watchers. One they cannot read makes
// them begin again from the chain's head (it may have named a stream they keep).
func (l *listener) announce(payload string) {
	pos, stream, ok := parseAnnouncement(payload)
	if !ok {
		l.logger.Error("unreadable stream announcement; watchers start again from the head", "payload", payload)
	}
	for _, w := range l.watching() {
		if ok {
			w.apply(pos, stream)
		} else {
			w.distrust()
		}
		w.ack()
	}
}

func (l *listener) watching() []*Watcher {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*Watcher(nil), l.watchers...)
}

// addWatcher makes w hear the announcements until remove is called.
func (l *listener) addWatcher(w *Watcher) (remove func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.watchers = append(l.watchers, w)
	if l.listening.Load() {
		w.begin()
	}
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		for i, x := range l.watchers {
			if x == w {
				l.watchers = append(l.watchers[:i], l.watchers[i+1:]...)
				break
			}
		}
	}
}

func (l *listener) wake(topic string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ch := range l.waiters[topic] {
		select {
		case ch <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
}

func (l *listener) wakeAll() {
	l.mu.Lock()
	topics := make([]string, 0, len(l.waiters))
	for t := range l.waiters {
		topics = append(topics, t)
	}
	l.mu.Unlock()
	for _, t := range topics {
		l.wake(t)
	}
}

// Listening says whether notifications are being received now: while not, a waiter must
// poll.
func (w *Wakeups) Listening() bool { return w.l.listening.Load() }

// Subscribe registers a one-off waiter of topic (a job's event stream): the channel
// receives a value after each announcement (at most one pending), until cancel.
func (w *Wakeups) Subscribe(topic string) (<-chan struct{}, func()) {
	l := w.l
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	l.waiters[topic] = append(l.waiters[topic], ch)
	l.mu.Unlock()
	return ch, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		list := l.waiters[topic]
		for i, c := range list {
			if c == ch {
				list = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(l.waiters, topic)
		} else {
			l.waiters[topic] = list
		}
	}
}

// Waiting says how a subscriber waits when it has caught up.
type Waiting struct {
	// Idle is the longest wait for a notification before asking again anyway.
	Idle time.Duration
	// Poll replaces Idle while notifications are not being received.
	Poll time.Duration
	// Gather is the least time between two queries that announcements started, for a
	// subscriber that has caught up: a busy topic is then read in batches of what
	// Gather brought, not once per commit. Zero for subscribers that must react at once.
	Gather time.Duration
	// Retry is the wait after a failed query.
	Retry time.Duration
}

// Backoff is the Watermill BackoffManager of a subscriber of topic. While queries find
// messages it lets the subscriber go on at once. When one finds nothing, it waits
// until topic is announced (or for Idle), and at least until Gather has passed since
// the previous wait ended. A wake-up that came while the subscriber was querying is
// kept, so none is lost. Errors are handled as Watermill's default manager does.
//
// An announcement can come before what it announces is readable: Watermill reads a
// topic only below the oldest transaction still open (pg_snapshot_xmin), so a commit
// made while an older transaction runs (a settle, another worker's record) stays out
// of sight until that one ends, and no second announcement comes when it does. A
// query after an announcement that finds nothing therefore asks again soon: after
// Poll, steadyAsks times, then twice as long each time while that is under half of
// Idle (with Idle 1 s and Poll 10 ms, fifteen queries in 720 ms), and only then waits
// Idle. The first asks keep to Poll because what holds a commit back is usually a
// transaction of a few milliseconds that a busy machine stretches to tens (a settle,
// a record, another subscriber's read): doubling from the start read such a commit
// up to twice that late (a job's SSE stream 64 ms after the commit beside 200 settles
// a second, docs/BENCHMARKS.md session 29). When queries after the announcement found
// messages, the first empty one asks again once, after Poll (the announcement may
// stand for another commit not yet readable).
func (w *Wakeups) Backoff(topic string, how Waiting) wmsql.BackoffManager {
	ch, cancel := w.Subscribe(topic)
	context.AfterFunc(w.ctx, cancel) // the listener may outlive this subscriber
	return &wakeBackoff{w: w, ch: ch, how: how, errors: wmsql.NewDefaultBackoffManager(how.Poll, how.Retry)}
}

type wakeBackoff struct {
	w      *Wakeups
	ch     <-chan struct{}
	how    Waiting
	errors wmsql.BackoffManager
	last   time.Time // when the last wait that an announcement ended, ended
	// announced: the last wait ended on an announcement and no query has found nothing
	// since; found: a query since that announcement found messages; again: the wait
	// after the next empty query while what was announced may still be out of sight
	// (0: nothing is); asked: the empty queries since the announcement
	announced, found bool
	again            time.Duration
	asked            int
}

// steadyAsks is how many empty queries after an announcement ask again after Poll
// before the waits double (see Backoff).
const steadyAsks = 10

func (b *wakeBackoff) HandleError(logger watermill.LoggerAdapter, noMsg bool, err error) time.Duration {
	if err != nil {
		select {
		case <-b.w.ctx.Done():
			return 0 // shutting down: the subscriber is about to stop
		default:
		}
		return b.errors.HandleError(logger, noMsg, err)
	}
	if !noMsg {
		// announced stays: one announcement can stand for commits of which some are
		// readable and some not yet, so the first empty query asks again once too
		b.found, b.again = true, 0
		return 0
	}
	wait := b.how.Idle
	if !b.w.Listening() {
		wait = b.how.Poll
	}
	switch {
	case b.announced: // what woke the subscriber may not be readable yet
		wait = min(wait, max(b.how.Poll, time.Millisecond))
		b.announced, b.again, b.asked = false, 0, 1
		if !b.found { // none of it was: ask again, and again, then for longer
			b.again = wait
		}
	case b.again > 0: // nor after the last asking again
		if b.asked++; b.asked > steadyAsks {
			b.again *= 2
		}
		if b.again >= b.how.Idle/2 {
			b.again = 0
		} else {
			wait = min(wait, b.again)
		}
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-b.ch:
		b.announced, b.found, b.again = true, false, 0
	case <-t.C:
		return 0 // asking again, or Idle: not a read of what was announced, nothing to gather
	case <-b.w.ctx.Done():
		return 0
	}
	if rest := b.how.Gather - time.Since(b.last); rest > 0 {
		select {
		case <-time.After(rest):
		case <-b.w.ctx.Done():
		}
	}
	b.last = time.Now()
	return 0
}
