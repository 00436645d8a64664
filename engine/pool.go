package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Priority is the class a search waits in when every process is busy. Waiting
// Interactive searches are served before waiting Batch ones; within a class, first
// come first served. An interactive search that finds every process busy preempts
// the youngest running Batch search (stopped, ErrPreempted, its caller runs it again)
// instead of waiting up to a whole batch search for a process: a client waits for a
// stop and a reset, not for a job's position. Batch work is never starved: a Batch
// waiter that has waited BatchMaxWait goes ahead of interactive ones, and the search
// it starts is not preempted.
type Priority uint8

const (
	Interactive Priority = iota // a client waiting on POST /eval or /bestmove
	Batch                       // the job executor (analyze, batch)
	numPriorities
)

func (p Priority) String() string {
	if p == Batch {
		return "batch"
	}
	return "interactive"
}

// PoolConfig configures one pool of identical engine processes.
type PoolConfig struct {
	Path string   // engine executable
	Args []string // its arguments (none for Stockfish)

	Size         int           // processes; default runtime.NumCPU()
	QueueWait    time.Duration // how long a search waits for a free process; default 2 s
	StopGrace    time.Duration // stop -> bestmove before a kill; default 1 s
	HangTimeout  time.Duration // longest silence of a searching engine; default 60 s
	StartTimeout time.Duration // handshake limit (uci ... readyok), a replacement's too; default 30 s
	BatchMaxWait time.Duration // longest a Batch search yields to interactive ones; default 1 s
	NoPreempt    bool          // never stop a running Batch search for an interactive one

	// Boost is how many nice levels the processes run ahead of the server, so that
	// bookkeeping (recording, charging, projecting, the database on the same machine)
	// runs rather between searches than in the middle of them; it needs root or
	// CAP_SYS_NICE, else the engines run at the server's level (said once). Default 5;
	// <0: none.
	Boost int

	MaxHashMB  int               // cap on a request's Hash (MiB); default 256, <0: engine max
	MaxThreads int               // cap on a request's Threads; default 1, <0: engine max
	Options    map[string]string // set on every process after the handshake; they are
	// the values a process is reset to (e.g. "Hash": "64"). String options allowed here.

	Logger *slog.Logger // default slog.Default()
}

