package commands

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/postgres"
)

// The job queue (table job_queue, migration 0015) holds every position of a queued or
// running job that is not yet recorded. Workers take positions, a few at a time, each
// under a lease of its own: a job's positions spread over every worker with a free
// engine, and a worker that dies loses only the leases of the positions it held, which
// any worker takes up once they run out.

// ErrNotClaimable says a job has ended (or a position was taken over): the worker
// drops what it holds of it.
var ErrNotClaimable = errors.New("job not claimable")

// Slot names one position of one job on the queue.
type Slot struct {
	JobID string
	Index int
}

// Taken is a position a worker took; TookOver says its lease had run out on another
// worker.
type Taken struct {
	Slot
	TookOver bool
}

// enqueue puts a new job's positions on the queue, inside its submission.
func enqueue(ctx context.Context, tx *eventstore.Tx, s *domain.JobSubmitted) error {
	_, err := tx.Exec(ctx, `INSERT INTO job_queue (job_id, idx, account_id, submitted_at)
		SELECT $1, i, $2, $3 FROM generate_series(0, $4::int - 1) AS i`, s.JobID, s.AccountID, s.SubmittedAt, len(s.Positions))
	if err != nil {
		return fmt.Errorf("enqueue job %s: %w", s.JobID, err)
	}
	return nil
}

// release takes recorded positions off the queue where worker still holds them (a
// lease may have run out, as long as nobody took the position since) and returns the
// indexes it took off.
func release(ctx context.Context, tx *eventstore.Tx, jobID string, indexes []int32, worker string) (map[int]bool, error) {
	rows, err := tx.Query(ctx, `DELETE FROM job_queue WHERE job_id = $1 AND idx = ANY ($2) AND worker = $3 RETURNING idx`,
		jobID, indexes, worker)
	if err != nil {
		return nil, fmt.Errorf("release positions of job %s: %w", jobID, err)
	}
	held := map[int]bool{}
	var idx int32
	_, err = pgx.ForEachRow(rows, []any{&idx}, func() error {
		held[int(idx)] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("release positions of job %s: %w", jobID, err)
	}
	return held, nil
}

// loadLockedJob loads a job inside tx after taking its transaction-scoped lock: the
// transactions that change one job's stream (recorders on several workers, a cancel,
// a start, a failure) take turns instead of failing on each other's versions. A job
// this process recorded last is taken from memory and brought up to date with the
// events appended since (by other workers), so recording a position reads a few
// events, not the job's whole stream.
func (h *Handler) loadLockedJob(ctx context.Context, tx *eventstore.Tx, jobID string) (*domain.Job, error) {
	if err := postgres.LockXact(ctx, tx, domain.JobStream(jobID), false); err != nil {
		return nil, err
	}
	j := h.jobs.take(jobID)
	if j == nil {
		return LoadJob(ctx, tx, jobID)
	}
	evs, err := loadStreamAfter(ctx, tx, domain.JobStream(jobID), j.Version())
	if err != nil {
		return nil, err
	}
	for _, e := range evs {
		j.Apply(e)
	}
	return j, nil
}

// jobCache keeps, per job, the aggregate as this process last committed it. An entry
// has one user at a time: take removes it, and only a committed transaction puts its
// own copy back (keep), so a transaction that rolled back leaves nothing ahead of the
// stream. Any later events (another worker's) are read under the job's lock.
type jobCache struct {
	mu   sync.Mutex
	jobs map[string]*domain.Job
}

// maxCachedJobs bounds the jobs kept (each holds its results so far); past it, all are
// forgotten and loaded again. A job leaves when it ends here; one that ended on another
// worker stays until then.
const maxCachedJobs = 1_000

func (c *jobCache) take(jobID string) *domain.Job {
	c.mu.Lock()
	defer c.mu.Unlock()
	j := c.jobs[jobID]
	delete(c.jobs, jobID)
	return j
}

// peek returns a copy of jobID's entry, or nil, leaving the entry in place.
func (c *jobCache) peek(jobID string) *domain.Job {
	c.mu.Lock()
	defer c.mu.Unlock()
	if j := c.jobs[jobID]; j != nil {
		return j.Clone()
	}
	return nil
}

// keep stores j, which nobody else may hold, as committed; an ended job is forgotten.
func (c *jobCache) keep(j *domain.Job) {
	if j.State().Terminal() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.jobs) >= maxCachedJobs {
		clear(c.jobs)
	}
	c.jobs[j.ID()] = j
}

