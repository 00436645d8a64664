// Package ratelimit is the API's request rate limiter (per account, key or address: the
// caller names the bucket), shared by every server of one database, and the formatting
// of the rate-limit response header fields.
//
// # Algorithm
//
// Every (policy name, key) pair is a token bucket with continuous refill, computed as
// GCRA (generic cell rate algorithm). A bucket holds at most Policy.Limit tokens, gains
// one token every Window/Limit (the interval) and a request takes one, so a client may
// burst Limit requests and then sustain Limit per Window. For each pair the limiter
// stores a single instant, the theoretical arrival time (TAT): the moment the bucket
// will be full again if nothing more is taken. From it, at any instant now:
//
//	Reset     = TAT - now                          (time until the bucket is full again)
//	Remaining = Limit - ceil((TAT - now) / interval)
//	allowed   iff max(TAT, now) + interval - now <= Limit*interval
//	RetryAfter (denied only) = max(TAT, now) + interval - Limit*interval - now
//
// Remaining is how many requests would be admitted right now in a burst; RetryAfter is
// the wait until the next one would be admitted. Limit*interval can be a few
// nanoseconds shorter than Window when Window is not a multiple of Limit nanoseconds;
// the burst is then still exactly Limit.
//
// # Shared state
//
// The TATs live in PostgreSQL, in the UNLOGGED table ratelimit_buckets (migration 0012;
// after a crash every bucket starts full, which is the one state a limiter may forget
// to). One call of ratelimit_take locks the bucket's row, reads the database's clock
// (clock_timestamp(), under the lock, so the servers' own clocks never matter), and
// advances the TAT by n intervals if n tokens are free, taking as many as are free up
// to what was asked; a denial writes nothing. Any number of servers therefore enforce
// one bucket, exactly as one in-memory limiter would. A row whose TAT has passed is a
// full bucket, the same as no row: Sweep deletes them.
//
// # Leases: fewer round trips at high limits
//
// A round trip per request is fine at 120 a minute; at thousands it puts one hot row on
// the request path of every call. So a server may take a block of tokens in one call
// (a lease) and hand them out from memory. Two rules keep the shared limit true:
//
//   - A lease is good for LeaseTime(p) = Window/20 after it was asked for, measured on
//     the server's monotonic clock from before the round trip (so never longer than the
//     database saw). Unused tokens then lapse; they are never given back. Every request
//     admitted in a span of length X thus used a token the database handed out within
//     X + Window/20, and GCRA hands out at most Limit + (X + Window/20)/interval there:
//     all servers together admit at most Limit/20 (5%) more than one limiter would,
//     whatever the number of servers. Lapsed tokens only ever err towards denying.
//   - A lease takes at most Block(p) = max(1, Limit/100) tokens, and a server asks for
//     twice what it used of its last lease for that bucket (at least 1), so a server
//     that sees little traffic on a key does not sit on tokens other servers need. At
//     Limit < 200 (every free plan and keyless policy) Block is 1: no lease at all, each
//     request is one round trip and the state is exact.
//
// One server keeps at most one round trip in flight per bucket; concurrent requests for
// it wait for that answer. A denial is remembered until its RetryAfter, which is exact
// (a TAT only moves forward), so a flood of refused requests costs no round trips.
//
// The header fields report the shared bucket as of the server's last round trip minus
// what it has handed out since: Remaining and Reset computed from the TAT as if the
// lease's unused tokens had not been taken. With Block 1 they are the shared state.
//
// # When PostgreSQL is out of reach
//
// Allow fails open: the request is admitted with Decision.Unchecked set, and a warning
// is logged (at most one line per 10 seconds). Refusing every request while the
// database is down would add nothing, since anything that needs the database fails on
// its own (answered 503), and admitting keeps database-free answers available. No
// RateLimit field is sent then, as there is no true remaining count to report.
//
// # Header fields
//
// The format is that of the IETF httpapi draft "RateLimit header fields for HTTP"
// (draft-ietf-httpapi-ratelimit-headers, the structured-field revisions, -08 onwards).
// Each field is a Structured Fields List holding one Item whose value is the policy
// name as an sf-string; integers are decimal and durations are whole seconds rounded up:
//
//	RateLimit-Policy: "<name>";q=<Limit>;w=<Window in seconds>
//	RateLimit: "<name>";r=<Remaining>;t=<Reset in seconds>
//	Retry-After: <RetryAfter in seconds, at least 1>        (only when denied)
//
// For the policy {Name: "account", Limit: 120, Window: time.Minute}, the first request
// on a fresh bucket gets
//
//	RateLimit-Policy: "account";q=120;w=60
//	RateLimit: "account";r=119;t=1
//
// and the 121st request within the same instant is denied with
//
//	RateLimit-Policy: "account";q=120;w=60
//	RateLimit: "account";r=0;t=60
//	Retry-After: 1
//
// The quota unit (qu) is left out, so it is the draft's default, "requests". No
// partition key (pk) is sent: the policy's name says which bucket it is (the caller's
// account, key or address), which the client knows.
// Go's http.Header canonicalises the names to "Ratelimit-Policy" and "Ratelimit";
// field names are case-insensitive, and HTTP/2 and HTTP/3 send them lower-case anyway.
package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Policy is one named limit: Limit requests per Window, with bursts of up to Limit.
// The Name is what clients see in the header fields (for example "key" or "ip"); it
// also separates state, so the same key under two policy names has two buckets.
type Policy struct {
	Name   string
	Limit  int
	Window time.Duration
}