func (c *PoolConfig) withDefaults() {
	if c.Size <= 0 {
		c.Size = runtime.NumCPU()
	}
	if c.QueueWait <= 0 {
		c.QueueWait = 2 * time.Second
	}
	if c.StopGrace <= 0 {
		c.StopGrace = time.Second
	}
	if c.HangTimeout <= 0 {
		c.HangTimeout = 60 * time.Second
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = 30 * time.Second
	}
	if c.BatchMaxWait <= 0 {
		c.BatchMaxWait = time.Second
	}
	if c.Boost == 0 {
		c.Boost = 5
	}
	if c.MaxHashMB == 0 {
		c.MaxHashMB = defaultMaxHashMB
	}
	if c.MaxThreads == 0 {
		c.MaxThreads = 1
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// defaultMaxHashMB is the cap on a request's Hash (MiB) when none is configured.
const defaultMaxHashMB = 256

// Pool is a fixed-size set of warm engine processes of one executable.
//
//   - Processes are started and handshaken up front and reused.
//   - Every search starts on a reset process (options back to defaults, ucinewgame),
//     so nothing leaks between requests. A process nobody waits for is sent its reset
//     as its search ends and is available at once (the engine clears its hash while
//     nobody needs it, and a search that comes meanwhile follows the reset in its
//     input); one that a search waits for goes to it at once and is reset by the
//     commands that start its search. Either way a busy engine goes from one search to
//     the next without a round trip.
//   - A process that dies or hangs is killed and replaced in the background; the
//     request that finds it so gets ErrEngineFailed. One that died idle is replaced
//     before any request gets it, and a request that got it in the moment before the
//     pool could see it had died (its output not yet ended) runs again, once, on
//     another: a search whose engine printed nothing for it, on a process taken at
//     rest. The number of processes never exceeds Size: a replacement only takes a
//     dead process's slot.
//   - When all are busy a search queues up to QueueWait, by Priority, then gets
//     ErrSaturated.
type Pool struct {
	cfg   PoolConfig
	pcfg  procConfig
	lim   limits
	ident Identity
	log   *slog.Logger

	mu      sync.Mutex
	idle    []*process
	waiting [numPriorities][]*waiter
	all     map[*process]struct{}  // every live process, idle or busy
	healing int                    // replacements being started
	batches map[*process]*batchRun // running Batch searches that may be preempted
	closed  bool
	closing chan struct{}
	bg      sync.WaitGroup // replacements of dead processes

	// testHookAcquired, when set (by tests, before any search), is called by Search
	// as soon as it has its process.
	testHookAcquired func(Priority)

	searches  atomic.Int64 // searches handed to a process
	preempted atomic.Int64 // Batch searches stopped for interactive ones
	nodes     atomic.Int64 // nodes the finished searches reported
	waits     [numPriorities]waitCounts
}

type waiter struct {
	ch    chan *process // buffered 1; nil value means the pool closed
	since time.Time
	aged  bool // a Batch waiter served ahead of interactive ones: not preemptible
}

// batchRun is a running Batch search that an interactive one may preempt.
type batchRun struct {
	started   time.Time
	stop      context.CancelCauseFunc
	preempted bool
}

// NewPool starts cfg.Size processes concurrently and returns when all are warm.
func NewPool(ctx context.Context, cfg PoolConfig) (*Pool, error) {
	cfg.withDefaults()
	pl := &Pool{
		cfg:     cfg,
		log:     cfg.Logger.With("engine", cfg.Path),
		all:     make(map[*process]struct{}, cfg.Size),
		batches: map[*process]*batchRun{},
		closing: make(chan struct{}),
	}
	pl.lim = limits{maxHashMB: int64(cfg.MaxHashMB), maxThreads: int64(cfg.MaxThreads)}
	pl.pcfg = procConfig{
		path: cfg.Path, args: cfg.Args,
		startTimeout: cfg.StartTimeout, stopGrace: cfg.StopGrace, hangTimeout: cfg.HangTimeout,
		boost: cfg.Boost, log: pl.log,
	}

	// The first process tells us the option list, which the base options are checked
	// against; the others start in parallel after it.
	first, err := startProcess(ctx, &pl.pcfg)
	if err != nil {
		return nil, err
	}
	pl.ident = first.ident
	base, err := pl.baseOptions(cfg.Options)
	if err != nil {
		first.quit(cfg.StopGrace)
		return nil, err
	}
	pl.pcfg.baseOptions = base
	if len(base) > 0 {
		// Apply them to the first process the same way the others get them.
		first.quit(cfg.StopGrace)
		if first, err = startProcess(ctx, &pl.pcfg); err != nil {
			return nil, err
		}
	}
	procs := []*process{first}
	errs := make([]error, cfg.Size)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 1; i < cfg.Size; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := startProcess(ctx, &pl.pcfg)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs[i] = err
				return
			}
			procs = append(procs, p)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, p := range procs {
			p.quit(cfg.StopGrace)
		}
		return nil, err
	}
	for _, p := range procs {
		pl.all[p] = struct{}{}
	}
	pl.idle = procs
	pl.log.Debug("engine pool started", "size", cfg.Size, "name", pl.ident.Name)
	return pl, nil
}

// baseOptions validates the pool's configured options. Unlike request options they may
// be strings (the operator, not a client, chose them).
func (pl *Pool) baseOptions(m map[string]string) ([]optionValue, error) {
	var out []optionValue
	for name, v := range m {
		o := pl.ident.option(name)
		if o == nil {
			return nil, fmt.Errorf("%w: %s has no option %q", ErrInvalidOption, pl.ident.Name, name)
		}
		if o.Type == OptionString {
			out = append(out, optionValue{key: strings.ToLower(o.Name), name: o.Name, typ: o.Type, value: v})
			continue
		}
		ov, err := validateOption(&pl.ident, name, v, &limits{})
		if err != nil {
			return nil, err
		}
		out = append(out, ov)
	}
	return out, nil
}

// Identity returns what the engine reported in its handshake.
func (pl *Pool) Identity() Identity { return pl.ident }

// Size is the configured number of processes.
func (pl *Pool) Size() int { return pl.cfg.Size }

// PoolStats is a snapshot for metrics and tests.
type PoolStats struct {
	Size    int // configured
	Live    int // processes alive (idle, busy or resetting)
	Idle    int
	Healing int // replacements being started
	// Dead counts the idle processes that exited (killed, crashed) since: replaced when
	// a search next needs one, counted in neither Live nor Idle.
	Dead int
	// Resetting counts the live processes still clearing their hash after a search
	// (idle ones among them: a search sent to one runs once the reset is done).
	Resetting int
	Waiting   [numPriorities]int
	// Searches counts searches handed to a process since the pool started.
	Searches int64
	// Preempted counts Batch searches stopped to serve interactive ones.
	Preempted int64
	// Nodes counts the nodes the searches that returned a result reported.
	Nodes int64
	// QueueWait is, per priority, how long searches waited for a process.
	QueueWait [numPriorities]WaitStats
}

