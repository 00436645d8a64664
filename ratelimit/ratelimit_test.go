package ratelimit

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fakeClock is a clock that moves only when told to; safe for concurrent use. The
// limiter sends its instant as the database's too.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) Now() time.Time           { return t0.Add(time.Duration(c.ns.Load())) }
func (c *fakeClock) Advance(d time.Duration)  { c.ns.Add(int64(d)) }
func (c *fakeClock) Set(since0 time.Duration) { c.ns.Store(int64(since0)) }

// newTestLimiter returns a limiter on a fresh database with a fake clock.
func newTestLimiter(t testing.TB) (*Limiter, *fakeClock) {
	t.Helper()
	ls, c, _ := newServers(t, 1)
	return ls[0], c
}

// newServers returns n limiters on one fresh database, as n servers would have, sharing
// one fake clock.
func newServers(t testing.TB, n int) ([]*Limiter, *fakeClock, *pgxpool.Pool) {
	t.Helper()
	pool := pgtest.NewDB(t)
	c := &fakeClock{}
	ls := make([]*Limiter, n)
	for i := range ls {
		ls[i] = New(pool, nil, WithClock(c.Now))
	}
	return ls, c, pool
}

var (
	perKey = Policy{Name: "key", Limit: 120, Window: time.Minute}
	perIP  = Policy{Name: "ip", Limit: 5, Window: 10 * time.Second}
)

func TestBurstThenDeny(t *testing.T) {
	t.Parallel()
	for _, p := range []Policy{
		{Name: "one", Limit: 1, Window: time.Second},
		perIP,
		perKey,
		{Name: "odd", Limit: 7, Window: time.Second},        // interval does not divide the window
		{Name: "day", Limit: 10000, Window: 24 * time.Hour}, // served from leases
	} {
		t.Run(p.Name, func(t *testing.T) {
			t.Parallel()
			l, _ := newTestLimiter(t)
			ctx := t.Context()
			for i := range p.Limit {
				d := l.Allow(ctx, "k", p)
				if !d.Allowed || d.Remaining != p.Limit-1-i || d.Limit != p.Limit || d.RetryAfter != 0 || d.Unchecked {
					t.Fatalf("request %d: got %+v, want allowed with remaining %d", i+1, d, p.Limit-1-i)
				}
			}
			for i := range 3 {
				d := l.Allow(ctx, "k", p)
				if d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 {
					t.Fatalf("request %d past the limit: got %+v, want denied", i+1, d)
				}
			}
		})
	}
}

func TestRefill(t *testing.T) {
	t.Parallel()
	for _, p := range []Policy{perKey, perIP, {Name: "odd", Limit: 7, Window: time.Second}} {
		t.Run(p.Name, func(t *testing.T) {
			t.Parallel()
			l, c := newTestLimiter(t)
			ctx := t.Context()
			for range p.Limit {
				l.Allow(ctx, "k", p)
			}
			interval := p.Window / time.Duration(p.Limit)
			c.Advance(interval - 1)
			if d := l.Allow(ctx, "k", p); d.Allowed || d.RetryAfter != 1 {
				t.Fatalf("1ns before the refill: got %+v, want denied with RetryAfter 1ns", d)
			}
			c.Advance(1)
			if d := l.Allow(ctx, "k", p); !d.Allowed || d.Remaining != 0 {
				t.Fatalf("at the refill: got %+v, want allowed with remaining 0", d)
			}
			if d := l.Allow(ctx, "k", p); d.Allowed || d.RetryAfter != interval {
				t.Fatalf("after the refilled token: got %+v, want denied with RetryAfter %v", d, interval)
			}
			// A whole window idle refills the bucket completely, and no further.
			c.Advance(10 * p.Window)
			n := 0
			for l.Allow(ctx, "k", p).Allowed {
				n++
			}
			if n != p.Limit {
				t.Fatalf("after a long idle: %d admitted, want %d", n, p.Limit)
			}
		})
	}
}