// TakePositions gives worker up to n positions (n rounded down to a power of two),
// each leased for lease: free ones and ones whose lease ran out. The order is fair
// between accounts: each account's positions are numbered in its own order (oldest
// job first, input order within a job) after the positions it already has in flight,
// and the lowest numbers go first, so one account's batches cannot hold every engine
// while another account waits. Rows another worker is taking at this instant are
// skipped, not waited for.
//
// Beyond need (what this worker's idle engines want now), a take is at most this
// worker's share of the free positions: those it saw (up to 2n an account, below)
// divided by the workers alive (WorkerAlive) or holding positions, itself included. As
// a queue drains, takes shrink, and its last positions spread over every worker instead
// of waiting in the hands of one while the others have nothing left; a small job
// spreads over the idle workers instead of going whole to the first that takes.
//
// Only the first few free positions of each account can be among the n lowest (an
// account's own are taken in its order), so the query numbers those alone: it walks
// the accounts with queued positions in the index of migration 0034 (one probe per
// account) and reads each one's first 2n free positions (twice n: some may be in
// another worker's hands this instant), whatever the length of the queue.
func (h *Handler) TakePositions(ctx context.Context, worker string, n, need int, lease time.Duration) ([]Taken, error) {
	// Everything is written into the statement, nothing passed: a statement without
	// parameters is planned once on each connection and its plan kept (PostgreSQL has
	// no custom plan to weigh against it), while one with parameters is planned afresh
	// at each of its first five runs on a connection, and a take's plan costs more than
	// the take (0.37 ms against 0.22 on an idle machine). With the worker and the lease
	// passed, 17 of a two-worker job's 21 takes were planned (pg_stat_statements with
	// track_planning, docs/BENCHMARKS.md, session 32): each size of take on each of the
	// pool's connections is a statement of its own, and they never got past five runs.
	// n is rounded down to a power of two, so that a worker whose takes vary in size
	// uses a few statements, not one per size.
	if n < 1 {
		return nil, nil
	}
	n = 1 << (bits.Len(uint(n)) - 1)
	need = min(need, n)
	rows, err := h.store.Pool().Query(ctx, fmt.Sprintf(`
		WITH RECURSIVE accounts AS (
			(SELECT account_id FROM job_queue ORDER BY account_id LIMIT 1)
			UNION ALL
			SELECT (SELECT q.account_id FROM job_queue q WHERE q.account_id > a.account_id ORDER BY q.account_id LIMIT 1)
			  FROM accounts a WHERE a.account_id IS NOT NULL
		), busy AS (
			SELECT account_id, count(*) AS n FROM job_queue
			 WHERE worker IS NOT NULL AND lease_until >= now() GROUP BY account_id
		), free AS (
			SELECT f.job_id, f.idx, f.submitted_at,
			       coalesce(b.n, 0) + row_number() OVER (PARTITION BY a.account_id ORDER BY f.submitted_at, f.job_id, f.idx) AS turn
			  FROM accounts a
			 CROSS JOIN LATERAL (
			       SELECT q.job_id, q.idx, q.submitted_at FROM job_queue q
			        WHERE q.account_id = a.account_id AND (q.worker IS NULL OR q.lease_until < now())
			        ORDER BY q.submitted_at, q.job_id, q.idx
			        LIMIT %[2]d) f
			  LEFT JOIN busy b ON b.account_id = a.account_id
			 WHERE a.account_id IS NOT NULL
		), others AS (
			SELECT count(*) AS n FROM (
			       SELECT worker FROM job_queue WHERE worker IS NOT NULL AND worker <> %[4]s AND lease_until >= now()
			       UNION
			       SELECT worker FROM job_workers WHERE worker <> %[4]s AND alive_until >= now()) w
		), async AS (
			-- a lease is neither money nor a record: this commit need not wait for the
			-- WAL's flush. A crash that lost it frees the positions again: the worker's
			-- record (whose commit does wait, and so flushes this one first) releases
			-- only rows still its own, so they are searched again and charged once, by
			-- whoever records them. A job's first searches wait for its first take:
			-- from the POST's answer to the first search took 4.4-7.0 ms with the
			-- fsync, 2.5-5.0 without.
			SELECT set_config('synchronous_commit', 'off', true)
		), pick AS (
			-- the candidates in turn, each locked as it comes (a nested loop keeps the
			-- sorted order), until n are taken: a join would read the whole queue
			SELECT q.job_id, q.idx, q.prior
			  FROM (SELECT job_id, idx FROM free ORDER BY turn, submitted_at, job_id, idx) f
			 CROSS JOIN LATERAL (
			       SELECT q.job_id, q.idx, q.worker AS prior FROM job_queue q
			        WHERE q.job_id = f.job_id AND q.idx = f.idx AND (q.worker IS NULL OR q.lease_until < now())
			          FOR UPDATE SKIP LOCKED) q
			 LIMIT least(%[1]d, greatest(%[3]d, (SELECT ceil(count(*)::numeric / (1 + (SELECT n FROM others))) FROM free)))
		)
		UPDATE job_queue q SET worker = %[4]s, lease_until = now() + interval '%[5]d microseconds'
		  FROM pick, async WHERE q.job_id = pick.job_id AND q.idx = pick.idx
		RETURNING q.job_id, q.idx, pick.prior IS NOT NULL AND pick.prior <> %[4]s`, n, 2*n, need, sqlString(worker), lease.Microseconds()))
	if err != nil {
		return nil, fmt.Errorf("take positions: %w", err)
	}
	taken, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Taken, error) {
		var t Taken
		err := r.Scan(&t.JobID, &t.Index, &t.TookOver)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("take positions: %w", err)
	}
	return taken, nil
}

