package eventstore

import (
	"context"
	"database/sql"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

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
// commit soon after that end, not after its Idle wait (a minute here).
func TestASubscriberReadsAnAnnouncedCommitOnceOlderTransactionsEnd(t *testing.T) {
	s := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const topic = "wake_behind_older"
	polls := &pollCounter{Beginner: wmsql.BeginnerFromPgx(s.pool)}
	logger := watermill.NewSlogLogger(watchLogger())
	sub, err := wmsql.NewSubscriber(polls, wmsql.SubscriberConfig{
		ConsumerGroup:    "test",
		SchemaAdapter:    wmsql.DefaultPostgreSQLSchema{GeneratePayloadType: BusSchema.GeneratePayloadType},
		OffsetsAdapter:   wmsql.DefaultPostgreSQLOffsetsAdapter{},
		BackoffManager:   Listen(ctx, s.pool, watchLogger()).Backoff(topic, Waiting{Idle: time.Minute, Poll: 50 * time.Millisecond, Retry: time.Second}),
		InitializeSchema: true,
	}, logger)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	publish := func(tx pgx.Tx, body string) {
		t.Helper()
		q, err := BusSchema.InsertQuery(wmsql.InsertQueryParams{Topic: topic, Msgs: message.Messages{message.NewMessage(watermill.NewUUID(), []byte(body))}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, q.Query, q.Args...); err != nil {
			t.Fatal(err)
		}
		if err := Notify(ctx, tx, topic); err != nil {
			t.Fatal(err)
		}
	}
	receive := func(want string) {
		t.Helper()
		select {
		case m := <-msgs:
			m.Ack()
			if got := string(m.Payload); got != want {
				t.Fatalf("received %q, want %q", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%q not received within 10 s", want)
		}
	}
	commit := func(body string) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { publish(tx, body); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	commit("first")
	receive("first") // the subscriber has caught up and waits for announcements

	older, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer older.Rollback(ctx)                                                 //nolint:errcheck // committed below
	if _, err := older.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil { // it holds back xmin from now on
		t.Fatal(err)
	}
	commit("second")
	polls.mark.Store(time.Now().UnixNano())
	// the announcement wakes the subscriber, whose query finds nothing yet
	pgtest.WaitFor(t, "a query after the announced commit", func() bool { return polls.after.Load() > 0 })
	select {
	case m := <-msgs:
		t.Fatalf("%q read while an older transaction was open: the test no longer shows the case", m.Payload)
	default:
	}
	if err := older.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	receive("second")
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