// QueueWaitBuckets are the upper bounds of WaitStats.Buckets (the last bucket, past
// them, is +Inf): from a process that was free to the 2 s default QueueWait and past it.
var QueueWaitBuckets = [numWaitBuckets - 1]time.Duration{time.Millisecond, 5 * time.Millisecond, 25 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second,
	5 * time.Second, 10 * time.Second, 30 * time.Second}

const numWaitBuckets = 12

// WaitStats counts the waits for a process since the pool started: those that got one
// by how long they waited (a histogram), and those that gave up (ErrSaturated).
type WaitStats struct {
	Buckets   [numWaitBuckets]int64 // got a process within QueueWaitBuckets[i] (not cumulative); the last: longer
	Sum       time.Duration
	Saturated int64
}

// waitCounts is WaitStats kept with atomics: observed off the pool's lock.
type waitCounts struct {
	buckets   [numWaitBuckets]atomic.Int64
	sum       atomic.Int64 // ns
	saturated atomic.Int64
}

func (w *waitCounts) observe(d time.Duration) {
	i := 0
	for i < len(QueueWaitBuckets) && d > QueueWaitBuckets[i] {
		i++
	}
	w.buckets[i].Add(1)
	w.sum.Add(int64(d))
}

func (w *waitCounts) snapshot() WaitStats {
	s := WaitStats{Sum: time.Duration(w.sum.Load()), Saturated: w.saturated.Load()}
	for i := range w.buckets {
		s.Buckets[i] = w.buckets[i].Load()
	}
	return s
}

// Stats returns a snapshot of the pool's state.
func (pl *Pool) Stats() PoolStats {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	s := PoolStats{Size: pl.cfg.Size, Live: len(pl.all), Idle: len(pl.idle), Healing: pl.healing, Searches: pl.searches.Load(),
		Preempted: pl.preempted.Load(), Nodes: pl.nodes.Load()}
	for _, p := range pl.idle {
		if p.hasExited() {
			s.Dead++
		}
	}
	s.Live -= s.Dead
	s.Idle -= s.Dead
	for p := range pl.all {
		if p.resetting.Load() > 0 && !p.hasExited() {
			s.Resetting++
		}
	}
	for i := range pl.waiting {
		s.Waiting[i] = len(pl.waiting[i])
		s.QueueWait[i] = pl.waits[i].snapshot()
	}
	return s
}

// NamedPoolStats is one started pool's stats with the engine and path it runs.
type NamedPoolStats struct {
	Engine string
	Path   Path
	PoolStats
}

// Stats returns the stats of every pool started so far (pools start on first use).
func (c *Catalog) Stats() []NamedPoolStats {
	c.mu.Lock()
	var out []NamedPoolStats
	var pools []*Pool
	for k, e := range c.pools {
		select {
		case <-e.ready:
			if e.pool != nil {
				out = append(out, NamedPoolStats{Engine: k.id, Path: k.path})
				pools = append(pools, e.pool)
			}
		default: // still starting
		}
	}
	c.mu.Unlock()
	for i, pl := range pools {
		out[i].PoolStats = pl.Stats()
	}
	return out
}

// Prepare validates a search against this pool's engine and returns its options in
// the form a process applies. Pool.Search calls it; it is exported so a caller can
// reject a bad request before queueing.
func (pl *Pool) Prepare(s *Search) error {
	_, err := pl.prepare(s)
	return err
}

