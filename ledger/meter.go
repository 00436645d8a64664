package ledger

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	gojson "github.com/goccy/go-json"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/postgres"
)

// Meter is the one money path of costed calls (docs/BILLING.md, the billing rule):
//
//   - Reserve, before any engine starts: the call's price is taken from this server's
//     lease on the key, a durable reservation of units against the key's budgets and
//     its account's daily allowance (meter_lease, the whole budget rule). A lease is
//     topped up in one round trip when it runs short, and a refusal spends no engine
//     time. Served from memory otherwise.
//   - Settle, after the answer: each answered call is one line item, committed with
//     the others in group commits by one settler per server, off the response path:
//     per key and commit, one ChargesSettled event of them.
//   - Cancel, when no answer was produced: the units go back to the lease.
//
// A server that dies forgives the calls it answered and had not settled (bounded by
// MaxBacklog); its leases expire and any server gives their units back. A call not
// charged within its settle's deadline is forgiven too (settleWithin). Nothing is ever
// charged twice nor past a budget: a settle whose lease is gone settles nothing.
type Meter struct {
	store  *eventstore.Store
	pool   *pgxpool.Pool
	logger *slog.Logger
	cfg    MeterConfig
	owner  string // this process, as the owner of its leases and claims
	now    func() time.Time
	// bounds is the settle's transaction's limits as the database takes them
	// (settleBounds), learnt at the first settle; only the settler reads and sets it
	bounds string

	mu      sync.Mutex
	leases  map[leaseKey]*lease
	keyless map[keylessKey]*keylessBlock
	// releasing are the leases no call may use any more whose rows wait for their calls
	// to settle (release): housekeeping renews their rows and m.leases' only, so that a
	// row nobody here tracks (its release failed) expires and is recovered.
	releasing map[*lease]struct{}
	// giving are the stale leases given back before their keys' next leases are
	// taken (releaseBeforeNext): a call on the key meanwhile waits for the lease's
	// given, so that the new lease finds what the old one held.
	giving map[leaseKey]*lease
	// claims are the Idempotency-Key claims this server holds and means to answer, from
	// Claim until Store, Unclaim or the settle of their call (each with a generation):
	// only these are renewed, so that an orphan expires and a retry takes it over.
	claims   map[claimKey]uint64
	claimGen uint64

	queue    chan *settlement
	flushReq chan chan error
	stopReq  chan context.Context // Stop: its context bounds the wait for reserved calls
	stopped  chan struct{}
	cursor   eventstore.Cursor

	// outstanding counts the reservations neither settled nor cancelled (under mu).
	// Once stopping, no call is reserved any more and idle is closed when none is left;
	// once final (the final drain has begun), a Settle is refused, never queued: every
	// settlement the final drain waits for was queued before.
	outstanding int
	idle        chan struct{}
	stopping    atomic.Bool // set under mu
	final       bool

	// unsettled holds when each answered, not yet committed call was answered, oldest
	// first (under mu); settled is closed and replaced after each commit.
	unsettled []time.Time
	settled   chan struct{}
	crashed   atomic.Bool // tests: stop as a killed process would

	// aheads counts top-ups started ahead of need; closing (under mu) stops new ones,
	// so that shutdown gives back what they reserve.
	aheads  sync.WaitGroup
	closing bool
	// topUps counts meter_lease round trips: [0] for calls that found their lease
	// dry and waited, [1] ahead of need (tests)
	topUps [2]atomic.Int64
}

