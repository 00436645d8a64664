// Package ratelimit is the API's in-memory, per-key request rate limiter and the
// formatting of the rate-limit response header fields.
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
// A pair whose bucket is full again (TAT <= now) is indistinguishable from a pair never
// seen, so it is dropped: each shard sweeps itself inside Allow at most once per sweep
// interval (WithSweepInterval), and Sweep drops them on demand. Memory therefore holds
// only pairs used within roughly the last Window plus the sweep interval. The limiter
// starts no goroutine and needs no Close.
//
// State lives in 64 shards, each a mutex-protected map, chosen by a seeded hash of the
// key, so requests on different keys rarely contend. Allow does not allocate once a pair
// exists (inserting a new pair may grow the shard's map).
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
// For the policy {Name: "key", Limit: 120, Window: time.Minute}, the first request of a
// fresh key gets
//
//	RateLimit-Policy: "key";q=120;w=60
//	RateLimit: "key";r=119;t=1
//
// and the 121st request within the same instant is denied with
//
//	RateLimit-Policy: "key";q=120;w=60
//	RateLimit: "key";r=0;t=60
//	Retry-After: 1
//
// The quota unit (qu) is left out, so it is the draft's default, "requests". No
// partition key (pk) is sent: the client already knows its own key or address.
// Go's http.Header canonicalises the names to "Ratelimit-Policy" and "Ratelimit";
// field names are case-insensitive, and HTTP/2 and HTTP/3 send them lower-case anyway.
package ratelimit

import (
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"time"
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
}

const (
	numShards = 64 // a power of two
	// DefaultSweepInterval is how often each shard drops full buckets, by default.
	DefaultSweepInterval = time.Minute
)

// Option configures a Limiter.
type Option func(*Limiter)

// WithClock replaces time.Now, for tests. The clock must be safe for concurrent use.
func WithClock(now func() time.Time) Option {
	return func(l *Limiter) { l.clock = now }
}

// WithSweepInterval sets how often, at most, Allow sweeps the shard it touches.
// Zero or a negative value turns the amortised sweep off; call Sweep yourself then.
func WithSweepInterval(d time.Duration) Option {
	return func(l *Limiter) { l.sweepEvery = d }
}

// Limiter holds the per-key buckets. Make one with New; it is safe for concurrent use.
type Limiter struct {
	clock      func() time.Time
	epoch      time.Time // instants are stored as nanoseconds since epoch
	seed       maphash.Seed
	sweepEvery time.Duration
	shards     [numShards]shard
}

// slot names one bucket.
type slot struct {
	policy string
	key    string
}

type shard struct {
	mu        sync.Mutex
	tats      map[slot]int64 // theoretical arrival time, ns since epoch
	nextSweep int64          // ns since epoch
	_         [40]byte       // keep neighbouring shards off one 64-byte cache line
}

// New returns an empty Limiter.
func New(opts ...Option) *Limiter {
	l := &Limiter{clock: time.Now, seed: maphash.MakeSeed(), sweepEvery: DefaultSweepInterval}
	for _, o := range opts {
		o(l)
	}
	l.epoch = l.clock()
	first := int64(0)
	if l.sweepEvery <= 0 {
		first = math.MaxInt64
	}
	for i := range l.shards {
		l.shards[i].tats = make(map[slot]int64)
		l.shards[i].nextSweep = first
	}
	return l
}

// Allow takes one token from key's bucket under p if one is available and reports the
// outcome. Keys are opaque ("key:<key_id>", "ip:<addr>"). Allow panics if p.Limit < 1 or
// p.Window is shorter than p.Limit nanoseconds; use Policy.Validate at startup.
func (l *Limiter) Allow(key string, p Policy) Decision {
	if p.Limit < 1 || p.Window < time.Duration(p.Limit) {
		panic(fmt.Sprintf("ratelimit: unusable policy %q: limit %d per %v", p.Name, p.Limit, p.Window))
	}
	interval := int64(p.Window) / int64(p.Limit)
	span := interval * int64(p.Limit) // <= Window; the full bucket's worth of time
	now := l.now()
	s := &l.shards[maphash.String(l.seed, key)&(numShards-1)]
	id := slot{policy: p.Name, key: key}

	d := Decision{Limit: p.Limit, Policy: p}
	s.mu.Lock()
	tat, ok := s.tats[id]
	if !ok || tat < now {
		tat = now
	}
	next := tat + interval
	if next-now <= span {
		s.tats[id] = next
		tat = next
		d.Allowed = true
	} else {
		d.RetryAfter = time.Duration(next - span - now)
	}
	if now >= s.nextSweep {
		s.sweepLocked(now)
		s.nextSweep = now + int64(l.sweepEvery)
	}
	s.mu.Unlock()

	d.Reset = time.Duration(tat - now)
	// Tokens in use are ceil((tat-now)/interval); tat-now can exceed span only if the
	// clock stepped back, hence the clamp.
	used := (tat - now + interval - 1) / interval
	d.Remaining = max(0, p.Limit-int(min(used, int64(p.Limit))))
	return d
}

// Sweep drops every bucket that is full again at now and returns how many it dropped.
func (l *Limiter) Sweep(now time.Time) int {
	t := int64(now.Sub(l.epoch))
	n := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		n += s.sweepLocked(t)
		s.mu.Unlock()
	}
	return n
}

// Len returns the number of buckets held, full or not yet swept.
func (l *Limiter) Len() int {
	n := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		n += len(s.tats)
		s.mu.Unlock()
	}
	return n
}

func (l *Limiter) now() int64 { return int64(l.clock().Sub(l.epoch)) }

func (s *shard) sweepLocked(now int64) int {
	n := 0
	for id, tat := range s.tats {
		if tat <= now {
			delete(s.tats, id)
			n++
		}
	}
	return n
}