func (pl *Pool) prepare(s *Search) ([]optionValue, error) {
	if s.Depth < 0 || s.MoveTime < 0 || s.MultiPV < 0 {
		return nil, fmt.Errorf("%w: negative limit", ErrInvalidSearch)
	}
	if s.Depth == 0 && s.MoveTime == 0 {
		// Never "go infinite": every search must end by itself.
		return nil, fmt.Errorf("%w: need a depth or a movetime", ErrInvalidSearch)
	}
	if strings.ContainsAny(s.FEN, "\n\r") {
		return nil, fmt.Errorf("%w: newline in FEN", ErrInvalidSearch)
	}
	for _, m := range s.Moves {
		if !isMove(m) {
			return nil, fmt.Errorf("%w: %q is not a UCI move", ErrInvalidSearch, m)
		}
	}
	n := len(s.Options)
	if s.MultiPV > 0 {
		n++
	}
	if n == 0 {
		return nil, nil
	}
	opts := make([]optionValue, 0, n)
	for name, v := range s.Options {
		if strings.EqualFold(name, "MultiPV") && s.MultiPV > 0 {
			continue // the field wins over the option
		}
		if strings.ContainsAny(name, "\n\r") || strings.ContainsAny(v, "\n\r") {
			return nil, fmt.Errorf("%w: newline in option", ErrInvalidOption)
		}
		ov, err := validateOption(&pl.ident, name, v, &pl.lim)
		if err != nil {
			return nil, err
		}
		opts = append(opts, ov)
	}
	if s.MultiPV > 0 {
		ov, err := validateOption(&pl.ident, "MultiPV", fmt.Sprint(s.MultiPV), &pl.lim)
		if err != nil {
			return nil, err
		}
		opts = append(opts, ov)
	}
	return opts, nil
}

// Search runs s on a free process. It waits up to QueueWait for one (ErrSaturated
// after that), returns ctx's error if ctx ends first (the engine is told to stop), and
// ErrEngineFailed if the process dies or hangs. It never blocks past
// ctx's end + StopGrace, or past HangTimeout of engine silence.
func (pl *Pool) Search(ctx context.Context, prio Priority, s Search) (*Result, error) {
	opts, err := pl.prepare(&s)
	if err != nil {
		return nil, err
	}
	queued := time.Now()
	res, again, err := pl.searchOnce(ctx, prio, &s, opts, queued, true)
	if again {
		// The process had died at rest: its commands could not be written, or its output
		// ended without a line for them. A process that dies idle is replaced before a
		// search gets it once its reader has reaped it; one taken in the moment before
		// that gets here. Nothing of the search reached the caller, so it runs again,
		// once, on another process (the replacement, in a one-process pool), within
		// what is left of QueueWait.
		pl.log.Warn("engine process had died before its search; running it on another", "err", err)
		res, _, err = pl.searchOnce(ctx, prio, &s, opts, queued, false)
	}
	return res, err
}

// searchOnce is one try of Search, on a process acquired by queued + QueueWait. again
// says it failed on a process taken at rest (not straight from another search) before
// the engine printed anything for it: it may run again on another (when mayRetry).
func (pl *Pool) searchOnce(ctx context.Context, prio Priority, s *Search, opts []optionValue, queued time.Time, mayRetry bool) (*Result, bool, error) {
	asked := time.Now()
	p, aged, err := pl.acquire(ctx, prio, pl.cfg.QueueWait-asked.Sub(queued))
	waits := &pl.waits[min(prio, Batch)]
	if err != nil {
		if errors.Is(err, ErrSaturated) {
			waits.saturated.Add(1)
		}
		return nil, false, err
	}
	waits.observe(time.Since(asked))
	pl.searches.Add(1)
	atRest := !p.dirty
	if pl.testHookAcquired != nil {
		pl.testHookAcquired(prio)
	}
	early := false // preempted before it began
	if prio == Batch && !aged && !pl.cfg.NoPreempt {
		var stop context.CancelCauseFunc
		ctx, stop = context.WithCancelCause(ctx)
		defer stop(nil)
		b := &batchRun{started: time.Now(), stop: stop}
		pl.mu.Lock()
		pl.batches[p] = b
		// An interactive search that came since acquire gave us the process found this
		// one not yet preemptible, and preemption is tried as a waiter joins the queue:
		// it is tried again now. This search, the youngest, is the one stopped.
		if len(pl.waiting[Interactive]) > 0 {
			pl.preemptLocked()
		}
		early = b.preempted
		pl.mu.Unlock()
	}
	var res *Result
	if early {
		err = errors.New("engine: search preempted before it began") // the engine was sent nothing
	} else {
		res, err = p.search(ctx, s, opts)
	}
	if res != nil {
		pl.nodes.Add(res.Nodes)
	}
	if prio == Batch {
		pl.mu.Lock()
		delete(pl.batches, p)
		pl.mu.Unlock()
		if err != nil && errors.Is(context.Cause(ctx), ErrPreempted) {
			pl.release(p)
			return nil, false, fmt.Errorf("%w (%v)", ErrPreempted, err)
		}
	}
	pl.release(p)
	if err != nil && !errIsContext(err) && !errors.Is(err, ErrClosed) {
		pl.mu.Lock()
		closed := pl.closed
		pl.mu.Unlock()
		if closed {
			return nil, false, fmt.Errorf("%w: %v", ErrClosed, err)
		}
		var silent silentFailure
		if mayRetry && atRest && errors.As(err, &silent) && ctx.Err() == nil {
			return nil, true, err
		}
		pl.log.Warn("engine search failed", "pid", p.pid, "err", err)
	}
	return res, false, err
}

