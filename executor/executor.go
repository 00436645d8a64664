// Package executor runs analysis jobs: it takes SubmitJob commands from the Watermill
// command bus, claims each job (one worker per job, guarded by the job's event stream
// and a lease), analyses its positions on the engine pools at batch priority, records
// and charges each position exactly once, and finishes the job. It runs inside
// `chessd serve` and alone as `chessd worker`; several workers share one database.
package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
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
	Worker  string        // this worker's name; default host:pid
	MaxJobs int           // jobs run at once; default 2
	Lease   time.Duration // how long a claim lasts without renewal; default 10 s
	// Scan is how often queued jobs nobody took and jobs whose worker stopped are
	// looked for; default 1 s.
	Scan time.Duration
	// Parallel is how many positions of one job run at once; default 2 (set it to the
	// engine pool's size).
	Parallel int
}

// Executor runs jobs.
type Executor struct {
	cfg      Config
	pool     *pgxpool.Pool
	cmds     *commands.Handler
	analysis *analysis.Service
	logger   *slog.Logger

	mu      sync.Mutex
	running map[string]bool
	wg      sync.WaitGroup
}

// New builds an Executor.
func New(cfg Config, pool *pgxpool.Pool, cmds *commands.Handler, svc *analysis.Service, logger *slog.Logger) *Executor {
	if cfg.Worker == "" {
		host, _ := os.Hostname()
		cfg.Worker = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	if cfg.MaxJobs <= 0 {
		cfg.MaxJobs = 2
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
	return &Executor{cfg: cfg, pool: pool, cmds: cmds, analysis: svc, logger: logger.With("worker", cfg.Worker), running: map[string]bool{}}
}

// Running lists the jobs this executor is working on: a job leaves the list once its
// run has ended, with everything it recorded committed.
func (x *Executor) Running() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	ids := make([]string, 0, len(x.running))
	for id := range x.running {
		ids = append(ids, id)
	}
	return ids
}

// Run consumes the command bus and scans for orphaned jobs until ctx ends, then waits
// for the jobs it runs to stop (they resume elsewhere or after a restart).
func (x *Executor) Run(ctx context.Context) error {
	wlog := watermill.NewSlogLoggerWithLevelMapping(x.logger, map[slog.Level]slog.Level{slog.LevelInfo: slog.LevelDebug})
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, wlog)
	if err != nil {
		return err
	}
	ack := 5 * time.Second
	listenCtx, stopListening := context.WithCancel(ctx)
	defer stopListening()
	wake := eventstore.Listen(listenCtx, x.pool, x.logger)
	sub, err := wmsql.NewSubscriber(projections.NewBusBeginner(x.pool), wmsql.SubscriberConfig{
		ConsumerGroup:  ConsumerGroup,
		SchemaAdapter:  wmsql.DefaultPostgreSQLSchema{SubscribeBatchSize: 1, GeneratePayloadType: eventstore.BusSchema.GeneratePayloadType},
		OffsetsAdapter: wmsql.DefaultPostgreSQLOffsetsAdapter{},
		BackoffManager: wake.Backoff(commands.TopicJobCommands,
			eventstore.Waiting{Idle: time.Second, Poll: 50 * time.Millisecond, Retry: time.Second}),
		ResendInterval: 100 * time.Millisecond,
		AckDeadline:    &ack,
	}, wlog)
	if err != nil {
		return err
	}
	router.AddConsumerHandler("SubmitJob", commands.TopicJobCommands, sub, func(msg *message.Message) error {
		var cmd commands.SubmitJobCommand
		if err := json.Unmarshal(msg.Payload, &cmd); err != nil {
			x.logger.Error("bad SubmitJob command", "err", err)
			return nil // a command that cannot be read is dropped, not retried forever
		}
		x.try(ctx, cmd.JobID)
		return nil
	})
	go x.scan(ctx)
	err = router.Run(ctx)
	x.wg.Wait()
	return err
}

// try claims and starts a job when this worker has room. A job it cannot take now
// stays queued and is found by a scan (here or on another worker).
func (x *Executor) try(ctx context.Context, jobID string) {
	x.mu.Lock()
	if x.running[jobID] || len(x.running) >= x.cfg.MaxJobs || ctx.Err() != nil {
		x.mu.Unlock()
		return
	}
	x.running[jobID] = true
	x.mu.Unlock()
	job, err := x.cmds.ClaimJob(ctx, jobID, x.cfg.Worker, x.cfg.Lease)
	if err != nil {
		x.mu.Lock()
		delete(x.running, jobID)
		x.mu.Unlock()
		if !errors.Is(err, commands.ErrNotClaimable) && ctx.Err() == nil {
			x.logger.Warn("claim job", "job_id", jobID, "err", err)
		}
		return
	}
	x.wg.Add(1)
	go func() {
		defer x.wg.Done()
		defer func() {
			x.mu.Lock()
			delete(x.running, jobID)
			x.mu.Unlock()
		}()
		x.run(ctx, job)
	}()
}

