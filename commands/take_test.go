package commands_test

import (
	"context"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"chessd/commands"
	"chessd/eventstore"
	"chessd/postgres/pgtest"
)

// takeSpec is the order TakePositions must follow, written the plain way: number every
// free position of the queue per account (after the account's positions in flight,
// oldest job first, input order within a job) and take the n lowest, or fewer: at least
// need, else no more than the worker's share of the free positions (counting at most
// 2n an account) among the workers alive or holding positions. TakePositions reads
// only the first few of each account; on any queue, it takes the same.
const takeSpec = `
	WITH busy AS (
		SELECT account_id, count(*) AS n FROM job_queue
		 WHERE worker IS NOT NULL AND lease_until >= now() GROUP BY account_id
	), free AS (
		SELECT q.job_id, q.idx, q.submitted_at,
		       coalesce(b.n, 0) + row_number() OVER (PARTITION BY q.account_id ORDER BY q.submitted_at, q.job_id, q.idx) AS turn
		  FROM job_queue q LEFT JOIN busy b USING (account_id)
		 WHERE q.worker IS NULL OR q.lease_until < now()
	), seen AS (
		SELECT coalesce(sum(least(c, 2 * $1)), 0) AS n FROM (
			SELECT count(*) AS c FROM job_queue WHERE worker IS NULL OR lease_until < now() GROUP BY account_id) a
	), workers AS (
		SELECT 1 + count(DISTINCT worker) AS n FROM (
			SELECT worker FROM job_queue WHERE worker IS NOT NULL AND lease_until >= now()
			UNION ALL
			SELECT worker FROM job_workers WHERE alive_until >= now()) w
		 WHERE worker <> 'w'
	)
	SELECT job_id, idx FROM free ORDER BY turn, submitted_at, job_id, idx
	 LIMIT least($1, greatest($2, ceil((SELECT n FROM seen)::numeric / (SELECT n FROM workers))))`

func TestTakePositionsFollowsTheSpec(t *testing.T) {
	f := newFixture(t)
	rng := rand.New(rand.NewPCG(7, 15))
	for round := range 150 {
		if _, err := f.pool.Exec(f.ctx, `DELETE FROM job_queue; DELETE FROM job_workers`); err != nil {
			t.Fatal(err)
		}
		// up to 4 accounts of up to 3 jobs of up to 6 positions; some positions held by
		// one of two other workers, some of those with their lease run out; some
		// workers say they are alive (this one too), or said so and are not any more
		b := &pgx.Batch{}
		for _, w := range []string{"w", "other", "idle", "gone"} {
			switch r := rng.IntN(3); {
			case r == 1:
				b.Queue(`INSERT INTO job_workers VALUES ($1, now() + interval '1 minute')`, w)
			case r == 2:
				b.Queue(`INSERT INTO job_workers VALUES ($1, now() - interval '1 minute')`, w)
			}
		}
		for a := range 1 + rng.IntN(4) {
			for j := range rng.IntN(4) {
				job, at := fmt.Sprintf("job-%d-%d-%d", round, a, j), time.Duration(rng.IntN(100))*time.Second
				for i := range 1 + rng.IntN(6) {
					var worker *string
					lease := time.Minute
					switch r := rng.IntN(10); {
					case r < 3:
						w := []string{"other", "another"}[rng.IntN(2)]
						worker = &w
					case r < 4:
						w := "other"
						worker, lease = &w, -time.Minute
					}
					b.Queue(`INSERT INTO job_queue (job_id, idx, account_id, submitted_at, worker, lease_until)
						VALUES ($1, $2, $3, now() - $4::interval, $5, CASE WHEN $5::text IS NULL THEN NULL ELSE now() + $6::interval END)`,
						job, i, fmt.Sprintf("acct-%d", a), at.String(), worker, lease.String())
				}
			}
		}
		if err := f.pool.SendBatch(f.ctx, b).Close(); err != nil {
			t.Fatal(err)
		}
		n := 1 + rng.IntN(4)
		need := rng.IntN(n + 1)
		rounded := 1 << (bits.Len(uint(n)) - 1) // TakePositions takes up to a power of two
		rows, _ := f.pool.Query(f.ctx, takeSpec, rounded, min(need, rounded))
		want, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			var job string
			var idx int
			err := r.Scan(&job, &idx)
			return fmt.Sprintf("%s/%d", job, idx), err
		})
		if err != nil {
			t.Fatal(err)
		}
		var tookOver []string
		if err := f.pool.QueryRow(f.ctx, `SELECT coalesce(array_agg(job_id || '/' || idx), '{}') FROM job_queue
			WHERE worker = 'other' AND lease_until < now()`).Scan(&tookOver); err != nil {
			t.Fatal(err)
		}
		taken, err := f.h.TakePositions(f.ctx, "w", n, need, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, tk := range taken {
			name := fmt.Sprintf("%s/%d", tk.JobID, tk.Index)
			if tk.TookOver != slices.Contains(tookOver, name) {
				t.Errorf("round %d: %s taken over %v", round, name, tk.TookOver)
			}
			got = append(got, name)
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("round %d, n = %d, need = %d: took %v, the spec takes %v", round, n, need, got, want)
		}
	}
}

