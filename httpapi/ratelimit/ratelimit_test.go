package ratelimit

import (
	"fmt"
	"hash/maphash"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fakeClock is a clock that moves only when told to; safe for concurrent use.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) Now() time.Time           { return t0.Add(time.Duration(c.ns.Load())) }
func (c *fakeClock) Advance(d time.Duration)  { c.ns.Add(int64(d)) }
func (c *fakeClock) Set(since0 time.Duration) { c.ns.Store(int64(since0)) }

func newTestLimiter(t testing.TB, opts ...Option) (*Limiter, *fakeClock) {
	t.Helper()
	c := &fakeClock{}
	return New(append([]Option{WithClock(c.Now)}, opts...)...), c
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
		{Name: "odd", Limit: 7, Window: time.Second}, // interval does not divide the window
		{Name: "day", Limit: 10000, Window: 24 * time.Hour},
	} {
		t.Run(p.Name, func(t *testing.T) {
			t.Parallel()
			l, _ := newTestLimiter(t)
			for i := range p.Limit {
				d := l.Allow("k", p)
				if !d.Allowed || d.Remaining != p.Limit-1-i || d.Limit != p.Limit || d.RetryAfter != 0 {
					t.Fatalf("request %d: got %+v, want allowed with remaining %d", i+1, d, p.Limit-1-i)
				}
			}
			for i := range 3 {
				d := l.Allow("k", p)
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
			for range p.Limit {
				l.Allow("k", p)
			}
			interval := p.Window / time.Duration(p.Limit)
			c.Advance(interval - 1)
			if d := l.Allow("k", p); d.Allowed || d.RetryAfter != 1 {
				t.Fatalf("1ns before the refill: got %+v, want denied with RetryAfter 1ns", d)
			}
			c.Advance(1)
			if d := l.Allow("k", p); !d.Allowed || d.Remaining != 0 {
				t.Fatalf("at the refill: got %+v, want allowed with remaining 0", d)
			}
			if d := l.Allow("k", p); d.Allowed || d.RetryAfter != interval {
				t.Fatalf("after the refilled token: got %+v, want denied with RetryAfter %v", d, interval)
			}
			// A whole window idle refills the bucket completely, and no further.
			c.Advance(10 * p.Window)
			n := 0
			for l.Allow("k", p).Allowed {
				n++
			}
			if n != p.Limit {
				t.Fatalf("after a long idle: %d admitted, want %d", n, p.Limit)
			}
		})
	}
}

