// Package executor runs analysis jobs. Workers take positions, not jobs, from the job
// queue (commands.TakePositions): each position is held under a lease of its own, so
// a job's positions spread over every worker with a free engine, and a worker that
// dies loses only what it held, which another worker takes up when the leases run out.
// An engine never waits on bookkeeping: positions are taken ahead of the engines, and
// an analysed position goes to the recorder while its engine starts the next one. It
// runs inside `chessd serve` and alone as `chessd worker`; any number of them share
// one database.
package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/analysis"
	"chessd/commands"
	"chessd/domain"
	"chessd/engine"
	"chessd/eventstore"
	"chessd/ledger"
	"chessd/postgres"
	"chessd/projections"
)

// ConsumerGroup is the executors' Watermill consumer group on the command bus: part of
// the schema, never renamed.
const ConsumerGroup = "executor_v1"

// Config tunes an Executor.
type Config struct {
	Worker string        // this worker's name; default host:pid
	Lease  time.Duration // how long a position is held without renewal; default 10 s
	// Scan is how often the queue is looked at when no notification came (positions
	// whose worker stopped renewing them); default 1 s.
	Scan time.Duration
	// Parallel is how many positions are searched at once; default 2 (set it to the
	// engine pool's size).
	Parallel int
	// Ahead is the most positions taken beyond those being searched, so that an engine
	// that finishes starts the next one without waiting for the queue; they are taken
	// together, once the engines have started the previous ones. How many is set by
	// Horizon; default 8 × Parallel.
	Ahead int
	// Horizon is how much of the engines' work a take holds ahead: as many positions as
	// the engines search in Horizon at their recent pace, at least Parallel and at most
	// Ahead; default 100 ms. Each take costs the database about a millisecond of CPU,
	// taken from the engines beside it: at depth 10 (15 ms a search) taking two at a
	// time spent 0.4 ms of PostgreSQL's CPU a position on takes. Holding more ahead
	// would make another account's job submitted just after a take wait longer for
	// this worker's engines, and leave more for another worker to redo after a crash.
	Horizon time.Duration
	// RecordEvery is how long an analysed position may wait for others of its job to be
	// recorded with it, in one transaction (one settle, one append, one message for
	// the projections): a job's positions cost the database per batch, not each. A
	// position is recorded at once when no other of its job is searching here (the
	// job's last ones are never held back). Default 1 s: a record costs the worker and
	// the database about as much as several positions do (a settle, a commit, a
	// message to every projection, about 2.5 ms of CPU in all), taken from the engines
	// beside them: at 100 ms a depth-10 job spent a sixth of its CPU outside the
	// engines on them, and at 250 ms a two-worker depth-14 job still spent a third
	// more than at 1 s. A client following the job gets its positions once a second. A
	// worker that dies loses at most that much analysis, which another worker redoes
	// (never charged twice).
	RecordEvery time.Duration
}

// Executor runs jobs' positions.
type Executor struct {
	cfg      Config
	pool     *pgxpool.Pool
	cmds     *commands.Handler
	analysis *analysis.Service
	logger   *slog.Logger

	mu      sync.Mutex
	held    map[commands.Slot]*task // taken, until recorded or dropped
	pending int                     // held and not yet analysed
	waiting []*task                 // held and not yet searching, in the order taken
	jobs    map[string]*jobRun      // the jobs of held positions
	poke    chan struct{}           // something changed: look at the queue again
	// fresh says the queue may have positions a take that found none did not see (a
	// submission came by the command bus): set before the poke that tells it
	fresh atomic.Bool

	stats stats
}

// task is one held position.
type task struct {
	slot   commands.Slot
	job    *jobRun
	ctx    context.Context
	cancel context.CancelFunc
	pos    domain.JobPosition
	result commands.Position
	shed   bool // given back before a searcher took it (under Executor.mu)
}

// jobRun is what a worker knows of a job whose positions it holds.
type jobRun struct {
	job *domain.Job // its positions and spec
	// started is closed once the job's start (JobStarted or JobResumed, committed) and
	// its key are known, or startErr says why not: searches begin before that commit,
	// records and failures wait for it.
	started  chan struct{}
	startErr error
	key      *domain.Key
	tasks    int // held positions of this job
	// searching counts held positions not yet analysed and handed to the recorder: it
	// counts one until the recorder has it, so that a record never leaves out a
	// position that is on its way (record)
	searching int
}

