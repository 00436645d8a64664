package ratelimit

import (
	"bytes"
	"context"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// bucketTAT reads a bucket's TAT from the shared table.
func bucketTAT(t testing.TB, db DB, policy, key string) time.Time {
	t.Helper()
	var ns int64
	if err := db.QueryRow(context.Background(), `SELECT tat FROM ratelimit_buckets WHERE policy = $1 AND key = $2`,
		policy, key).Scan(&ns); err != nil {
		t.Fatal(err)
	}
	return time.Unix(0, ns).UTC()
}

// TestLeasesCutRoundTrips: at a high limit a server takes blocks, growing from one
// token, and every header stays exact; the shared bucket counts less than a block more
// than was handed out.
func TestLeasesCutRoundTrips(t *testing.T) {
	t.Parallel()
	p := Policy{Name: "key", Limit: 100_000, Window: time.Hour} // Block 1000
	ls, _, pool := newServers(t, 1)
	l := ls[0]
	const calls = 5000
	for i := range calls {
		d := l.Allow(t.Context(), "key:hot", p)
		if !d.Allowed || d.Remaining != p.Limit-1-i || d.Reset != time.Duration(i+1)*(p.Window/time.Duration(p.Limit)) {
			t.Fatalf("call %d: %+v, want allowed with remaining %d", i+1, d, p.Limit-1-i)
		}
	}
	// Leases of 1, 2, 4, …, 512 (1023 tokens), then blocks of 1000.
	if got := l.trips.Load(); got != 10+4 {
		t.Fatalf("%d round trips for %d calls, want 14", got, calls)
	}
	taken := int(bucketTAT(t, pool, "key", "key:hot").Sub(t0) / (p.Window / time.Duration(p.Limit)))
	if taken < calls || taken >= calls+Block(p) {
		t.Fatalf("the shared bucket counts %d tokens taken for %d handed out", taken, calls)
	}
}

// TestLapsedLeasesAreNotUsed: tokens a server took in advance lapse LeaseTime after it
// asked, so servers holding leftovers cannot add them to a fresh bucket's burst.
func TestLapsedLeasesAreNotUsed(t *testing.T) {
	t.Parallel()
	p := Policy{Name: "key", Limit: 2000, Window: time.Minute} // Block 20, LeaseTime 3s
	const servers = 10
	ls, c, _ := newServers(t, servers)
	ctx := t.Context()
	// Each server serves 32 calls: leases of 1, 2, 4, 8 and 16, then one of 20 of which
	// 19 are left.
	for _, l := range ls {
		for range 32 {
			if d := l.Allow(ctx, "key:k", p); !d.Allowed {
				t.Fatalf("denied while filling leases: %+v", d)
			}
		}
		if e := l.local[slot{"key", "key:k"}]; e.left != 19 || e.size != 20 {
			t.Fatalf("lease size %d with %d left, want 20 and 19", e.size, e.left)
		}
	}
	l := ls[0]
	c.Advance(LeaseTime(p) - 1)
	if trips := l.trips.Load(); !l.Allow(ctx, "key:k", p).Allowed || l.trips.Load() != trips {
		t.Fatal("a lease was not used within its time")
	}
	c.Advance(1)
	if trips := l.trips.Load(); !l.Allow(ctx, "key:k", p).Allowed || l.trips.Load() != trips+1 {
		t.Fatal("a lapsed lease was used")
	}
	// A window later the bucket is full; the leftovers of the other nine must not count.
	c.Advance(p.Window)
	admitted := 0
	for denied := 0; denied < servers; {
		denied = 0
		for _, l := range ls {
			if l.Allow(ctx, "key:k", p).Allowed {
				admitted++
			} else {
				denied++
			}
		}
	}
	if admitted != p.Limit {
		t.Fatalf("a full bucket admitted %d across %d servers, want exactly %d", admitted, servers, p.Limit)
	}
}

// TestOvershootBound drives servers on one key in the patterns that get the most out of
// leases (each grows a lease while the bucket is nearly full and keeps the leftovers
// while the bucket refills, then all burst, within LeaseTime and after it), with random
// traffic besides, and checks the bound of the package doc for every span of the run:
// requests admitted within a span of length X are at most Limit + X/interval + Limit/20.
func TestOvershootBound(t *testing.T) {
	t.Parallel()
	p := Policy{Name: "key", Limit: 2000, Window: 10 * time.Second} // interval 5ms, Block 20, LeaseTime 500ms
	const servers, step, cycle, steps = 8, 50 * time.Millisecond, 300, 1200
	ls, c, _ := newServers(t, servers)
	rng := rand.New(rand.NewPCG(1, 2))
	admitted := make([]int, steps)
	total := 0
	for s := range steps {
		c.Set(time.Duration(s) * step)
		for i, l := range ls {
			var n int
			switch at := s % cycle; {
			case at == 0: // each grows its lease (1, 2, 4, … up to 20) and keeps leftovers
				n = 32
			case at == 6 && s/cycle%2 == 0: // a burst 300ms on: leftovers still good
				n = 300
			case at == 50 && s/cycle%2 == 1: // a burst 2.5s on, on a full bucket: leftovers lapsed
				n = 300
			case at > 100 && at < 200 && (s/(13+5*i))%3 == 0: // below the refill rate
				n = rng.IntN(3)
			}
			for range n {
				if d := l.Allow(t.Context(), "key:k", p); d.Allowed {
					admitted[s]++
				}
			}
		}
		total += admitted[s]
	}
	interval := p.Window / time.Duration(p.Limit)
	worst := 0
	for a := range steps {
		n := 0
		for b := a; b < steps; b++ {
			n += admitted[b]
			span := time.Duration(b-a) * step
			oneLimiter := p.Limit + int(span/interval)
			worst = max(worst, n-oneLimiter)
			if n > oneLimiter+p.Limit/leaseFraction {
				t.Fatalf("%d admitted within %v (steps %d..%d), above %d + %d", n, span, a, b, oneLimiter, p.Limit/leaseFraction)
			}
		}
	}
	// Not vacuous: every burst found a full bucket.
	if total < steps/cycle*p.Limit {
		t.Fatalf("admitted %d in all, want at least %d", total, steps/cycle*p.Limit)
	}
	t.Logf("admitted %d; worst excess over one limiter %d (bound %d)", total, worst, p.Limit/leaseFraction)
}

// TestDenialsAreRemembered: a refused server does not ask again before the RetryAfter
// it was given, and asks at that instant.
func TestDenialsAreRemembered(t *testing.T) {
	t.Parallel()
	p := Policy{Name: "ip", Limit: 2, Window: 10 * time.Second} // interval 5s
	l, c := newTestLimiter(t)
	ctx := t.Context()
	l.Allow(ctx, "ip:a", p)
	l.Allow(ctx, "ip:a", p)
	first := l.Allow(ctx, "ip:a", p)
	trips := l.trips.Load()
	c.Advance(time.Second)
	for range 100 {
		d := l.Allow(ctx, "ip:a", p)
		if d.Allowed || d.RetryAfter != first.RetryAfter-time.Second || d.Reset != first.Reset-time.Second {
			t.Fatalf("remembered denial %+v, want retry %v", d, first.RetryAfter-time.Second)
		}
	}
	if l.trips.Load() != trips {
		t.Fatalf("%d round trips for remembered denials", l.trips.Load()-trips)
	}
	c.Set(first.RetryAfter)
	if d := l.Allow(ctx, "ip:a", p); !d.Allowed || l.trips.Load() != trips+1 {
		t.Fatalf("at the RetryAfter: %+v after %d round trips", d, l.trips.Load()-trips)
	}
}

// TestFailOpen: with PostgreSQL out of reach, requests are admitted unchecked, only the
// policy is advertised, and the warnings are few.
func TestFailOpen(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var logs bytes.Buffer
	l := New(pool, slog.New(slog.NewTextHandler(&logs, nil)))
	for range 3 {
		d := l.Allow(t.Context(), "key:k", perKey)
		if !d.Allowed || !d.Unchecked || d.Policy != perKey {
			t.Fatalf("got %+v, want allowed unchecked", d)
		}
		h := http.Header{}
		SetHeaders(h, d)
		if h.Get(HeaderPolicy) != `"key";q=120;w=60` || h.Get(HeaderRateLimit) != "" || h.Get(HeaderRetryAfter) != "" {
			t.Fatalf("headers of an unchecked decision: %v", h)
		}
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 {
		t.Fatalf("%d warnings for 3 unchecked requests, want 1:\n%s", n, logs.String())
	}
}

// A database that accepts connections and never answers: the round trip fails after
// queryTimeout, and the requests that waited for it are admitted unchecked at once,
// not each after a round trip of its own (they queued, queryTimeout each).
func TestHungDatabaseFailsOpenOnce(t *testing.T) {
	t.Parallel()
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan net.Conn, 64) // connections held open, never answered
	t.Cleanup(func() {
		hole.Close()
		for {
			select {
			case c := <-held:
				c.Close()
			default:
				return
			}
		}
	})
	go func() {
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			held <- c
		}
	}()
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@"+hole.Addr().String()+"/none?connect_timeout=30")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	l := New(pool, nil)
	first := make(chan Decision, 1)
	go func() { first <- l.Allow(t.Context(), "key:k", perKey) }()
	for l.trips.Load() == 0 {
		time.Sleep(time.Millisecond) // until the first round trip is under way
	}
	decisions := make(chan Decision, 3)
	for range 3 {
		go func() { decisions <- l.Allow(t.Context(), "key:k", perKey) }()
	}
	for range 3 {
		if d := <-decisions; !d.Allowed || !d.Unchecked {
			t.Fatalf("a waiting request: %+v, want allowed unchecked", d)
		}
	}
	if d := <-first; !d.Allowed || !d.Unchecked {
		t.Fatalf("the first request: %+v, want allowed unchecked", d)
	}
	if n := l.trips.Load(); n != 1 {
		t.Fatalf("%d round trips to a hung database for 4 requests at once, want 1", n)
	}
}