// sqlString is s as an SQL string constant. It is dollar-quoted with a tag that s does
// not contain, so that nothing in s is read as anything but its characters, whatever
// the server's standard_conforming_strings.
func sqlString(s string) string {
	tag := "$w$"
	for i := 0; strings.Contains(s, tag) || strings.HasSuffix(s, tag[:len(tag)-1]); i++ {
		tag = "$w" + strconv.Itoa(i) + "$"
	}
	return tag + s + tag
}

// WorkerAlive says worker is alive for the next d: until then, every take counts it
// among the workers that share the queue, whether or not it holds positions. It also
// forgets the workers that died without stopping (a crash), a minute after their word
// ran out: a worker's name is new at each start.
func (h *Handler) WorkerAlive(ctx context.Context, worker string, d time.Duration) error {
	_, err := h.store.Pool().Exec(ctx, `WITH dead AS (DELETE FROM job_workers WHERE alive_until < now() - interval '1 minute' AND worker <> $1)
		INSERT INTO job_workers (worker, alive_until) VALUES ($1, now() + $2::interval)
		ON CONFLICT (worker) DO UPDATE SET alive_until = excluded.alive_until`, worker, d.String())
	if err != nil {
		return fmt.Errorf("worker %s alive: %w", worker, err)
	}
	return nil
}

// StopWorker frees every position worker holds and wakes the workers (as
// ReleasePositions does), so that another takes them at once instead of after their
// leases, and takes it out of the workers alive.
func (h *Handler) StopWorker(ctx context.Context, worker string) error {
	_, err := h.store.Pool().Exec(ctx, `
		WITH gone AS (DELETE FROM job_workers WHERE worker = $1),
		freed AS (UPDATE job_queue SET worker = NULL, lease_until = NULL WHERE worker = $1 RETURNING 1)
		SELECT pg_notify($2, $3) WHERE EXISTS (SELECT FROM freed)`, worker, eventstore.NotifyChannel, TopicJobCommands)
	if err != nil {
		return fmt.Errorf("stop worker %s: %w", worker, err)
	}
	return nil
}

// ReleasePositions puts back on the queue, for any worker to take, the positions of
// held that worker still holds, and wakes the workers (as a submission does).
func (h *Handler) ReleasePositions(ctx context.Context, worker string, held []Slot) error {
	jobs := make([]string, len(held))
	idx := make([]int32, len(held))
	for i, s := range held {
		jobs[i], idx[i] = s.JobID, int32(s.Index)
	}
	_, err := h.store.Pool().Exec(ctx, `
		WITH freed AS (
			UPDATE job_queue q SET worker = NULL, lease_until = NULL
			  FROM unnest($2::text[], $3::int[]) AS m(job_id, idx)
			 WHERE q.job_id = m.job_id AND q.idx = m.idx AND q.worker = $1
			RETURNING 1)
		SELECT pg_notify($4, $5) WHERE EXISTS (SELECT FROM freed)`,
		worker, jobs, idx, eventstore.NotifyChannel, TopicJobCommands)
	if err != nil {
		return fmt.Errorf("release positions: %w", err)
	}
	return nil
}