// ready waits until the job's start is known and returns its error; ctx's when ctx
// ends first.
func (r *jobRun) ready(ctx context.Context) error {
	select {
	case <-r.started:
		return r.startErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// New builds an Executor.
func New(cfg Config, pool *pgxpool.Pool, cmds *commands.Handler, svc *analysis.Service, logger *slog.Logger) *Executor {
	if cfg.Worker == "" {
		host, _ := os.Hostname()
		cfg.Worker = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 10 * time.Second
	}
	if cfg.Scan <= 0 {
		cfg.Scan = time.Second
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 2
	}
	if cfg.Ahead <= 0 {
		cfg.Ahead = 8 * cfg.Parallel
	}
	if cfg.Horizon <= 0 {
		cfg.Horizon = 100 * time.Millisecond
	}
	if cfg.RecordEvery <= 0 {
		cfg.RecordEvery = time.Second
	}
	return &Executor{cfg: cfg, pool: pool, cmds: cmds, analysis: svc, logger: logger.With("worker", cfg.Worker),
		held: map[commands.Slot]*task{}, jobs: map[string]*jobRun{}, poke: make(chan struct{}, 1)}
}

// Name is the worker's name, Config.Worker or its default (host:pid).
func (x *Executor) Name() string { return x.cfg.Worker }

// Running lists the jobs this executor holds positions of: a job leaves the list once
// every position it held has been recorded (committed) or dropped.
func (x *Executor) Running() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	ids := make([]string, 0, len(x.jobs))
	for id := range x.jobs {
		ids = append(ids, id)
	}
	return ids
}

// Run works on the queue until ctx ends, then gives back the positions it holds (so
// another worker takes them at once) and returns.
func (x *Executor) Run(ctx context.Context) error {
	listenCtx, stopListening := context.WithCancel(ctx)
	defer stopListening()
	wake := eventstore.Listen(listenCtx, x.pool, x.logger)
	// Every worker hears of every submission (its NOTIFY); the command bus delivers
	// each SubmitJob to one worker of the consumer group, which takes it as a nudge too.
	submitted, unsubscribe := wake.Subscribe(commands.TopicJobCommands)
	defer unsubscribe()
	router, err := x.commandRouter(ctx, wake)
	if err != nil {
		return err
	}

	ready := make(chan *task, x.cfg.Parallel+x.cfg.Ahead)
	analysed := make(chan *task, x.cfg.Parallel+x.cfg.Ahead)
	var engines, bookkeeping sync.WaitGroup
	for range x.cfg.Parallel {
		engines.Add(1)
		go func() {
			defer engines.Done()
			x.search(ctx, ready, analysed)
		}()
	}
	bookkeeping.Add(2)
	go func() {
		defer bookkeeping.Done()
		x.record(ctx, analysed)
	}()
	closed, unsubscribeClosed := wake.Subscribe(commands.TopicJobsClosed)
	defer unsubscribeClosed()
	go func() {
		defer bookkeeping.Done()
		x.renew(ctx, closed)
	}()
	routed := make(chan error, 1)
	go func() { routed <- router.Run(ctx) }()

	x.alive(ctx) // before the first take: the others' takes leave this worker its share
	x.dispatch(ctx, ready, submitted)
	close(ready)
	engines.Wait()
	close(analysed)
	bookkeeping.Wait()
	x.giveBack()
	// dispatch returns only once ctx has ended: a router that failed because of that (a
	// stop while it was still subscribing) stopped as asked
	if err := <-routed; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// commandRouter consumes SubmitJob commands: each is a nudge to look at the queue.
//
// Nothing waits on this consumer: the submission's notification nudges the dispatch
// directly (Run), and the scan looks at the queue while notifications are not heard.
// So it asks again no sooner than once a second when an announcement found nothing
// readable yet (an older transaction still open; eventstore.Backoff). At 50 ms, the
// announcements of a two-worker job (its submission, the positions given back) had
// both workers' consumers ask 14 times a job, each a transaction of three round
// trips, for commands already acted on.
func (x *Executor) commandRouter(ctx context.Context, wake *eventstore.Wakeups) (*message.Router, error) {
	wlog := watermill.NewSlogLoggerWithLevelMapping(x.logger, map[slog.Level]slog.Level{slog.LevelInfo: slog.LevelDebug})
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, wlog)
	if err != nil {
		return nil, err
	}
	ack := 5 * time.Second
	sub, err := wmsql.NewSubscriber(projections.NewBusBeginner(x.pool), wmsql.SubscriberConfig{
		ConsumerGroup:  ConsumerGroup,
		SchemaAdapter:  wmsql.DefaultPostgreSQLSchema{SubscribeBatchSize: 1, GeneratePayloadType: eventstore.BusSchema.GeneratePayloadType},
		OffsetsAdapter: wmsql.DefaultPostgreSQLOffsetsAdapter{},
		BackoffManager: wake.Backoff(commands.TopicJobCommands,
			eventstore.Waiting{Idle: time.Second, Poll: time.Second, Retry: time.Second}),
		ResendInterval: 100 * time.Millisecond,
		AckDeadline:    &ack,
	}, wlog)
	if err != nil {
		return nil, err
	}
	router.AddConsumerHandler("SubmitJob", commands.TopicJobCommands, sub, func(msg *message.Message) error {
		var cmd commands.SubmitJobCommand
		if err := json.Unmarshal(msg.Payload, &cmd); err != nil {
			x.logger.Error("bad SubmitJob command", "err", err)
			return nil // a command that cannot be read is dropped, not retried forever
		}
		x.fresh.Store(true)
		x.nudge()
		return nil
	})
	return router, nil
}

func (x *Executor) nudge() {
	select {
	case x.poke <- struct{}{}:
	default:
	}
}

// dispatch keeps the engines supplied: it takes positions from the queue whenever no
// more than Parallel are waiting or searching here, enough for the engines' next
// Horizon (ahead), and waits for a nudge (a submission, a position analysed or
// dropped) or the scan interval otherwise.
//
// A take that found nothing free means the queue has nothing until a submission or a
// release (both announced on the job commands' topic) or a lease running out (the
// scan): until one of those, the positions analysed here do not send another take
// after it. Without this, each of a job's last searches was followed by a take that
// found nothing, about a millisecond of the database's CPU taken from the engines still
// searching beside it (docs/BENCHMARKS.md, session 31).
func (x *Executor) dispatch(ctx context.Context, ready chan<- *task, submitted <-chan struct{}) {
	scan := time.NewTicker(x.cfg.Scan)
	defer scan.Stop()
	drained := false
	for ctx.Err() == nil {
		if x.fresh.Swap(false) {
			drained = false
		}
		ahead := x.ahead()
		x.mu.Lock()
		want, idle := x.cfg.Parallel+ahead-x.pending, max(x.cfg.Parallel-x.pending, 0)
		room := x.cfg.Parallel + x.cfg.Ahead - x.pending
		x.mu.Unlock()
		got, asked := 0, 0
		// once the engines have taken up the ones ahead: one query per take, while every
		// engine still has a search to finish first
		if want >= ahead && !drained {
			var err error
			asked = takeSize(want, room)
			got, err = x.take(ctx, asked, idle, ready)
			drained = got == 0 && err == nil
		}
		if got > 0 && got == asked {
			continue // there may be more
		}
		select {
		case <-ctx.Done():
		case <-x.poke:
		case <-submitted:
			drained = false
		case <-scan.C:
			drained = false
		}
	}
}

// takeSize is how many positions to ask for when want are wanted and room fit:
// commands.TakePositions takes a power of two (it rounds down), so want goes to the
// nearer one (6 to 8, 5 to 4), within room. Rounded down, a two-worker depth-10 job's
// takes of the 6 wanted were 4 each, 16 takes a job at about 0.7 ms of CPU each
// (docs/BENCHMARKS.md, session 32).
func takeSize(want, room int) int {
	if want < 1 {
		return want
	}
	n := 1 << (bits.Len(uint(want)) - 1)
	if want*want > 2*n*n { // above the geometric middle of n and 2n
		n *= 2
	}
	return min(n, room)
}

// ahead is how many positions to hold beyond those being searched: what the engines
// search in Horizon at the pace of recent searches, within [Parallel, Ahead]; Parallel
// before the first search.
func (x *Executor) ahead() int {
	lo := min(x.cfg.Parallel, x.cfg.Ahead)
	per := x.stats.pace()
	if per <= 0 {
		return lo
	}
	n := int(int64(x.cfg.Horizon) * int64(x.cfg.Parallel) / int64(per))
	return max(lo, min(n, x.cfg.Ahead))
}

// take takes up to n positions, need of them for idle engines and the rest within
// this worker's share of the queue (commands.TakePositions), and hands them to the
// engines; it returns how many the queue gave, or the take's error. They count as
// searching before the first reaches an engine, so that a record waiting for the rest
// of a job (record) knows of all of them.
func (x *Executor) take(ctx context.Context, n, need int, ready chan<- *task) (int, error) {
	taken, err := x.cmds.TakePositions(ctx, x.cfg.Worker, n, need, x.cfg.Lease)
	if err != nil {
		if ctx.Err() == nil {
			x.logger.Warn("take positions", "err", err)
		}
		return 0, err
	}
	x.stats.took(len(taken))
	tasks := make([]*task, 0, len(taken))
	for _, t := range taken {
		run, err := x.jobOf(ctx, t)
		if err != nil {
			if !errors.Is(err, commands.ErrNotClaimable) && ctx.Err() == nil {
				x.logger.Warn("start job", "job_id", t.JobID, "err", err) // its lease runs out; it is taken again
			}
			continue
		}
		tctx, cancel := context.WithCancel(ctx)
		tasks = append(tasks, &task{slot: t.Slot, job: run, ctx: tctx, cancel: cancel, pos: run.job.Positions()[t.Index]})
	}
	x.mu.Lock()
	kept := tasks[:0]
	for _, tk := range tasks {
		// A position this worker still holds, taken again after its lease ran out (its
		// renewals failed for a lease): one task a position. The one holding it goes on
		// unless it was stopped; else the new one takes its place, and the old one's
		// done, no longer finding itself held, leaves the job's count to this.
		if old := x.held[tk.slot]; old != nil {
			if old.ctx.Err() == nil {
				tk.cancel()
				continue
			}
			old.job.tasks--
		}
		kept = append(kept, tk)
		// the job's last held position may have ended since jobOf: one run per job
		if run := x.jobs[tk.slot.JobID]; run == nil {
			x.jobs[tk.slot.JobID] = tk.job
		} else {
			tk.job = run
		}
		x.held[tk.slot] = tk
		x.waiting = append(x.waiting, tk)
		x.pending++
		tk.job.tasks++
		tk.job.searching++
	}
	x.mu.Unlock()
	for _, tk := range kept {
		ready <- tk // never blocks: ready holds Parallel+Ahead and so many are pending at most
	}
	return len(taken), nil
}

// jobOf returns what this worker knows of a taken position's job. The first time, it
// reads the job (its positions and spec, fixed at submission) and starts it beside
// the first searches (start): the engines do not wait for JobStarted's commit.
// A position taken over from a stopped worker of a job this worker runs says so
// (JobResumed) before its search.
func (x *Executor) jobOf(ctx context.Context, t commands.Taken) (*jobRun, error) {
	x.mu.Lock()
	run := x.jobs[t.JobID]
	x.mu.Unlock()
	if run != nil {
		if t.TookOver {
			err := persist(ctx, x.logger.With("job_id", t.JobID), "resume job", func() error {
				_, _, err := x.cmds.StartJob(ctx, t.JobID, x.cfg.Worker, true)
				return err
			})
			if err != nil {
				return nil, err
			}
		}
		return run, nil
	}
	var job *domain.Job
	err := persist(ctx, x.logger.With("job_id", t.JobID), "read job", func() (err error) {
		job, err = x.cmds.Job(ctx, t.JobID)
		return err
	})
	if err != nil {
		return nil, err
	}
	if job.State().Terminal() {
		return nil, commands.ErrNotClaimable
	}
	if t.Index >= len(job.Positions()) {
		return nil, fmt.Errorf("job %s has no position %d", t.JobID, t.Index)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if run = x.jobs[t.JobID]; run == nil {
		run = &jobRun{job: job, started: make(chan struct{})}
		x.jobs[t.JobID] = run
		go x.start(ctx, run, t.TookOver)
	}
	return run, nil
}

// start starts run's job (or resumes it, after a takeover) and reads its key, then
// closes run.started. A job that cannot start (it ended, its key stopped it, or its
// start kept failing)
// has its searches stopped: nothing of it is recorded or charged here, and positions
// of a job that did not end are taken again once their leases run out.
func (x *Executor) start(ctx context.Context, run *jobRun, tookOver bool) {
	jobID := run.job.ID()
	log := x.logger.With("job_id", jobID)
	run.startErr = persist(ctx, log, "start job", func() (err error) {
		_, run.key, err = x.cmds.StartJob(ctx, jobID, x.cfg.Worker, tookOver)
		return err
	})
	close(run.started)
	if run.startErr != nil {
		if !errors.Is(run.startErr, commands.ErrNotClaimable) && ctx.Err() == nil {
			log.Warn("start job", "err", run.startErr) // its positions are taken again once their leases run out
		}
		x.dropJob(jobID)
	}
}

// search runs positions from ready on the engines until ready is closed.
func (x *Executor) search(ctx context.Context, ready <-chan *task, toRecord chan<- *task) {
	for t := range ready {
		if !x.begin(t) {
			continue // given back while it waited (shed)
		}
		start := time.Now()
		res, err := x.position(t)
		took := time.Since(start)
		x.stats.add(took)
		analysed := err == nil && t.ctx.Err() == nil
		x.mu.Lock()
		x.pending--
		if !analysed {
			t.job.searching-- // else the recorder counts it as it is handed over (record)
		}
		x.mu.Unlock()
		if analysed {
			// a search cut short (a cancelled job's, a lost lease's) says nothing of the
			// pace: a cancel of many deep positions would otherwise make the next take
			// hold Ahead of them
			x.stats.learn(took)
			x.shed(ctx)
		}
		x.nudge()
		switch {
		case analysed:
			t.result = res
			toRecord <- t
		case t.ctx.Err() != nil:
			x.done(t) // lost, cancelled, or shutting down: never recorded
		default:
			x.fail(t, err)
			x.done(t)
		}
	}
}

// begin takes t out of the waiting ones as a searcher starts it, unless it was given
// back while it waited (false).
func (x *Executor) begin(t *task) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	if t.shed {
		return false
	}
	x.waiting = slices.DeleteFunc(x.waiting, func(w *task) bool { return w == t })
	return true
}

// shed gives back to the queue what waits here beyond twice what the engines now
// search in Horizon, down to that: a take sized by the pace of fast searches (a
// shallow job) may hold many positions of a deep job, which other workers and other
// accounts' jobs would wait for until this worker's engines got through them. The
// pace learns of the deep searches at the first (a moving average over ~8 moves an
// eighth of the way), so the positions last taken go back after it. Searching ones
// stay.
func (x *Executor) shed(ctx context.Context) {
	ahead := x.ahead()
	x.mu.Lock()
	if len(x.waiting) <= 2*ahead {
		x.mu.Unlock()
		return
	}
	drop := slices.Clone(x.waiting[ahead:])
	x.waiting = x.waiting[:ahead]
	slots := make([]commands.Slot, 0, len(drop))
	for _, t := range drop {
		t.shed = true
		x.pending--
		t.job.searching--
		slots = append(slots, t.slot)
		if x.held[t.slot] == t {
			delete(x.held, t.slot)
			if t.job.tasks--; t.job.tasks == 0 {
				delete(x.jobs, t.slot.JobID)
			}
		}
	}
	x.mu.Unlock()
	for _, t := range drop {
		t.cancel()
	}
	// a failure leaves them to their leases: another worker takes them once they run out
	if err := x.cmds.ReleasePositions(ctx, x.cfg.Worker, slots); err != nil && ctx.Err() == nil {
		x.logger.Warn("give back positions taken ahead", "positions", len(slots), "err", err)
	}
}

// record writes and charges analysed positions until analysed is closed, one
// transaction per job: a job's positions wait up to RecordEvery (from the first of the
// round) for more of the same job, and are recorded at once when none of the job's
// positions is still searching here. A job never waits for another job's positions.
func (x *Executor) record(ctx context.Context, analysed <-chan *task) {
	wait := time.NewTimer(x.cfg.RecordEvery)
	wait.Stop()
	batch := map[string][]*task{}
	for {
		x.recordFinished(ctx, batch)
		var t *task
		var ok bool
		if len(batch) == 0 {
			if t, ok = <-analysed; !ok {
				return
			}
			wait.Reset(x.cfg.RecordEvery)
		} else {
			select {
			case t, ok = <-analysed:
				if !ok {
					x.recordAll(ctx, batch)
					return
				}
			case <-wait.C:
				x.recordAll(ctx, batch)
				continue
			case <-ctx.Done():
				x.recordAll(ctx, batch) // never recorded: see recordJob
				continue
			}
		}
		x.mu.Lock()
		t.job.searching-- // in this batch now: a record of its job includes it
		x.mu.Unlock()
		batch[t.slot.JobID] = append(batch[t.slot.JobID], t)
	}
}

// recordFinished records the jobs of batch that have no position still searching here
// and takes them out of it.
func (x *Executor) recordFinished(ctx context.Context, batch map[string][]*task) {
	var finished []string
	x.mu.Lock()
	for jobID, ts := range batch {
		if ts[0].job.searching == 0 {
			finished = append(finished, jobID)
		}
	}
	x.mu.Unlock()
	for _, jobID := range finished {
		x.recordJob(ctx, jobID, batch[jobID])
		delete(batch, jobID)
	}
}

// recordAll records every job of batch and empties it.
func (x *Executor) recordAll(ctx context.Context, batch map[string][]*task) {
	for jobID, ts := range batch {
		x.recordJob(ctx, jobID, ts)
	}
	clear(batch)
}

func (x *Executor) recordJob(ctx context.Context, jobID string, ts []*task) {
	defer func() {
		for _, t := range ts {
			x.done(t)
		}
	}()
	if ctx.Err() != nil {
		return // shutting down: what is left is never recorded nor charged (another worker redoes it)
	}
	run := ts[0].job
	if run.ready(ctx) != nil {
		return // it did not start: start stopped its searches
	}
	ps := make([]commands.Position, 0, len(ts))
	for _, t := range ts {
		ps = append(ps, t.result)
	}
	log := x.logger.With("job_id", jobID)
	// A retry after a commit of unknown outcome skips what that commit recorded.
	err := persist(ctx, log, "record positions", func() error {
		_, err := x.cmds.RecordPositions(ctx, run.key, jobID, x.cfg.Worker, ps)
		return err
	})
	switch {
	case errors.Is(err, commands.ErrNotClaimable):
		x.dropJob(jobID) // it ended (cancelled, failed elsewhere): stop its other searches
	case err != nil && ctx.Err() == nil:
		// not a passing failure (persist retried those): recording again would fail
		// again, so the job fails rather than being redone for ever
		x.fail(ts[0], err)
	}
}

// done forgets a held position.
func (x *Executor) done(t *task) {
	t.cancel()
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.held[t.slot] != t {
		return
	}
	delete(x.held, t.slot)
	if t.job.tasks--; t.job.tasks == 0 {
		delete(x.jobs, t.slot.JobID)
	}
}

// dropJob stops every search of a job that ended.
func (x *Executor) dropJob(jobID string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for s, t := range x.held {
		if s.JobID == jobID {
			t.cancel()
		}
	}
}

// renew says the worker is alive and extends the leases of held positions three times
// per lease, and stops the searches of the ones this worker no longer holds: at once
// when a job ends (cancelled or failed: closed announces it), else at the next renewal
// (taken over after a pause longer than the lease). Renewing more often cost the
// database a query per worker every 200 ms, taken from the engines beside it.
func (x *Executor) renew(ctx context.Context, closed <-chan struct{}) {
	tick := time.NewTicker(max(x.cfg.Lease/3, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			x.alive(ctx)
		case <-closed:
		}
		x.mu.Lock()
		slots := make([]commands.Slot, 0, len(x.held))
		for s := range x.held {
			slots = append(slots, s)
		}
		x.mu.Unlock()
		if len(slots) == 0 {
			continue
		}
		lost, err := x.cmds.RenewPositions(ctx, x.cfg.Worker, slots, x.cfg.Lease)
		if err != nil {
			if ctx.Err() == nil {
				x.logger.Warn("renew positions", "err", err)
			}
			continue
		}
		x.mu.Lock()
		for _, s := range lost {
			if t := x.held[s]; t != nil {
				t.cancel()
			}
		}
		x.mu.Unlock()
	}
}

// giveBack frees what this worker still holds on the queue as it stops, so another
// worker takes it at once instead of after the lease, and leaves the workers alive.
func (x *Executor) giveBack() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := x.cmds.StopWorker(ctx, x.cfg.Worker); err != nil {
		x.logger.Warn("give back positions", "err", err)
	}
}