// A take writes its worker's name and lease into its statement (TakePositions): any
// name is held as itself, however it is quoted, and the lease runs as long as asked.
func TestTakeWritesAnyWorkerNameAsItself(t *testing.T) {
	f := newFixture(t)
	for i, worker := range []string{"host:1", "it's", `back\slash`, "$w$", "ends in $w", "$w$ and $w0$", "$", "w$", "ünïcode $w"} {
		job := fmt.Sprintf("job-name-%d", i)
		if _, err := f.pool.Exec(f.ctx, `INSERT INTO job_queue (job_id, idx, account_id, submitted_at) VALUES ($1, 0, $1, now())`, job); err != nil {
			t.Fatal(err)
		}
		taken, err := f.h.TakePositions(f.ctx, worker, 1, 1, 90*time.Second)
		if err != nil {
			t.Fatalf("%q: %v", worker, err)
		}
		if len(taken) != 1 || taken[0].JobID != job || taken[0].TookOver {
			t.Fatalf("%q took %+v", worker, taken)
		}
		var held string
		var lease time.Duration
		if err := f.pool.QueryRow(f.ctx, `SELECT worker, lease_until - now() FROM job_queue WHERE job_id = $1`, job).Scan(&held, &lease); err != nil {
			t.Fatal(err)
		}
		if held != worker || lease < 80*time.Second || lease > 90*time.Second {
			t.Errorf("%q: held by %q for %v", worker, held, lease)
		}
	}
}

// BenchmarkTakePositions takes two positions at a time from queues of many lengths
// (ten accounts' 50-position jobs, none held): a take's cost should not follow the
// queue's length.
func BenchmarkTakePositions(b *testing.B) {
	pool := pgtest.NewDB(b)
	h := commands.New(eventstore.NewStore(pool, nil), nil)
	ctx := context.Background()
	for _, queued := range []int{50, 5_000, 20_000} {
		b.Run(fmt.Sprintf("queued=%d", queued), func(b *testing.B) {
			fill := func() {
				if _, err := pool.Exec(ctx, `TRUNCATE job_queue`); err != nil {
					b.Fatal(err)
				}
				if _, err := pool.Exec(ctx, `INSERT INTO job_queue (job_id, idx, account_id, submitted_at)
					SELECT 'job' || (i / 50), i % 50, 'acct' || ((i / 50) % 10), now() - make_interval(secs => i / 50)
					  FROM generate_series(0, $1 - 1) i`, queued); err != nil {
					b.Fatal(err)
				}
				if _, err := pool.Exec(ctx, `ANALYZE job_queue`); err != nil {
					b.Fatal(err)
				}
			}
			fill()
			taken := 0
			for b.Loop() {
				if taken+2 > queued { // all held: start again
					b.StopTimer()
					fill()
					taken = 0
					b.StartTimer()
				}
				got, err := h.TakePositions(ctx, "w", 2, 2, time.Minute)
				if err != nil || len(got) != 2 {
					b.Fatalf("took %d: %v", len(got), err)
				}
				taken += 2
			}
		})
	}
}