// Validate reports whether p can be enforced and advertised: a non-empty name of
// printable ASCII, Limit at least 1, and Window a whole number of seconds, at least one.
// Check policies once at startup; Allow panics on a policy it cannot compute with.
func (p Policy) Validate() error {
	if p.Name == "" {
		return fmt.Errorf("ratelimit: policy name is empty")
	}
	for i := 0; i < len(p.Name); i++ {
		if c := p.Name[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("ratelimit: policy %q: name byte %#x is not printable ASCII", p.Name, c)
		}
	}
	if p.Limit < 1 {
		return fmt.Errorf("ratelimit: policy %q: limit %d is below 1", p.Name, p.Limit)
	}
	if p.Window < time.Second || p.Window%time.Second != 0 {
		return fmt.Errorf("ratelimit: policy %q: window %v is not a whole number of seconds", p.Name, p.Window)
	}
	return nil
}

// interval is the time one token takes to come back, in ns.
func (p Policy) interval() int64 { return int64(p.Window) / int64(p.Limit) }

// LeaseTime is how long a server may hand out tokens it took in advance (Window/20).
func LeaseTime(p Policy) time.Duration { return p.Window / leaseFraction }

// Block is the most tokens one round trip takes for a server to hand out (Limit/100).
func Block(p Policy) int { return max(1, p.Limit/100) }

const (
	leaseFraction = 20 // a lease lasts Window/20: at most 5% over the limit
	// sweepEvery is how often Allow drops lapsed local state.
	sweepEvery = time.Minute
	// queryTimeout bounds one round trip; past it the limiter fails open.
	queryTimeout = 3 * time.Second
	// retryFailedAfter is how long a bucket whose round trip failed admits requests
	// unchecked before the next one tries the database again.
	retryFailedAfter = time.Second
	warnEvery        = 10 * time.Second
)

// Decision is the outcome of one Allow call.
type Decision struct {
	// Allowed reports whether the request was admitted and a token taken.
	Allowed bool
	// Limit is the policy's Limit, the burst size.
	Limit int
	// Remaining is how many more requests would be admitted now, in [0, Limit).
	Remaining int
	// Reset is the time until the bucket is full again.
	Reset time.Duration
	// RetryAfter is the time until the next request would be admitted; zero if Allowed.
	RetryAfter time.Duration
	// Policy is the policy the decision was made under.
	Policy Policy
	// Unchecked reports that the shared state was out of reach and the request was
	// admitted without a check; Remaining and Reset mean nothing then.
	Unchecked bool
}