// MeterConfig tunes the meter; zero values take the defaults.
type MeterConfig struct {
	// LeaseCalls is how many calls at the current price a lease is topped up for at
	// first (64). A lease topped up again within a second asks for twice as much, up
	// to 64 times this; one idle for longer asks for half as much again. meter_lease
	// grants at most a quarter of what a budget has left, so a large lease never takes
	// a budget from the other servers.
	LeaseCalls int64
	// LeaseTTL is how long a lease (or an Idempotency-Key claim) outlives its owner's
	// last renewal (15 s): after it, any server releases it.
	LeaseTTL time.Duration
	// LeaseIdle is how long an unused lease is kept before its units are given back
	// when its last top-up was not granted in full (2 s): near a budget's end, units
	// sitting in an idle lease could make another server refuse calls the budget has
	// room for.
	LeaseIdle time.Duration
	// LeaseKeep is how long an unused lease whose last top-up the budgets granted in
	// full (so it holds at most a quarter of what they have left) is kept (30 s): a
	// client calling every few seconds is then reserved from memory, instead of waiting
	// for a durable top-up before its search on every call.
	LeaseKeep time.Duration
	// MaxBacklog bounds what a crash can forgive: while the oldest answered call has
	// waited this long to be settled (the database is slow or away), new calls wait
	// for the settler (100 ms).
	MaxBacklog time.Duration
	// BacklogWait is how long a new call waits for the settler to catch up before it is
	// refused with 503 (2 s).
	BacklogWait time.Duration
	// Housekeeping is how often leases are renewed, idle ones released and expired ones
	// of other servers recovered (1 s).
	Housekeeping time.Duration
	// Gather is how long the settler waits, once a call's line item comes, before it
	// commits what has come by then (2 ms; <0: not at all). Settling at once put the
	// database's work for a call beside the last steps of its answer, which reached the
	// client 0.4 ms later (depth 14, concurrency 1, docs/BENCHMARKS.md session 27); the
	// calls answered meanwhile join the commit. Well within MaxBacklog.
	Gather time.Duration
	// StopGrace bounds how long a stopping meter waits for the calls it reserved to be
	// settled or cancelled before its final drain (75 s: the longest search, 60 s, and
	// its queueing). Meanwhile it reserves nothing more and goes on settling and renewing
	// its leases and claims. A call answered after the final drain is not charged: its
	// Settle is refused (OutcomeStoppedUnsettled), counted and logged.
	StopGrace time.Duration
}

func (c *MeterConfig) defaults() {
	if c.LeaseCalls <= 0 {
		c.LeaseCalls = 64
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 15 * time.Second
	}
	if c.LeaseIdle <= 0 {
		c.LeaseIdle = 2 * time.Second
	}
	if c.LeaseKeep <= 0 {
		c.LeaseKeep = 30 * time.Second
	}
	c.LeaseKeep = max(c.LeaseKeep, c.LeaseIdle) // a full lease is never kept less than a capped one
	if c.MaxBacklog <= 0 {
		c.MaxBacklog = 100 * time.Millisecond
	}
	if c.BacklogWait <= 0 {
		c.BacklogWait = 2 * time.Second
	}
	if c.Gather == 0 {
		c.Gather = 2 * time.Millisecond
	}
	if c.StopGrace <= 0 {
		c.StopGrace = 75 * time.Second
	}
	if c.Housekeeping <= 0 {
		// renew well within the lease's life: a live server's lease must never expire
		c.Housekeeping = min(time.Second, c.LeaseTTL/4)
	}
}

type leaseKey struct {
	keyID, day string
}

// lease is this server's reservation on one key for one allowance day.
type lease struct {
	acquire sync.Mutex // one top-up round trip at a time per lease

	// the rest under Meter.mu
	id                         string
	keyID, accountID, env, day string
	keyVersion, accountVersion int64
	avail                      int64 // reserved in the database, not handed to a call
	want                       int64 // what the next top-up asks for (lease sizing)
	lowWater                   int64 // below it, a top-up starts ahead of need (0: never)
	full                       bool  // the last top-up was granted all it asked (idle: LeaseKeep)
	toppedAt                   time.Time
	// trustedUntil is when the lease's row may have expired for want of renewal (its
	// last top-up or renewal, sent, plus LeaseTTL, less a margin): past it another
	// server may have given its units back, and none of avail may be handed out.
	trustedUntil time.Time
	ahead        bool  // a top-up ahead of need is in flight
	inflight     int   // reservations neither settled nor cancelled
	filling      int   // top-ups in flight: the lease is in use
	pending      int64 // settled in memory, not yet committed
	lastUsed     time.Time
	released     bool
	// given, when leaseFor let the lease go with none of its calls to settle, closes
	// once releaseBeforeNext has given it back (set under Meter.mu, closed once)
	given chan struct{}
}