// alive says this worker is alive for a lease, so that other workers' takes leave it
// its share (commands.TakePositions); renew says it again three times a lease.
func (x *Executor) alive(ctx context.Context) {
	if err := x.cmds.WorkerAlive(ctx, x.cfg.Worker, x.cfg.Lease); err != nil && ctx.Err() == nil {
		x.logger.Warn("say worker alive", "err", err)
	}
}

// persist runs fn until it succeeds or fails for a reason of its own, retrying with a
// growing wait while it fails for one that passes (the database away or restarting, a
// conflict with another writer), until ctx ends: a job never fails because its
// database was briefly out of reach.
func persist(ctx context.Context, log *slog.Logger, what string, fn func() error) error {
	wait := 100 * time.Millisecond
	for {
		err := fn()
		if err == nil || !transient(err) {
			return err
		}
		log.Warn(what+" failed for a passing reason; retrying", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// transient reports errors that say nothing about the job: the database away, a commit
// whose connection failed, a serialization conflict.
func transient(err error) bool {
	var unsure *eventstore.UncertainCommitError
	return postgres.IsTransient(err) || errors.Is(err, eventstore.ErrNotCommitted) || errors.As(err, &unsure)
}

// position analyses one position and prices it.
func (x *Executor) position(t *task) (commands.Position, error) {
	job, spec := t.job.job, t.job.job.Spec()
	res, err := x.analyse(t.ctx, spec, t.pos)
	if err != nil {
		return commands.Position{}, err
	}
	price, err := ledger.Quote(domain.Call{Endpoint: domain.Endpoint(job.Kind()), Depth: spec.Depth, MultiPV: spec.MultiPV, Positions: 1})
	if err != nil {
		return commands.Position{}, err
	}
	units := price.Charged(res.Cached || res.Terminal != "")
	body, err := json.Marshal(res)
	if err != nil {
		return commands.Position{}, err
	}
	return commands.Position{
		Index: t.pos.Index, Result: body, Cached: res.Cached || res.Terminal != "", Units: units, USD: ledger.UnitsUSD(units),
		Engine: res.Engine, Path: res.Path,
		Params: ledger.Params{Depth: spec.Depth, MultiPV: spec.MultiPV, Positions: 1, FEN: t.pos.FEN, JobID: job.ID()},
	}, nil
}

// analyse runs one position, retrying while the engines are saturated, restarting, or
// the search was preempted by an interactive call. The position was accepted when the
// job was submitted, perhaps by an earlier release: it is read as stored
// (analysis.Spec.Stored), so that counters the rules refuse since then do not fail it.
func (x *Executor) analyse(ctx context.Context, spec domain.JobSpec, p domain.JobPosition) (*analysis.Result, error) {
	s := analysis.Spec{FEN: p.FEN, Depth: spec.Depth, MultiPV: spec.MultiPV, Engine: spec.Engine,
		Path: engine.Path(spec.Path), Chess960: spec.Chess960, UCIOptions: map[string]string{}, Stored: true}
	if spec.Chess960 {
		s.UCIOptions["UCI_Chess960"] = "true"
	}
	for failures := 0; ; {
		res, err := x.analysis.Analyse(ctx, s, engine.Batch, true)
		if err == nil {
			return res, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		wait, retry := retryAfter(err, failures)
		if !retry {
			return nil, err
		}
		if !errors.Is(err, engine.ErrPreempted) && !errors.Is(err, engine.ErrSaturated) {
			failures++
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// maxEngineFailures is how many times a position's search may fail for its engine
// (a process that died mid-search) before the job fails.
const maxEngineFailures = 30

// retryAfter says whether a position's search that failed with err, after failures
// failed searches before it, is tried again, and after how long. Interactive calls
// taking or keeping the engines (ErrPreempted, ErrSaturated) are not the position's
// fault: it waits for them as long as they last, the job's leases renewed meanwhile
// (jobs keep progressing under single calls, and a steady stream of them no longer
// fails a job after about 30 queue waits). An engine that fails the search is tried
// again, waiting longer each time, maxEngineFailures times.
func retryAfter(err error, failures int) (time.Duration, bool) {
	switch {
	case errors.Is(err, engine.ErrPreempted):
		return 0, true
	case errors.Is(err, engine.ErrSaturated):
		return 200 * time.Millisecond, true
	case domain.ErrorCode(err) != domain.CodeUnavailable, failures+1 >= maxEngineFailures:
		return 0, false
	}
	return time.Duration(failures+1) * 100 * time.Millisecond, true
}

// fail ends a job whose position cannot be analysed.
func (x *Executor) fail(t *task, cause error) {
	log := x.logger.With("job_id", t.slot.JobID)
	if t.job.ready(t.ctx) != nil {
		return // it did not start, or the position is dropped: not this worker's to fail
	}
	var de *domain.Error
	if !errors.As(cause, &de) {
		log.Error("job failed", "err", cause)
		de = domain.Errorf(domain.CodeInternal, "the job failed unexpectedly")
	}
	err := persist(t.ctx, log, "record job failure", func() error {
		_, err := x.cmds.FailJob(context.WithoutCancel(t.ctx), t.slot.JobID, x.cfg.Worker, de)
		return err
	})
	if err != nil && !errors.Is(err, commands.ErrNotClaimable) {
		log.Error("record job failure", "err", err)
	}
	x.dropJob(t.slot.JobID)
}

// Stats says how the engines of this executor spent their time (a benchmark compares
// Searching with the time a job took to see how long engines waited for work) and how
// often it looked at the queue.
type Stats struct {
	Positions  int64         // positions searched (analysed, failed or dropped)
	Searching  time.Duration // in analysis (acquiring a process, the search, conversion)
	Takes      int64         // queries of the queue (commands.TakePositions) that answered
	EmptyTakes int64         // of them, those that found nothing to take
}

// Stats returns the counts so far.
func (x *Executor) Stats() Stats { return x.stats.snapshot() }

type stats struct {
	positions  atomic.Int64
	searching  atomic.Int64 // ns
	recent     atomic.Int64 // ns a search, a moving average over the last ~8
	takes      atomic.Int64
	emptyTakes atomic.Int64
}

// took counts a take that answered with n positions.
func (s *stats) took(n int) {
	s.takes.Add(1)
	if n == 0 {
		s.emptyTakes.Add(1)
	}
}

// add counts one position that spent searched in analysis.
func (s *stats) add(searched time.Duration) {
	s.positions.Add(1)
	s.searching.Add(int64(searched))
}

// learn takes a completed search's time into the pace.
func (s *stats) learn(searched time.Duration) {
	for { // several searchers learn at once
		old := s.recent.Load()
		next := int64(searched)
		if old > 0 {
			next = old + (int64(searched)-old)/8
		}
		if s.recent.CompareAndSwap(old, next) {
			return
		}
	}
}

// pace is the recent time a completed search takes; 0 before the first.
func (s *stats) pace() time.Duration { return time.Duration(s.recent.Load()) }

func (s *stats) snapshot() Stats {
	return Stats{Positions: s.positions.Load(), Searching: time.Duration(s.searching.Load()),
		Takes: s.takes.Load(), EmptyTakes: s.emptyTakes.Load()}
}
