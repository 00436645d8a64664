package eventstore

import (
	"context"
	"testing"
	"time"

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