// scan finds jobs queued for a while that no worker took, and running jobs whose
// worker stopped renewing its lease (killed, or partitioned away).
func (x *Executor) scan(ctx context.Context) {
	t := time.NewTicker(x.cfg.Scan)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rows, err := x.pool.Query(ctx, `
			SELECT job_id FROM jobs WHERE state = 'queued' AND created_at < now() - interval '1 second'
			UNION
			SELECT job_id FROM job_leases WHERE lease_until < now()
			LIMIT 20`)
		if err != nil {
			if ctx.Err() == nil {
				x.logger.Warn("scan for jobs", "err", err)
			}
			continue
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			continue
		}
		for _, id := range ids {
			x.try(ctx, id)
		}
	}
}

// run analyses a job's remaining positions in order, then finishes it.
func (x *Executor) run(ctx context.Context, job *domain.Job) {
	log := x.logger.With("job_id", job.ID())
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go x.watch(ctx, cancel, job.ID())

	var key *domain.Key
	var acct *domain.Account
	err := persist(ctx, log, "load job's key and account", func() (err error) {
		if key, err = commands.LoadKey(ctx, x.pool, job.KeyID()); err != nil {
			return err
		}
		acct, err = commands.LoadAccount(ctx, x.pool, key.AccountID())
		return err
	})
	if err != nil {
		if ctx.Err() == nil {
			log.Error("load job key and account", "err", err)
		}
		return // the lease runs out and the job is resumed
	}
	spec := job.Spec()
	// Positions run Parallel at a time (the pool's size, by default): a job alone uses
	// every engine process, while single evals, at interactive priority, still go
	// first whenever a process frees up. An analysed position goes to the recorder and
	// its engine goes on with the next one at once; the recorder writes whatever
	// finished meanwhile in one transaction (positions are recorded as they finish; the
	// result lists them in input order).
	todo := make(chan domain.JobPosition)
	analysed := make(chan commands.Position, x.cfg.Parallel)
	var failOnce sync.Once
	failJob := func(err error) {
		failOnce.Do(func() {
			if ctx.Err() == nil {
				x.fail(ctx, job.ID(), err, log)
			}
			cancel()
		})
	}
	stop := func(err error) {
		switch {
		case ctx.Err() != nil, errors.Is(err, commands.ErrNotClaimable):
			cancel() // cancelled, lost the lease, or shutting down
		default:
			failJob(err)
		}
	}
	recorded := make(chan struct{})
	go func() {
		defer close(recorded)
		x.record(ctx, key, acct, job, analysed, stop)
	}()
	var wg sync.WaitGroup
	for range x.cfg.Parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range todo {
				pos, err := x.position(ctx, acct, job, spec, p)
				if err != nil {
					stop(err)
					continue
				}
				select {
				case analysed <- pos:
				case <-ctx.Done():
				}
			}
		}()
	}