// decide computes the Decision from a bucket's TAT at instant now (ns, database clock).
func decide(p Policy, allowed bool, tat, now int64) Decision {
	interval := p.interval()
	span := interval * int64(p.Limit)
	tat = max(tat, now)
	d := Decision{Allowed: allowed, Limit: p.Limit, Policy: p, Reset: time.Duration(tat - now)}
	// Tokens in use are ceil((tat-now)/interval); tat-now can exceed span only if the
	// clock stepped back, hence the clamp.
	used := (tat - now + interval - 1) / interval
	d.Remaining = max(0, p.Limit-int(min(used, int64(p.Limit))))
	if !allowed {
		d.RetryAfter = time.Duration(tat + interval - span - now)
	}
	return d
}

// DB is what the limiter needs of PostgreSQL; *pgxpool.Pool has it.
type DB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Option configures a Limiter.
type Option func(*Limiter)

// WithClock replaces both the server's clock and the database's, for tests: the
// limiter sends the clock's instant with every round trip. It must be safe for
// concurrent use.
func WithClock(now func() time.Time) Option {
	return func(l *Limiter) { l.clock, l.fixedDB = now, true }
}

// Limiter applies policies to keys against the shared buckets. Make one per process
// with New; it is safe for concurrent use.
type Limiter struct {
	db      DB
	logger  *slog.Logger
	clock   func() time.Time
	fixedDB bool // the clock stands in for the database's (WithClock)

	mu        sync.Mutex
	local     map[slot]*entry
	nextSweep time.Time

	trips    atomic.Int64 // round trips made, for tests
	warnedAt atomic.Int64 // unix ns of the last fail-open warning
}

// slot names one bucket.
type slot struct {
	policy string
	key    string
}

// entry is a server's view of one bucket since its last round trip.
type entry struct {
	policy Policy
	sent   time.Time // local instant the last round trip was sent
	at     int64     // the database's instant of its answer, ns
	tat    int64     // the bucket's TAT after it, ns
	size   int       // tokens it took: the lease
	left   int       // of which not handed out yet
	// deniedUntil is when a token may be free again after a denial (local clock).
	deniedUntil time.Time
	// failedUntil is when a round trip may be tried again after one failed (local
	// clock): until then the bucket's requests are admitted unchecked at once, rather
	// than each waiting for a round trip of its own (a hung database queued them,
	// queryTimeout each).
	failedUntil time.Time
	// busy is closed when the round trip in flight for this bucket is answered.
	busy chan struct{}
}

// New returns a Limiter whose buckets live in db; logger gets the fail-open warnings.
func New(db DB, logger *slog.Logger, opts ...Option) *Limiter {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	l := &Limiter{db: db, logger: logger, clock: time.Now, local: make(map[slot]*entry)}
	for _, o := range opts {
		o(l)
	}
	return l
}

// Allow takes one token from key's bucket under p if one is available and reports the
// outcome. Keys are opaque ("acct:<account_id>:<env>", "key:<key_id>", "ip:<addr>"). Allow panics if p.Limit < 1 or
// p.Window is shorter than p.Limit nanoseconds; use Policy.Validate at startup.
func (l *Limiter) Allow(ctx context.Context, key string, p Policy) Decision {
	if p.Limit < 1 || p.Window < time.Duration(p.Limit) {
		panic(fmt.Sprintf("ratelimit: unusable policy %q: limit %d per %v", p.Name, p.Limit, p.Window))
	}
	id := slot{policy: p.Name, key: key}
	for {
		now := l.clock()
		l.mu.Lock()
		l.sweepLocked(now)
		e := l.local[id]
		if e == nil || e.policy != p {
			e = &entry{policy: p}
			l.local[id] = e
		}
		if e.busy != nil { // another request of this server is asking; use its answer
			busy := e.busy
			l.mu.Unlock()
			select {
			case <-busy:
				continue
			case <-ctx.Done():
				return l.unchecked(ctx, p, ctx.Err())
			}
		}
		if now.Before(e.failedUntil) {
			l.mu.Unlock()
			return l.unchecked(ctx, p, errFailedRecently)
		}
		if now.Before(e.deniedUntil) {
			d := decide(p, false, e.tat, e.dbNow(now))
			l.mu.Unlock()
			return d
		}
		if e.left > 0 && now.Before(e.sent.Add(LeaseTime(p))) {
			e.left--
			d := decide(p, true, e.tat-int64(e.left)*p.interval(), e.dbNow(now))
			l.mu.Unlock()
			return d
		}
		// Ask for twice what the last lease served, within the block.
		want := min(Block(p), max(1, 2*(e.size-e.left)))
		e.busy = make(chan struct{})
		l.mu.Unlock()
		return l.take(ctx, id, e, want, now)
	}
}