// TestExactValues walks the 120/minute policy (one token per 500ms) through chosen
// instants and checks every number a client would see, alternating between two servers.
func TestExactValues(t *testing.T) {
	t.Parallel()
	type step struct {
		at         time.Duration // since the start
		n          int           // requests made at that instant; the last is checked
		allowed    bool
		remaining  int
		reset      time.Duration
		retryAfter time.Duration
		header     string
		retrySecs  int
	}
	steps := []step{
		{at: 0, n: 1, allowed: true, remaining: 119, reset: 500 * time.Millisecond, header: `"key";r=119;t=1`},
		{at: 0, n: 119, allowed: true, remaining: 0, reset: time.Minute, header: `"key";r=0;t=60`},
		{at: 0, n: 1, allowed: false, remaining: 0, reset: time.Minute, retryAfter: 500 * time.Millisecond, header: `"key";r=0;t=60`, retrySecs: 1},
		// 10s later 20 tokens are back: one taken leaves 19; full again 50.5s on.
		{at: 10 * time.Second, n: 1, allowed: true, remaining: 19, reset: 50500 * time.Millisecond, header: `"key";r=19;t=51`},
		{at: 10 * time.Second, n: 19, allowed: true, remaining: 0, reset: 60 * time.Second, header: `"key";r=0;t=60`},
		// 250ms later: half a token, not enough.
		{at: 10250 * time.Millisecond, n: 1, allowed: false, remaining: 0, reset: 59750 * time.Millisecond, retryAfter: 250 * time.Millisecond, header: `"key";r=0;t=60`, retrySecs: 1},
		// 1.75s later 3.5 tokens: remaining counts whole ones.
		{at: 11750 * time.Millisecond, n: 1, allowed: true, remaining: 2, reset: 58750 * time.Millisecond, header: `"key";r=2;t=59`},
		// Two more take them; the third is denied, half a token short.
		{at: 11750 * time.Millisecond, n: 3, allowed: false, remaining: 0, reset: 59750 * time.Millisecond, retryAfter: 250 * time.Millisecond, header: `"key";r=0;t=60`, retrySecs: 1},
		// At the reset instant the bucket is full again.
		{at: 71500 * time.Millisecond, n: 1, allowed: true, remaining: 119, reset: 500 * time.Millisecond, header: `"key";r=119;t=1`},
	}
	ls, c, _ := newServers(t, 2)
	calls := 0
	for i, s := range steps {
		c.Set(s.at)
		var d Decision
		for range s.n {
			d = ls[calls%2].Allow(t.Context(), "key:k1", perKey)
			calls++
		}
		want := Decision{Allowed: s.allowed, Limit: 120, Remaining: s.remaining, Reset: s.reset, RetryAfter: s.retryAfter, Policy: perKey}
		if d != want {
			t.Fatalf("step %d at %v:\n got %+v\nwant %+v", i, s.at, d, want)
		}
		if got := d.Header(); got != s.header {
			t.Errorf("step %d: Header() = %s, want %s", i, got, s.header)
		}
		if got := d.RetryAfterSeconds(); got != s.retrySecs {
			t.Errorf("step %d: RetryAfterSeconds() = %d, want %d", i, got, s.retrySecs)
		}
	}
}

func TestRetryAfterAcrossSeconds(t *testing.T) {
	t.Parallel()
	// One request per 90s: after the first, the next is 90s away.
	p := Policy{Name: "slow", Limit: 1, Window: 90 * time.Second}
	l, c := newTestLimiter(t)
	l.Allow(t.Context(), "k", p)
	c.Advance(200 * time.Millisecond)
	d := l.Allow(t.Context(), "k", p)
	if d.Allowed || d.RetryAfter != 89800*time.Millisecond || d.RetryAfterSeconds() != 90 || d.Header() != `"slow";r=0;t=90` {
		t.Fatalf("got %+v (retry %ds, %s)", d, d.RetryAfterSeconds(), d.Header())
	}
}