// acquire takes an idle process or waits in its priority queue up to wait; aged says
// a Batch search got its process ahead of interactive ones (after BatchMaxWait).
func (pl *Pool) acquire(ctx context.Context, prio Priority, wait time.Duration) (*process, bool, error) {
	if prio >= numPriorities {
		prio = Batch
	}
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	pl.mu.Lock()
	if pl.closed {
		pl.mu.Unlock()
		return nil, false, ErrClosed
	}
	// Invariant: a process is idle only when nobody waits (release hands processes to
	// waiters first), so taking an idle one never jumps the queue.
	for n := len(pl.idle); n > 0; n = len(pl.idle) {
		p := pl.idle[n-1]
		pl.idle = pl.idle[:n-1]
		if p.hasExited() {
			// It died while idle (OOM killer, operator): replace it, try the next.
			pl.mu.Unlock()
			pl.log.Warn("idle engine process had exited; replacing", "pid", p.pid)
			pl.replace(p)
			pl.mu.Lock()
			if pl.closed {
				pl.mu.Unlock()
				return nil, false, ErrClosed
			}
			continue
		}
		pl.mu.Unlock()
		return p, false, nil
	}
	w := &waiter{ch: make(chan *process, 1), since: time.Now()}
	pl.waiting[prio] = append(pl.waiting[prio], w)
	if prio == Interactive {
		pl.preemptLocked()
	}
	pl.mu.Unlock()

	t := time.NewTimer(wait)
	defer t.Stop()
	var err error
	select {
	case p := <-w.ch:
		if p == nil {
			return nil, false, ErrClosed
		}
		return p, w.aged, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-t.C:
		err = fmt.Errorf("%w: no free process within %v", ErrSaturated, pl.cfg.QueueWait)
	}
	// Leave the queue. If we are no longer in it, a process (or the close signal) was
	// handed to us concurrently: pass it on rather than leak it.
	pl.mu.Lock()
	q := pl.waiting[prio]
	found := false
	for i, x := range q {
		if x == w {
			pl.waiting[prio] = append(q[:i:i], q[i+1:]...)
			found = true
			break
		}
	}
	pl.mu.Unlock()
	if !found {
		if p := <-w.ch; p != nil {
			if p.dirty {
				pl.release(p) // handed over straight from a search: reset it first
			} else {
				pl.put(p)
			}
		}
	}
	return nil, false, err
}

// preemptLocked stops the youngest preemptible Batch search when interactive waiters
// outnumber the processes already on their way back (stops in progress); pl.mu held.
func (pl *Pool) preemptLocked() {
	if pl.cfg.NoPreempt {
		return
	}
	coming := 0
	var youngest *batchRun
	for _, b := range pl.batches {
		if b.preempted {
			coming++
		} else if youngest == nil || b.started.After(youngest.started) {
			youngest = b
		}
	}
	if youngest == nil || len(pl.waiting[Interactive]) <= coming {
		return
	}
	youngest.preempted = true
	youngest.stop(ErrPreempted)
	pl.preempted.Add(1)
}

// release takes a process back after a search: a dead one is replaced; a live one goes
// straight to the first waiter, whose search resets it in the same write as its own
// commands (the engine goes from one search to the next without waiting for us to
// read a readyok); with nobody waiting it is sent its reset and made available.
func (pl *Pool) release(p *process) {
	if p.quitting.Load() {
		pl.forget(p) // Close is reaping it
		return
	}
	if p.isDead() {
		pl.replace(p)
		return
	}
	pl.mu.Lock()
	if w := pl.nextWaiterLocked(); w != nil { // none once closed: Close empties the queues
		pl.mu.Unlock()
		w.ch <- p
		return
	}
	pl.mu.Unlock()
	// Nobody waits: the reset goes out now and the process is available at once. The
	// engine reads its input in order, so the next search's commands, whenever they
	// come, run on the reset engine: it goes from clearing its hash straight into that
	// search, with no round trip for a readyok between them (which left a job's engine
	// idle for half a millisecond a position: docs/BENCHMARKS.md, session 29). A
	// process that dies meanwhile is found by acquire, one that hangs by that search's
	// silence watch.
	if err := p.sendReset(); err != nil {
		pl.log.Warn("engine reset failed; replacing", "pid", p.pid, "err", err)
		p.kill()
		pl.replace(p)
		return
	}
	pl.put(p)
}

