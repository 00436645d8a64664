package eventstore

import (
	"context"
	"database/sql"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/postgres/pgtest"
)

// Every Wakeups of a pool shares one listener, which outlives a user whose context
// ends: that user's waiters go with it, and the listener stops with its last user.
func TestWakeupsShareOneListener(t *testing.T) {
	s := newStore(t)
	long, stopLong := context.WithCancel(context.Background())
	defer stopLong()
	short, stopShort := context.WithCancel(context.Background())
	a, b := Listen(long, s.pool, watchLogger()), Listen(short, s.pool, watchLogger())
	if a.l != b.l {
		t.Fatal("two users of one pool got two listeners")
	}
	waiters := func() int {
		a.l.mu.Lock()
		defer a.l.mu.Unlock()
		return len(a.l.waiters["topic"])
	}
	a.Backoff("topic", Waiting{Idle: time.Second, Poll: time.Second, Retry: time.Second})
	b.Backoff("topic", Waiting{Idle: time.Second, Poll: time.Second, Retry: time.Second})
	if n := waiters(); n != 2 {
		t.Fatalf("%d waiters, want 2", n)
	}
	stopShort()
	pgtest.WaitFor(t, "the ended user's waiter goes", func() bool { return waiters() == 1 })
	listeners.mu.Lock()
	shared := listeners.m[s.pool] == a.l
	listeners.mu.Unlock()
	if !shared {
		t.Fatal("the listener stopped while a user remains")
	}
	stopLong()
	pgtest.WaitFor(t, "the listener stops with its last user", func() bool {
		listeners.mu.Lock()
		defer listeners.mu.Unlock()
		_, ok := listeners.m[s.pool]
		return !ok
	})
}

// A commit announced while an older transaction is still open is out of Watermill's
// sight (it reads below pg_snapshot_xmin) when the announcement wakes the subscriber,
// and nothing announces the older transaction's end. The subscriber still reads the
// commit soon after that end, not after its Idle wait (a minute here): whether the
// query after the announcement found nothing, or found another commit of the same
// announcement that was readable (then it asks again once, after Poll).
func TestASubscriberReadsAnAnnouncedCommitOnceOlderTransactionsEnd(t *testing.T) {
	f := newSubscribed(t, Waiting{Idle: time.Minute, Poll: 50 * time.Millisecond, Retry: time.Second})
	f.commit("first")
	f.receive("first") // the subscriber has caught up and waits for announcements

	older := f.begin() // holds back xmin from now on
	f.commit("second")
	f.polls.mark.Store(time.Now().UnixNano())
	// the announcement wakes the subscriber, whose query finds nothing yet
	pgtest.WaitFor(t, "a query after the announced commit", func() bool { return f.polls.after.Load() > 0 })
	select {
	case m := <-f.msgs:
		t.Fatalf("%q read while an older transaction was open: the test no longer shows the case", m.Payload)
	default:
	}
	if err := older.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.receive("second")
}

// The waits after the queries that follow an announcement, by what the queries found:
// nothing, and the subscriber asks again after Poll, twice as long each time while that
// is under half of Idle, then waits Idle; something, then nothing, and it asks again
// once (the announcement may stand for a commit not readable yet), then waits Idle.
func TestBackoffAsksAgainAfterAnAnnouncementUntilItIsRead(t *testing.T) {
	const poll, idle = 20 * time.Millisecond, 2 * time.Second
	for _, tc := range []struct {
		name    string
		found   bool            // the first query after the announcement found messages
		again   []time.Duration // the waits after the empty queries that follow, before one of Idle
		pending bool
	}{
		{"nothing found", false, append(slices.Repeat([]time.Duration{poll}, steadyAsks), 2*poll, 4*poll, 8*poll, 16*poll, 32*poll), true},
		{"something found, then nothing", true, []time.Duration{poll}, true},
		{"no announcement", false, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			l := &listener{}
			l.listening.Store(true)
			ch := make(chan struct{}, 1)
			b := &wakeBackoff{w: &Wakeups{l: l, ctx: ctx}, ch: ch, how: Waiting{Idle: idle, Poll: poll, Retry: time.Second}}
			took := func(noMsg bool) time.Duration {
				start := time.Now()
				b.HandleError(nil, noMsg, nil)
				return time.Since(start)
			}
			if tc.pending {
				ch <- struct{}{}
				if d := took(true); d > idle/2 {
					t.Fatalf("the wait with an announcement pending took %v", d)
				}
			}
			if tc.found {
				took(false)
			}
			for i, want := range tc.again {
				if d := took(true); d < want || d > want+idle/4 {
					t.Fatalf("wait %d after the announcement took %v, want %v", i, d, want)
				}
			}
			if d := took(true); d < idle {
				t.Fatalf("the wait after asking again %d times took %v, want Idle (%v)", len(tc.again), d, idle)
			}
		})
	}
}

// subscribed is a Watermill subscriber of one topic, waiting as the projections' do,
// and what a test does with it.
type subscribed struct {
	t     *testing.T
	ctx   context.Context
	pool  *pgxpool.Pool
	topic string
	polls *pollCounter
	msgs  <-chan *message.Message
}