// countBuckets is the number of rows in the shared table.
func countBuckets(t testing.TB, db DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM ratelimit_buckets`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestIndependentKeysAndPolicies(t *testing.T) {
	t.Parallel()
	ls, _, pool := newServers(t, 1)
	l, ctx := ls[0], t.Context()
	for range perIP.Limit {
		l.Allow(ctx, "ip:192.0.2.1", perIP)
	}
	if d := l.Allow(ctx, "ip:192.0.2.1", perIP); d.Allowed {
		t.Fatalf("exhausted key admitted: %+v", d)
	}
	if d := l.Allow(ctx, "ip:192.0.2.2", perIP); !d.Allowed || d.Remaining != perIP.Limit-1 {
		t.Fatalf("another key is affected: %+v", d)
	}
	// The same key under another policy name has its own bucket.
	if d := l.Allow(ctx, "ip:192.0.2.1", perKey); !d.Allowed || d.Remaining != perKey.Limit-1 {
		t.Fatalf("another policy is affected: %+v", d)
	}
	burst := Policy{Name: "burst", Limit: perIP.Limit, Window: perIP.Window}
	if d := l.Allow(ctx, "ip:192.0.2.1", burst); !d.Allowed || d.Remaining != burst.Limit-1 {
		t.Fatalf("same numbers, other name is affected: %+v", d)
	}
	if got := countBuckets(t, pool); got != 4 {
		t.Fatalf("%d buckets, want 4", got)
	}
}

// TestConcurrentFrozenClockAdmitsExactlyLimit races goroutines of several servers on one
// new bucket (the row is created by one of them) and through leases.
func TestConcurrentFrozenClockAdmitsTheLimit(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{97, 1234} { // a round trip per call; leases of up to 12
		t.Run(strconv.Itoa(limit), func(t *testing.T) {
			t.Parallel()
			const servers, goroutines, calls = 4, 8, 60
			p := Policy{Name: "key", Limit: limit, Window: time.Hour}
			ls, _, _ := newServers(t, servers)
			var admitted atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for g := range servers * goroutines {
				wg.Go(func() {
					<-start
					for range calls {
						if d := ls[g%servers].Allow(context.Background(), "key:shared", p); d.Allowed {
							admitted.Add(1)
						} else if d.Unchecked {
							t.Error("unchecked decision")
						}
					}
				})
			}
			close(start)
			wg.Wait()
			// Without leases (limit < 200) every call is decided by the shared bucket: exactly
			// the limit. With them, a server whose callers are all done may be left
			// holding up to one lease of unused tokens, which lapse: never more than the
			// limit, and at most a lease per server less.
			got, lo := admitted.Load(), int64(limit)
			if limit >= 200 {
				lo -= int64(servers * (limit / 100))
			}
			if got > int64(limit) || got < lo {
				t.Fatalf("admitted %d of %d calls, want %d to %d", got, servers*goroutines*calls, lo, limit)
			}
		})
	}
}

func TestConcurrentManyKeys(t *testing.T) {
	t.Parallel()
	const goroutines, keys, limit = 8, 50, 10
	p := Policy{Name: "ip", Limit: limit, Window: time.Minute}
	ls, _, _ := newServers(t, 2)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range keys * limit {
				if ls[g%2].Allow(context.Background(), "ip:"+strconv.Itoa((i+g)%keys), p).Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != keys*limit {
		t.Fatalf("admitted %d, want %d", got, keys*limit)
	}
}

// TestSweep: buckets full again by the database's clock go, the others stay, and a
// swept bucket starts full, as if kept.
func TestSweep(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewDB(t)
	ctx := t.Context()
	past := &fakeClock{}
	past.Set(-time.Since(t0) - 24*time.Hour) // yesterday: their buckets are full now
	idle := New(pool, nil, WithClock(past.Now))
	for i := range 100 {
		idle.Allow(ctx, "idle-"+strconv.Itoa(i), perKey)
	}
	busy := New(pool, nil) // the database's own clock
	slow := Policy{Name: "slow", Limit: 2, Window: time.Hour}
	busy.Allow(ctx, "busy", slow)
	if got := countBuckets(t, pool); got != 101 {
		t.Fatalf("%d buckets before the sweep, want 101", got)
	}
	n, err := Sweep(ctx, pool)
	if err != nil || n != 100 {
		t.Fatalf("Sweep = %d, %v; want the 100 idle buckets", n, err)
	}
	if got := countBuckets(t, pool); got != 1 {
		t.Fatalf("%d buckets after the sweep, want 1 (busy)", got)
	}
	if d := busy.Allow(ctx, "busy", slow); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("busy bucket lost its state: %+v", d)
	}
	if d := New(pool, nil, WithClock(past.Now)).Allow(ctx, "idle-0", perKey); !d.Allowed || d.Remaining != 119 {
		t.Fatalf("swept bucket: %+v", d)
	}
}

func TestClockSteppingBack(t *testing.T) {
	t.Parallel()
	ls, c, _ := newServers(t, 2)
	c.Set(time.Hour)
	for range perIP.Limit {
		ls[0].Allow(t.Context(), "k", perIP)
	}
	c.Set(time.Hour - 30*time.Second) // the database's clock stepped back 30s
	d := ls[1].Allow(t.Context(), "k", perIP)
	if d.Allowed || d.Remaining != 0 || d.Reset != 40*time.Second || d.RetryAfter != 32*time.Second {
		t.Fatalf("got %+v, want denied, remaining 0, reset 40s, retry 32s", d)
	}
}

func TestAllowPanicsOnUnusablePolicy(t *testing.T) {
	t.Parallel()
	for _, p := range []Policy{
		{Name: "zero", Limit: 0, Window: time.Second},
		{Name: "negative", Limit: -1, Window: time.Second},
		{Name: "nowindow", Limit: 1},
		{Name: "tiny", Limit: 10, Window: 9},
	} {
		t.Run(p.Name, func(t *testing.T) {
			t.Parallel()
			l := New(nil, nil) // never reaches the database
			defer func() {
				if recover() == nil {
					t.Fatalf("Allow(%+v) did not panic", p)
				}
			}()
			l.Allow(t.Context(), "k", p)
		})
	}
}

func TestPolicyValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		p  Policy
		ok bool
	}{
		{perKey, true},
		{perIP, true},
		{Policy{Name: `we"ird\name`, Limit: 1, Window: time.Second}, true},
		{Policy{Name: "", Limit: 1, Window: time.Second}, false},
		{Policy{Name: "k\n", Limit: 1, Window: time.Second}, false},
		{Policy{Name: "é", Limit: 1, Window: time.Second}, false},
		{Policy{Name: "k", Limit: 0, Window: time.Second}, false},
		{Policy{Name: "k", Limit: 1, Window: 0}, false},
		{Policy{Name: "k", Limit: 1, Window: 500 * time.Millisecond}, false},
		{Policy{Name: "k", Limit: 1, Window: 1500 * time.Millisecond}, false},
	} {
		t.Run(fmt.Sprintf("%q/%d/%v", tc.p.Name, tc.p.Limit, tc.p.Window), func(t *testing.T) {
			t.Parallel()
			if err := tc.p.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func BenchmarkAllowRoundTrip(b *testing.B) {
	l := New(pgtest.NewDB(b), nil)
	p := Policy{Name: "key", Limit: 199, Window: time.Nanosecond * 199} // Block 1: always a round trip
	b.ReportAllocs()
	for b.Loop() {
		l.Allow(context.Background(), "key:k1", p)
	}
}

func BenchmarkAllowLeased(b *testing.B) {
	l := New(pgtest.NewDB(b), nil)
	p := Policy{Name: "key", Limit: 1 << 20, Window: time.Second}
	b.ReportAllocs()
	for b.Loop() {
		l.Allow(context.Background(), "key:k1", p)
	}
}