// NewMeter starts the settler; it stops when ctx ends (or Stop): it reserves nothing
// more, waits (StopGrace at most) for the calls it reserved to be settled or cancelled,
// settles every call answered by then, and gives back its leases.
func NewMeter(ctx context.Context, store *eventstore.Store, logger *slog.Logger, cfg MeterConfig) *Meter {
	cfg.defaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m := &Meter{
		store: store, pool: store.Pool(), logger: logger, cfg: cfg, owner: "srv_" + randomHex(8),
		now:    func() time.Time { return time.Now().UTC().Truncate(time.Microsecond) },
		leases: map[leaseKey]*lease{}, keyless: map[keylessKey]*keylessBlock{}, queue: make(chan *settlement, 4096), flushReq: make(chan chan error),
		stopReq:   make(chan context.Context),
		releasing: map[*lease]struct{}{}, giving: map[leaseKey]*lease{}, claims: map[claimKey]uint64{},
		stopped: make(chan struct{}), settled: make(chan struct{}),
	}
	go m.loop(ctx)
	return m
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) //nolint:errcheck // crypto/rand does not fail on Linux
	return hex.EncodeToString(b)
}

// Call is a costed call as the meter prices and records it.
type Call struct {
	RequestID string
	Key       *domain.Key
	Account   *domain.Account // the key's account: its plan's daily allowance
	Price     domain.Call     // what the call is priced by
	// Cached: the answer is known without a search (a cached result, a finished game);
	// the cached price is reserved.
	Cached bool
}

// Reservation is a call's price taken from a lease. Exactly one of Settle or Cancel
// must follow.
type Reservation struct {
	m     *Meter
	l     *lease
	call  Call
	price Price
	units int64 // reserved: the fresh price
	done  atomic.Bool
}

// Price is what the reserved call costs fresh and from the cache.
func (r *Reservation) Price() Price { return r.price }