func newSubscribed(t *testing.T, how Waiting) *subscribed {
	s := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f := &subscribed{t: t, ctx: ctx, pool: s.pool, topic: "wake_behind_older", polls: &pollCounter{Beginner: wmsql.BeginnerFromPgx(s.pool)}}
	sub, err := wmsql.NewSubscriber(f.polls, wmsql.SubscriberConfig{
		ConsumerGroup:    "test",
		SchemaAdapter:    wmsql.DefaultPostgreSQLSchema{GeneratePayloadType: BusSchema.GeneratePayloadType},
		OffsetsAdapter:   wmsql.DefaultPostgreSQLOffsetsAdapter{},
		BackoffManager:   Listen(ctx, s.pool, watchLogger()).Backoff(f.topic, how),
		InitializeSchema: true,
	}, watermill.NewSlogLogger(watchLogger()))
	if err != nil {
		t.Fatal(err)
	}
	if f.msgs, err = sub.Subscribe(ctx, f.topic); err != nil {
		t.Fatal(err)
	}
	return f
}

// begin opens a transaction with a transaction id of its own (rolled back at the end
// unless committed).
func (f *subscribed) begin() pgx.Tx {
	f.t.Helper()
	tx, err := f.pool.Begin(f.ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { tx.Rollback(context.Background()) }) //nolint:errcheck // committed, or never
	if _, err := tx.Exec(f.ctx, `SELECT pg_current_xact_id()`); err != nil {
		f.t.Fatal(err)
	}
	return tx
}

// publish puts body on the topic in tx and announces it at tx's commit.
func (f *subscribed) publish(tx pgx.Tx, body string) {
	f.t.Helper()
	q, err := BusSchema.InsertQuery(wmsql.InsertQueryParams{Topic: f.topic, Msgs: message.Messages{message.NewMessage(watermill.NewUUID(), []byte(body))}})
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := tx.Exec(f.ctx, q.Query, q.Args...); err != nil {
		f.t.Fatal(err)
	}
	if err := Notify(f.ctx, tx, f.topic); err != nil {
		f.t.Fatal(err)
	}
}

// commit publishes body in a transaction of its own.
func (f *subscribed) commit(body string) {
	f.t.Helper()
	if err := pgx.BeginFunc(f.ctx, f.pool, func(tx pgx.Tx) error { f.publish(tx, body); return nil }); err != nil {
		f.t.Fatal(err)
	}
}

// receive waits up to 10 s for the next message, which must be want.
func (f *subscribed) receive(want string) {
	f.t.Helper()
	select {
	case m := <-f.msgs:
		m.Ack()
		if got := string(m.Payload); got != want {
			f.t.Fatalf("received %q, want %q", got, want)
		}
	case <-time.After(10 * time.Second):
		f.t.Fatalf("%q not received within 10 s", want)
	}
}

// pollCounter counts the subscriber's transactions (one a query) that began after
// mark and have ended.
type pollCounter struct {
	wmsql.Beginner
	mark, after atomic.Int64
}

func (p *pollCounter) BeginTx(ctx context.Context, opts *sql.TxOptions) (wmsql.Tx, error) {
	began := time.Now().UnixNano()
	tx, err := p.Beginner.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &countedTx{Tx: tx, p: p, began: began}, nil
}

type countedTx struct {
	wmsql.Tx
	p     *pollCounter
	began int64
}

func (t *countedTx) Commit() error   { defer t.ended(); return t.Tx.Commit() }
func (t *countedTx) Rollback() error { defer t.ended(); return t.Tx.Rollback() }

func (t *countedTx) ended() {
	if mark := t.p.mark.Load(); mark > 0 && t.began > mark {
		t.p.after.Add(1)
	}
}

// A listening connection that goes silent without an error (half-open: a NAT or a
// firewall forgot it) is taken for dead within listenDead, so that nobody trusts
// announcements it no longer carries, and the listener listens again once the
// database can be reached. A healthy one, idle, is not.
func TestListenerNoticesASilentConnection(t *testing.T) {
	proxy, url := pgtest.NewProxy(t, pgtest.URL(t))
	pool := pgtest.NewDBAt(t, url)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := Listen(ctx, pool, watchLogger())
	pgtest.WaitFor(t, "listening", w.Listening)
	for end := time.Now().Add(listenDead + 2*listenPing); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if !w.Listening() {
			t.Fatal("an idle, healthy listening connection was taken for dead")
		}
	}
	proxy.Silence()
	silenced := time.Now()
	pgtest.WaitFor(t, "the silent connection taken for dead", func() bool { return !w.Listening() })
	if took := time.Since(silenced); took > listenDead+2*listenPing {
		t.Fatalf("a silent connection was trusted for %v", took)
	}
	proxy.Down() // the forgotten connections go; new ones pass
	proxy.Up()
	pgtest.WaitFor(t, "listening again", w.Listening)
}