// take makes the round trip for e, which the caller marked busy, and hands out the
// first token it got.
func (l *Limiter) take(ctx context.Context, id slot, e *entry, want int, now time.Time) Decision {
	p := e.policy
	granted, tat, at, err := l.query(ctx, id, p, want, now)
	l.mu.Lock()
	defer l.mu.Unlock()
	close(e.busy)
	e.busy = nil
	if err != nil {
		if ctx.Err() == nil { // this request's end is not the database's failure
			e.failedUntil = l.clock().Add(retryFailedAfter)
		}
		return l.unchecked(ctx, p, err)
	}
	e.sent, e.at, e.tat, e.size = now, at, tat, granted
	if granted == 0 {
		e.left = 0
		d := decide(p, false, tat, at)
		e.deniedUntil = now.Add(d.RetryAfter)
		return d
	}
	e.left = granted - 1
	return decide(p, true, tat-int64(e.left)*p.interval(), at)
}

func (l *Limiter) query(ctx context.Context, id slot, p Policy, want int, now time.Time) (granted int, tat, at int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var fixed *int64
	if l.fixedDB {
		ns := now.UnixNano()
		fixed = &ns
	}
	l.trips.Add(1)
	err = l.db.QueryRow(ctx, `SELECT granted, tat, now_ns FROM ratelimit_take($1, $2, $3, $4, $5, $6)`,
		id.policy, id.key, p.interval(), p.Limit, want, fixed).Scan(&granted, &tat, &at)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("ratelimit: take from %s %q: %w", id.policy, id.key, err)
	}
	return granted, tat, at, nil
}

// unchecked is the fail-open decision, with a warning now and then.
func (l *Limiter) unchecked(ctx context.Context, p Policy, err error) Decision {
	now := time.Now().UnixNano()
	if ctx.Err() != nil { // the request is gone; nothing is wrong with the limiter
		return Decision{Allowed: true, Limit: p.Limit, Policy: p, Unchecked: true}
	}
	if last := l.warnedAt.Load(); now-last >= int64(warnEvery) && l.warnedAt.CompareAndSwap(last, now) {
		l.logger.WarnContext(ctx, "rate limiter cannot reach its state; admitting requests unchecked", "err", err)
	}
	return Decision{Allowed: true, Limit: p.Limit, Policy: p, Unchecked: true}
}

var errFailedRecently = errors.New("ratelimit: the bucket's last round trip failed a moment ago")

// dbNow estimates the database's clock at local instant now.
func (e *entry) dbNow(now time.Time) int64 { return e.at + int64(now.Sub(e.sent)) }

// sweepLocked drops, at most once per sweepEvery, local state that no longer matters:
// lapsed leases and past denials.
func (l *Limiter) sweepLocked(now time.Time) {
	if now.Before(l.nextSweep) {
		return
	}
	l.nextSweep = now.Add(sweepEvery)
	for id, e := range l.local {
		if e.busy == nil && !now.Before(e.deniedUntil) && !now.Before(e.sent.Add(LeaseTime(e.policy))) {
			delete(l.local, id)
		}
	}
}

// Sweep deletes the buckets that are full again by the database's clock (such a row
// means the same as no row) and returns how many it deleted. Any server may run it at
// any time.
func Sweep(ctx context.Context, db DB) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `WITH gone AS (
		DELETE FROM ratelimit_buckets WHERE tat <= (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint
		RETURNING 1) SELECT count(*) FROM gone`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("ratelimit: sweep: %w", err)
	}
	return n, nil
}