// Reserve takes call's fresh price from this server's lease on the key before any work
// starts. A refusal is an *Refusal error (budget, allowance, backlog); nothing is
// reserved then.
func (m *Meter) Reserve(ctx context.Context, call Call) (*Reservation, error) {
	price, err := Quote(call.Price)
	if err != nil {
		return nil, err
	}
	if m.isStopping() {
		return nil, refusal(OutcomeStopped)
	}
	if err := m.waitBacklog(ctx); err != nil {
		return nil, err
	}
	units := price.Charged(call.Cached)
	k := call.Key
	day := m.now().Format(time.DateOnly)
	for {
		l, fresh, given := m.leaseFor(k, call.Account, day)
		if given != nil {
			// the key's last lease is being given back (releaseBeforeNext)
			select {
			case <-given:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			continue
		}
		if !fresh {
			// the key or account changed since the lease was taken: the lease's terms
			// (budget, plan) are gone with it; or its row went unrenewed so long that
			// another server may have given its units back
			m.releaseBeforeNext(ctx, l)
			continue
		}
		if ok, err := m.take(l, call, units); err != nil {
			return nil, err
		} else if ok {
			return &Reservation{m: m, l: l, call: call, price: price, units: units}, nil
		}
		if err := m.topUp(ctx, l, call, units, false); err != nil {
			if errors.Is(err, errLeaseGone) {
				continue
			}
			return nil, err
		}
		if ok, err := m.take(l, call, units); err != nil {
			return nil, err
		} else if ok {
			return &Reservation{m: m, l: l, call: call, price: price, units: units}, nil
		}
	}
}

// isStopping says the meter reserves nothing more: it was asked to stop, or stopped.
func (m *Meter) isStopping() bool {
	select {
	case <-m.stopped:
		return true
	default:
	}
	return m.stopping.Load()
}

var errLeaseGone = errors.New("lease released meanwhile")

// leaseFor returns this server's lease on the key for day, and false when it was taken
// for other versions of the key or account; or, while the key's last lease is being
// given back before a new one is taken, what closes when it is (to wait for).
func (m *Meter) leaseFor(k *domain.Key, acct *domain.Account, day string) (*lease, bool, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	lk := leaseKey{k.ID(), day}
	l, ok := m.leases[lk]
	if !ok {
		if g, ok := m.giving[lk]; ok {
			return nil, false, g.given
		}
		l = &lease{id: "lease_" + randomHex(12), keyID: k.ID(), accountID: k.AccountID(), env: k.Env().String(), day: day,
			keyVersion: k.Version(), accountVersion: acct.Version(), lastUsed: time.Now()}
		m.leases[lk] = l
		return l, true, nil
	}
	if l.keyVersion != k.Version() || l.accountVersion != acct.Version() || !l.toppedAt.IsZero() && time.Now().After(l.trustedUntil) {
		l.released = true
		delete(m.leases, lk)
		if l.inflight == 0 && l.pending == 0 && l.filling == 0 {
			// releaseBeforeNext gives it back at once, and closes given
			l.given = make(chan struct{})
			m.giving[lk] = l
		}
		return l, false, nil
	}
	return l, true, nil
}

// trust is how long a lease row written or renewed by a statement sent at sent is
// surely still this server's (under mu).
func (m *Meter) trust(l *lease, sent time.Time) {
	if until := sent.Add(m.cfg.LeaseTTL - m.cfg.LeaseTTL/5); until.After(l.trustedUntil) {
		l.trustedUntil = until
	}
}

// take hands units of the lease to call when it has them, and starts topUpAhead when
// the lease runs low. A stopping meter refuses (OutcomeStopped).
func (m *Meter) take(l *lease, call Call, units int64) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopping.Load() {
		return false, refusal(OutcomeStopped)
	}
	if l.released || l.avail < units {
		return false, nil
	}
	l.avail -= units
	l.inflight++
	m.outstanding++
	l.lastUsed = time.Now()
	if !l.ahead && !m.closing && l.avail < l.lowWater {
		l.ahead = true
		m.aheads.Add(1)
		go m.topUpAhead(l, call, units)
	}
	return true, nil
}

// finished counts a reservation settled or cancelled (under mu), and tells a stopping
// meter when none is left.
func (m *Meter) finished() {
	m.outstanding--
	if m.outstanding == 0 && m.idle != nil {
		close(m.idle)
		m.idle = nil
	}
}

// topUpAhead tops a busy lease that runs low up in the background, so that its calls
// do not wait for the round trip: a top-up waits for the key's balance row, which the
// settler's commit holds. A refusal or an error here is the next dry call's to meet.
func (m *Meter) topUpAhead(l *lease, call Call, units int64) {
	defer m.aheads.Done()
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.LeaseTTL/3)
	defer cancel()
	if err := m.topUp(ctx, l, call, units, true); err != nil {
		m.logger.Debug("top-up ahead of need", "lease", l.id, "err", err)
	}
	m.mu.Lock()
	l.ahead = false
	m.mu.Unlock()
}