// put makes a warm process available: to the first interactive waiter, else the first
// batch waiter, else the idle list.
func (pl *Pool) put(p *process) {
	pl.mu.Lock()
	if pl.closed {
		pl.mu.Unlock()
		p.quit(pl.cfg.StopGrace)
		pl.forget(p)
		return
	}
	if w := pl.nextWaiterLocked(); w != nil {
		pl.mu.Unlock()
		w.ch <- p
		return
	}
	pl.idle = append(pl.idle, p)
	pl.mu.Unlock()
}

// nextWaiterLocked takes the waiter a free process goes to: the first interactive one,
// else the first batch one, unless the first batch waiter has waited BatchMaxWait;
// nil if nobody waits. pl.mu held.
//
// A process that goes to an aged batch waiter while interactive ones wait may be the
// very one an interactive waiter's preemption freed: that preemption is spent on the
// batch waiter (which goes first by design) and nothing else would stop another batch
// search, so the interactive waiter would wait for a batch search to end, or give up
// after QueueWait. It is preempted for again here, as if it had just joined the queue.
func (pl *Pool) nextWaiterLocked() *waiter {
	order := [numPriorities]Priority{Interactive, Batch}
	if q := pl.waiting[Batch]; len(q) > 0 && time.Since(q[0].since) >= pl.cfg.BatchMaxWait {
		order = [numPriorities]Priority{Batch, Interactive} // batch work yields, but not for ever
		q[0].aged = true
	}
	for _, prio := range order {
		if q := pl.waiting[prio]; len(q) > 0 {
			w := q[0]
			q[0] = nil
			pl.waiting[prio] = q[1:]
			if prio == Batch && len(pl.waiting[Interactive]) > 0 {
				pl.preemptLocked()
			}
			return w
		}
	}
	return nil
}

func (pl *Pool) forget(p *process) {
	pl.mu.Lock()
	delete(pl.all, p)
	pl.mu.Unlock()
}

// replace reaps a dead process and starts another in its slot, retrying with backoff
// while the executable fails to start (logged once per attempt, at most every 10 s).
func (pl *Pool) replace(dead *process) {
	pl.mu.Lock()
	delete(pl.all, dead)
	if pl.closed {
		pl.mu.Unlock()
		<-dead.exited
		return
	}
	pl.healing++
	pl.mu.Unlock()
	pl.bg.Add(1)
	go func() {
		defer pl.bg.Done()
		<-dead.exited // reaped by its read loop; wait so no zombie outlives the slot
		backoff := 100 * time.Millisecond
		for {
			ctx, cancel := context.WithTimeout(context.Background(), pl.cfg.StartTimeout)
			p, err := startProcess(ctx, &pl.pcfg)
			cancel()
			if err == nil {
				pl.mu.Lock()
				pl.healing--
				if pl.closed {
					pl.mu.Unlock()
					p.quit(pl.cfg.StopGrace)
					return
				}
				pl.all[p] = struct{}{}
				pl.mu.Unlock()
				pl.log.Info("engine process replaced", "old_pid", dead.pid, "pid", p.pid)
				pl.put(p)
				return
			}
			pl.log.Error("engine restart failed", "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
			case <-pl.closing:
				pl.mu.Lock()
				pl.healing--
				pl.mu.Unlock()
				return
			}
			backoff = min(backoff*2, 10*time.Second)
		}
	}()
}

// Close stops the pool: waiters get ErrClosed, every process is sent "quit" (a busy
// one's search then fails with ErrClosed) and reaped. Safe to call more than once.
func (pl *Pool) Close() error {
	pl.mu.Lock()
	if pl.closed {
		pl.mu.Unlock()
		pl.bg.Wait()
		return nil
	}
	pl.closed = true
	close(pl.closing)
	for prio := range pl.waiting {
		for _, w := range pl.waiting[prio] {
			w.ch <- nil
		}
		pl.waiting[prio] = nil
	}
	procs := make([]*process, 0, len(pl.all))
	for p := range pl.all {
		procs = append(procs, p)
	}
	pl.idle = nil
	pl.mu.Unlock()

	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.quit(pl.cfg.StopGrace)
			pl.forget(p)
		}()
	}
	wg.Wait()
	pl.bg.Wait()
	return nil
}