// TestExactValues walks the 120/minute policy (one token per 500ms) through chosen
// instants and checks every number a client would see.
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
	l, c := newTestLimiter(t)
	for i, s := range steps {
		c.Set(s.at)
		var d Decision
		for range s.n {
			d = l.Allow("key:k1", perKey)
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
	l.Allow("k", p)
	c.Advance(200 * time.Millisecond)
	d := l.Allow("k", p)
	if d.Allowed || d.RetryAfter != 89800*time.Millisecond || d.RetryAfterSeconds() != 90 || d.Header() != `"slow";r=0;t=90` {
		t.Fatalf("got %+v (retry %ds, %s)", d, d.RetryAfterSeconds(), d.Header())
	}
}

func TestIndependentKeysAndPolicies(t *testing.T) {
	t.Parallel()
	l, _ := newTestLimiter(t)
	for range perIP.Limit {
		l.Allow("ip:192.0.2.1", perIP)
	}
	if d := l.Allow("ip:192.0.2.1", perIP); d.Allowed {
		t.Fatalf("exhausted key admitted: %+v", d)
	}
	if d := l.Allow("ip:192.0.2.2", perIP); !d.Allowed || d.Remaining != perIP.Limit-1 {
		t.Fatalf("another key is affected: %+v", d)
	}
	// The same key under another policy name has its own bucket.
	if d := l.Allow("ip:192.0.2.1", perKey); !d.Allowed || d.Remaining != perKey.Limit-1 {
		t.Fatalf("another policy is affected: %+v", d)
	}
	burst := Policy{Name: "burst", Limit: perIP.Limit, Window: perIP.Window}
	if d := l.Allow("ip:192.0.2.1", burst); !d.Allowed || d.Remaining != burst.Limit-1 {
		t.Fatalf("same numbers, other name is affected: %+v", d)
	}
	if got := l.Len(); got != 4 {
		t.Fatalf("Len() = %d, want 4", got)
	}
}

func TestConcurrentFrozenClockAdmitsExactlyLimit(t *testing.T) {
	t.Parallel()
	const goroutines, calls, limit = 50, 200, 1234
	p := Policy{Name: "key", Limit: limit, Window: time.Hour}
	l, _ := newTestLimiter(t)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range goroutines {
		wg.Go(func() {
			<-start
			for range calls {
				if l.Allow("key:shared", p).Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if got := admitted.Load(); got != limit {
		t.Fatalf("admitted %d of %d calls, want exactly %d", got, goroutines*calls, limit)
	}
}

func TestConcurrentManyKeys(t *testing.T) {
	t.Parallel()
	const goroutines, keys, limit = 16, 100, 10
	p := Policy{Name: "ip", Limit: limit, Window: time.Minute}
	l, c := newTestLimiter(t)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range keys * limit {
				if l.Allow("ip:"+strconv.Itoa((i+g)%keys), p).Allowed {
					admitted.Add(1)
				}
				if i%97 == 0 {
					l.Sweep(c.Now()) // sweeps race with Allow; nothing is full, nothing goes
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != keys*limit {
		t.Fatalf("admitted %d, want %d", got, keys*limit)
	}
}

func TestSweep(t *testing.T) {
	t.Parallel()
	l, c := newTestLimiter(t, WithSweepInterval(0))
	// idle-i: one request each at 0 (full again at 500ms).
	// busy: the whole burst at 0, then one request every 30s (never full in between).
	for i := range 100 {
		l.Allow("idle-"+strconv.Itoa(i), perKey)
	}
	for range perKey.Limit {
		l.Allow("busy", perKey)
	}
	if got := l.Sweep(c.Now()); got != 0 {
		t.Fatalf("Sweep at 0 dropped %d, want 0", got)
	}
	c.Advance(30 * time.Second)
	l.Allow("busy", perKey)
	if got := l.Sweep(c.Now()); got != 100 {
		t.Fatalf("Sweep at 30s dropped %d, want the 100 idle keys", got)
	}
	if got := l.Len(); got != 1 {
		t.Fatalf("Len() = %d after sweep, want 1 (busy)", got)
	}
	d := l.Allow("busy", perKey)
	if !d.Allowed || d.Remaining != 58 {
		t.Fatalf("busy key lost its state: %+v", d)
	}
	// A dropped key starts again full, exactly as if kept.
	if d := l.Allow("idle-0", perKey); !d.Allowed || d.Remaining != 119 {
		t.Fatalf("swept key: %+v", d)
	}
	// Once busy goes quiet for its whole reset, it goes too.
	c.Advance(d.Reset + 31*time.Second)
	if got := l.Sweep(c.Now()); got != 2 || l.Len() != 0 {
		t.Fatalf("final sweep dropped %d, Len %d; want 2 and 0", got, l.Len())
	}
}

// keyInShard returns a key that hashes to shard i of l.
func keyInShard(t *testing.T, l *Limiter, i int, prefix string) string {
	t.Helper()
	for n := 0; ; n++ {
		k := prefix + strconv.Itoa(n)
		if int(maphash.String(l.seed, k)&(numShards-1)) == i {
			return k
		}
	}
}

func TestAmortisedSweep(t *testing.T) {
	t.Parallel()
	l, c := newTestLimiter(t, WithSweepInterval(time.Minute))
	for i := range 1000 {
		l.Allow("idle-"+strconv.Itoa(i), perIP)
	}
	if got := l.Len(); got != 1000 {
		t.Fatalf("Len() = %d, want 1000", got)
	}
	// Every idle bucket is full after 2s, but no shard is due a sweep until 1 minute.
	c.Advance(59 * time.Second)
	for i := range numShards {
		l.Allow(keyInShard(t, l, i, "early-"), perIP)
	}
	if got := l.Len(); got != 1000+numShards {
		t.Fatalf("Len() = %d before the sweep interval, want %d", got, 1000+numShards)
	}
	// After it, touching each shard once sweeps it, keeping only the live buckets.
	c.Advance(time.Second)
	for i := range numShards {
		l.Allow(keyInShard(t, l, i, "late-"), perIP)
	}
	if got := l.Len(); got != 2*numShards {
		t.Fatalf("Len() = %d after the amortised sweep, want %d", got, 2*numShards)
	}
}

func TestClockSteppingBack(t *testing.T) {
	t.Parallel()
	l, c := newTestLimiter(t)
	c.Set(time.Hour)
	for range perIP.Limit {
		l.Allow("k", perIP)
	}
	c.Set(time.Hour - 30*time.Second) // wall clock stepped back 30s
	d := l.Allow("k", perIP)
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
			l, _ := newTestLimiter(t)
			defer func() {
				if recover() == nil {
					t.Fatalf("Allow(%+v) did not panic", p)
				}
			}()
			l.Allow("k", p)
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

func TestAllowDoesNotAllocate(t *testing.T) {
	l, c := newTestLimiter(t)
	l.Allow("key:k1", perKey)
	allocs := testing.AllocsPerRun(1000, func() {
		c.Advance(time.Millisecond)
		l.Allow("key:k1", perKey)
	})
	if allocs != 0 {
		t.Fatalf("Allow on an existing key allocates %.1f times", allocs)
	}
}

func BenchmarkAllow(b *testing.B) {
	l := New()
	p := Policy{Name: "key", Limit: 1 << 30, Window: time.Minute}
	b.ReportAllocs()
	for b.Loop() {
		l.Allow("key:k1", p)
	}
}

func BenchmarkAllowManyKeys(b *testing.B) {
	l := New()
	keys := make([]string, 1<<16)
	for i := range keys {
		keys[i] = "ip:" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		l.Allow(keys[i&(len(keys)-1)], perKey)
		i++
	}
}

func BenchmarkAllowParallel(b *testing.B) {
	l := New()
	var g atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		base := g.Add(1) << 20
		keys := make([]string, 1024)
		for i := range keys {
			keys[i] = "key:" + strconv.FormatInt(base+int64(i), 10)
		}
		i := 0
		for pb.Next() {
			l.Allow(keys[i&(len(keys)-1)], perKey)
			i++
		}
	})
}

func BenchmarkAllowParallelSameKey(b *testing.B) {
	l := New()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l.Allow("key:hot", perKey)
		}
	})
}