feed:
	for _, p := range job.Positions() {
		if job.Result(p.Index) != nil {
			continue // analysed before a restart: never again
		}
		select {
		case todo <- p:
		case <-ctx.Done():
			break feed
		}
	}
	close(todo)
	wg.Wait()
	close(analysed)
	<-recorded
	if ctx.Err() != nil {
		return
	}
	err = persist(ctx, log, "finish job", func() error {
		_, err := x.cmds.FinishJob(context.WithoutCancel(ctx), job.ID(), x.cfg.Worker, nil)
		return err
	})
	if err != nil && !errors.Is(err, commands.ErrNotClaimable) {
		log.Error("finish job", "err", err) // the lease runs out and the job is resumed
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

// maxRecord bounds the positions one record transaction takes.
const maxRecord = 50

// record writes and charges analysed positions until analysed is closed: each
// transaction takes every position that is waiting. After a failure it only drains.
func (x *Executor) record(ctx context.Context, key *domain.Key, acct *domain.Account, job *domain.Job, analysed <-chan commands.Position, stop func(error)) {
	for first := range analysed {
		if ctx.Err() != nil {
			continue // stopped: what is left is never recorded nor charged
		}
		batch := []commands.Position{first}
	more:
		for len(batch) < maxRecord {
			select {
			case p, ok := <-analysed:
				if !ok {
					break more
				}
				batch = append(batch, p)
			default:
				break more
			}
		}
		// A retry after a commit of unknown outcome skips what that commit recorded.
		err := persist(ctx, x.logger.With("job_id", job.ID()), "record positions", func() error {
			_, err := x.cmds.RecordPositions(ctx, key, job.ID(), x.cfg.Worker, batch, x.cfg.Lease)
			return err
		})
		if err != nil {
			stop(err)
		}
	}
}

// position analyses one position and prices it.
func (x *Executor) position(ctx context.Context, acct *domain.Account, job *domain.Job, spec domain.JobSpec, p domain.JobPosition) (commands.Position, error) {
	res, err := x.analyse(ctx, spec, p)
	if err != nil {
		return commands.Position{}, err
	}
	price, err := ledger.Quote(domain.Call{Endpoint: domain.Endpoint(job.Kind()), Depth: spec.Depth, MultiPV: spec.MultiPV, Positions: 1})
	if err != nil {
		return commands.Position{}, err
	}
	units := price.PerPosition
	if res.Cached || res.Terminal != "" {
		units = price.CachedUnits
	}
	body, err := json.Marshal(res)
	if err != nil {
		return commands.Position{}, err
	}
	return commands.Position{
		Index: p.Index, Result: body, Cached: res.Cached || res.Terminal != "", Units: units, USD: ledger.UnitsUSD(units),
		Engine: res.Engine, Path: res.Path,
		Params: ledger.Params{Depth: spec.Depth, MultiPV: spec.MultiPV, Positions: 1, FEN: p.FEN, JobID: job.ID()},
	}, nil
}

// analyse runs one position, retrying while the engines are saturated or restarting.
func (x *Executor) analyse(ctx context.Context, spec domain.JobSpec, p domain.JobPosition) (*analysis.Result, error) {
	s := analysis.Spec{FEN: p.FEN, Depth: spec.Depth, MultiPV: spec.MultiPV, Engine: spec.Engine,
		Path: engine.Path(spec.Path), Chess960: spec.Chess960, UCIOptions: map[string]string{}}
	if spec.Chess960 {
		s.UCIOptions["UCI_Chess960"] = "true"
	}
	var err error
	for attempt := 0; attempt < 30; attempt++ {
		var res *analysis.Result
		res, err = x.analysis.Analyse(ctx, s, engine.Batch, true)
		if err == nil {
			return res, nil
		}
		if domain.ErrorCode(err) != domain.CodeUnavailable || ctx.Err() != nil {
			return nil, err
		}
		select { // saturated by interactive traffic, or an engine died: wait and retry
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 100 * time.Millisecond):
		}
	}
	return nil, err
}

func (x *Executor) fail(ctx context.Context, jobID string, cause error, log *slog.Logger) {
	var de *domain.Error
	if !errors.As(cause, &de) {
		log.Error("job failed", "err", cause)
		de = domain.Errorf(domain.CodeInternal, "the job failed unexpectedly")
	}
	err := persist(ctx, log, "record job failure", func() error {
		_, err := x.cmds.FinishJob(context.WithoutCancel(ctx), jobID, x.cfg.Worker, de)
		return err
	})
	if err != nil && !errors.Is(err, commands.ErrNotClaimable) {
		log.Error("record job failure", "err", err)
	}
}

// watch renews the lease and cancels the job's work within a fraction of a second when
// the job is cancelled or another worker took it over.
func (x *Executor) watch(ctx context.Context, cancel context.CancelFunc, jobID string) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	lastRenew := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var state string
		var worker *string
		err := x.pool.QueryRow(ctx, `SELECT
				(SELECT event_type FROM events WHERE stream_id = $1 ORDER BY version DESC LIMIT 1),
				(SELECT worker FROM job_leases WHERE job_id = $2)`, "job-"+jobID, jobID).Scan(&state, &worker)
		if err != nil {
			continue
		}
		if state == "JobCancelled" || worker == nil || *worker != x.cfg.Worker {
			cancel()
			return
		}
		if time.Since(lastRenew) > x.cfg.Lease/3 {
			if err := x.cmds.RenewLease(ctx, jobID, x.cfg.Worker, x.cfg.Lease); errors.Is(err, commands.ErrNotClaimable) {
				cancel()
				return
			}
			lastRenew = time.Now()
		}
	}
}