// topUp reserves more units for the lease (at least enough for this call, as much as
// the lease's size asks when the budgets have room): for a call that found the lease
// dry, or ahead of need when the lease runs low.
func (m *Meter) topUp(ctx context.Context, l *lease, call Call, units int64, ahead bool) error {
	l.acquire.Lock()
	defer l.acquire.Unlock()
	m.mu.Lock()
	released, avail := l.released, l.avail
	enough := avail >= units
	if ahead {
		enough = avail >= l.lowWater
	}
	var want int64
	if !released && !enough {
		l.filling++ // housekeeping and release leave a lease being topped up alone
		want = m.leaseWant(l, units)
	}
	m.mu.Unlock()
	if released {
		return errLeaseGone
	}
	if enough {
		return nil // another top-up came meanwhile
	}
	defer func() {
		m.mu.Lock()
		l.filling--
		l.lastUsed = time.Now()
		m.mu.Unlock()
	}()
	need, counted := units-avail, &m.topUps[0]
	if ahead {
		need, counted = units, &m.topUps[1]
	}
	counted.Add(1)
	// Not on the caller's context: a statement cut off while it waits on a row lock may
	// still commit, its grant unknown here. Bounded all the same.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.LeaseTTL/3)
	defer cancel()
	var outcome string
	var granted int64
	sent := time.Now()
	for attempt := 0; ; attempt++ {
		err := m.pool.QueryRow(ctx, `SELECT outcome, granted FROM meter_lease($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
			l.id, m.owner, l.keyID, l.accountID, l.env, l.day, need, max(need, want),
			UnitPriceUSD, call.Account.Plan().Limits().UnitsPerDay, m.cfg.LeaseTTL).Scan(&outcome, &granted)
		if err == nil {
			break
		}
		if !postgres.IsRetryable(err) || attempt == 5 {
			// the row may hold more than avail: nothing more is taken from this lease,
			// and its row, whatever it holds, goes back once its calls settle
			m.retire(ctx, l)
			return fmt.Errorf("reserve: %w", err)
		}
	}
	if outcome != OutcomeOK {
		return refusal(outcome)
	}
	m.mu.Lock()
	l.avail += granted
	// Top up ahead only while the budgets grant all that is asked: near a budget's end
	// (a grant capped at a quarter of what is left) units taken ahead could sit in this
	// lease while another server's calls are refused.
	l.lowWater, l.full = 0, granted >= want
	if l.full {
		l.lowWater = granted / 2
	}
	l.toppedAt = time.Now()
	m.trust(l, sent)
	m.mu.Unlock()
	return nil
}

// leaseWant sizes a lease's next top-up by how fast it was used (under mu): twice the
// last when the last came less than a second ago, half when more than four.
func (m *Meter) leaseWant(l *lease, units int64) int64 {
	base := units * m.cfg.LeaseCalls
	switch since := time.Since(l.toppedAt); {
	case l.want < base:
		l.want = base
	case since < time.Second:
		l.want = min(l.want*2, base*64)
	case since > 4*time.Second:
		l.want = max(l.want/2, base)
	}
	return l.want
}

// Cancel gives an unanswered call's units back to its lease.
func (r *Reservation) Cancel() {
	if r == nil || !r.done.CompareAndSwap(false, true) {
		return
	}
	m := r.m
	m.mu.Lock()
	r.l.avail += r.units
	r.l.inflight--
	m.finished()
	m.mu.Unlock()
}

// Answered is what a call produced, for its line item.
type Answered struct {
	Endpoint domain.Endpoint
	Params   Params
	Engine   string
	Path     string
	Cached   bool // no search ran: the cached price
	// Idempotency, when set, is the call's claimed Idempotency-Key and its answer,
	// stored with the charge.
	Idempotency *Stored
}

// Units is what the call is charged once answered: the fresh or the cached price.
func (r *Reservation) Units(cached bool) int64 {
	if cached && !r.call.Cached {
		return r.price.Charged(true)
	}
	return r.units
}

// Settle records an answered call: it is charged in the settler's next group commit,
// a line of its key's next ChargesSettled. It returns at once (the charge is not yet
// durable). After the meter's final drain (it stopped, and StopGrace or Stop's context
// ran out before this call was answered) nothing can be charged any more: the call is
// refused (OutcomeStoppedUnsettled: 503, nothing charged, retry), counted and logged,
// and its answer must not be given.
func (r *Reservation) Settle(a Answered) error {
	if !r.done.CompareAndSwap(false, true) {
		return errors.New("reservation already settled or cancelled")
	}
	m := r.m
	units := r.Units(a.Cached)
	line := SettledCharge{RequestID: r.call.RequestID, Day: r.l.day, ChargedAt: m.now().UTC().Truncate(time.Microsecond), Endpoint: string(a.Endpoint),
		Params: a.Params, Engine: a.Engine, Path: a.Path, Cached: a.Cached, Units: units, USD: UnitsUSD(units)}
	if a.Idempotency != nil {
		line.IdempotencyKey = a.Idempotency.Key
	}
	// encoded here, beside the other calls, not in the settler's serial loop
	encoded, err := gojson.Marshal(&line)
	if err != nil {
		r.done.Store(false)
		r.Cancel()
		return err
	}
	m.mu.Lock()
	if m.final {
		// the final drain has begun: whatever it waits for was queued before this
		r.l.avail += r.units
		r.l.inflight--
		m.finished()
		m.mu.Unlock()
		m.logger.Warn("a call answered after the meter's final drain is not charged; its answer is withheld",
			"request_id", line.RequestID, "key_id", r.l.keyID, "units", units)
		return refusal(OutcomeStoppedUnsettled)
	}
	r.l.avail += r.units - units
	r.l.inflight--
	m.finished()
	r.l.pending += units
	m.unsettled = append(m.unsettled, time.Now()) // counted by the final drain from here
	m.mu.Unlock()
	select {
	case m.queue <- &settlement{lease: r.l, line: line, encoded: encoded, idem: a.Idempotency}:
	case <-m.stopped:
		// Only a crashed meter (Crash) stops without receiving it: the final drain of
		// a stopping one receives every call counted in unsettled before it closes
		// stopped. A crash forgives what it had not settled; the answer stands.
		m.logger.Warn("meter stopped before a call was settled; it is forgiven", "request_id", line.RequestID)
		m.mu.Lock()
		r.l.pending -= units
		m.unsettled = m.unsettled[1:] // nothing else will take it off
		if a.Idempotency != nil {
			delete(m.claims, claimKey{a.Idempotency.Scope, a.Idempotency.Key})
		}
		m.mu.Unlock()
	}
	return nil
}

// waitBacklog holds a new call back while the oldest answered call has waited more than
// MaxBacklog to be settled: what a crash could forgive stays within that bound. After
// BacklogWait the call is refused (503), with nothing reserved.
func (m *Meter) waitBacklog(ctx context.Context) error {
	var deadline <-chan time.Time
	for {
		m.mu.Lock()
		behind := len(m.unsettled) > 0 && time.Since(m.unsettled[0]) > m.cfg.MaxBacklog
		settled := m.settled
		m.mu.Unlock()
		if !behind {
			return nil
		}
		if deadline == nil {
			t := time.NewTimer(m.cfg.BacklogWait)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-settled:
		case <-deadline:
			return refusal(OutcomeBacklog)
		case <-m.stopped:
			return refusal(OutcomeStopped)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Done is closed once the meter has stopped: what was answered is settled and the
// leases are given back.
func (m *Meter) Done() <-chan struct{} { return m.stopped }

// Stop stops the meter as the end of its context does, and returns once it has
// stopped: it reserves nothing more and waits for the calls it reserved to be settled
// or cancelled until ctx ends or StopGrace has passed, whichever comes first; then it
// settles every call answered so far and gives its leases back. A call answered later
// is not charged (Settle refuses it).
func (m *Meter) Stop(ctx context.Context) {
	select {
	case m.stopReq <- ctx:
	case <-m.stopped:
	}
	<-m.stopped
}

// StopGrace is how long a stopping meter waits for the calls it reserved
// (MeterConfig.StopGrace): how long a stopping server waits for its requests.
func (m *Meter) StopGrace() time.Duration { return m.cfg.StopGrace }

// Owner names this server in its leases and claims.
func (m *Meter) Owner() string { return m.owner }