// RenewPositions extends worker's leases on held and returns the ones it no longer
// holds: their job ended (cancelled, failed) or, after a lease ran out, another worker
// took them. It waits for no lock: a position whose row a transaction holds (its
// record deleting it) is left for the next renewal, well within the lease, instead
// of deadlocking with that transaction, which may lock the rows in another order.
func (h *Handler) RenewPositions(ctx context.Context, worker string, held []Slot, lease time.Duration) ([]Slot, error) {
	jobs := make([]string, len(held))
	idx := make([]int32, len(held))
	for i, s := range held {
		jobs[i], idx[i] = s.JobID, int32(s.Index)
	}
	rows, err := h.store.Pool().Query(ctx, `
		WITH mine AS (SELECT * FROM unnest($2::text[], $3::int[]) AS m(job_id, idx)),
		free AS (
			SELECT q.job_id, q.idx FROM job_queue q JOIN mine USING (job_id, idx)
			 WHERE q.worker = $1 FOR UPDATE OF q SKIP LOCKED),
		renewed AS (
			UPDATE job_queue q SET lease_until = now() + $4::interval
			  FROM free WHERE q.job_id = free.job_id AND q.idx = free.idx)
		SELECT job_id, idx FROM mine m
		 WHERE NOT EXISTS (SELECT 1 FROM job_queue q WHERE q.job_id = m.job_id AND q.idx = m.idx AND q.worker = $1)`,
		worker, jobs, idx, lease.String())
	if err != nil {
		return nil, fmt.Errorf("renew positions: %w", err)
	}
	lost, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Slot, error) {
		var s Slot
		err := r.Scan(&s.JobID, &s.Index)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("renew positions: %w", err)
	}
	return lost, nil
}

// StartJob is what a worker does with a job the first time it takes one of its
// positions: a queued job starts (JobStarted, once, by whichever worker comes first),
// and a worker that took over positions of a stopped worker says so (JobResumed). It
// returns the job and its key as of this start, which the worker charges with
// (RecordPositions reloads it only once the key's stream moves on, and checks the
// account's budget at every record). A job whose key was revoked, or whose budget or
// its account's was lowered below what has been spent and is held, while the job
// waited fails here, charging nothing: ErrNotClaimable, as when the job has ended.
func (h *Handler) StartJob(ctx context.Context, jobID, worker string, tookOver bool) (*domain.Job, *domain.Key, error) {
	var out *domain.Job
	var key *domain.Key
	var stopped bool
	_, err := h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		stopped = false
		j, err := h.loadLockedJob(ctx, tx, jobID)
		if err != nil {
			return err
		}
		var e domain.Event
		switch {
		case j.State() == domain.StateQueued:
			e, err = j.Start(worker, h.now())
		case j.State() == domain.StateRunning && tookOver:
			e, err = j.Resume(worker, h.now())
		case j.State() == domain.StateRunning:
		default:
			return ErrNotClaimable
		}
		if err != nil {
			return err
		}
		if e != nil {
			if err := tx.Append(ctx, domain.JobStream(jobID), domain.StreamJob, j.Version(),
				eventstore.Metadata{AccountID: j.AccountID(), KeyID: j.KeyID(), CausationID: "SubmitJob"}, event(e)); err != nil {
				return err
			}
			j.Apply(e)
		}
		out = j
		if key, err = LoadKey(ctx, tx, j.KeyID()); err != nil {
			return err
		}
		if problem, err := keyRefuses(ctx, tx, key); err != nil {
			return err
		} else if problem != nil {
			stopped = true
			return h.failLocked(ctx, tx, j, worker, problem)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	h.jobs.keep(out.Clone()) // the caller has out; the job's first record reads no stream
	if stopped {
		return nil, nil, ErrNotClaimable
	}
	return out, key, nil
}

// QueueDepth counts the job positions on the queue (every server's and worker's): those
// waiting for a worker (never taken, or their lease ran out) and those a worker holds.
func QueueDepth(ctx context.Context, q eventstore.Querier) (waiting, held int64, err error) {
	err = q.QueryRow(ctx, `SELECT count(*) FILTER (WHERE worker IS NULL OR lease_until < now()),
		count(*) FILTER (WHERE worker IS NOT NULL AND lease_until >= now()) FROM job_queue`).Scan(&waiting, &held)
	if err != nil {
		return 0, 0, fmt.Errorf("job queue depth: %w", err)
	}
	return waiting, held, nil
}
