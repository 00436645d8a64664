package projections_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/postgres/pgtest"
	"chessd/projections"
)

// jobEvents appends a submitted, started job with n analysed positions to a fresh
// stream and returns its events.
func jobEvents(t *testing.T, pool *pgxpool.Pool, id string, n int) []eventstore.Event {
	t.Helper()
	now := time.Now().UTC()
	var positions []domain.JobPosition
	for i := range n {
		positions = append(positions, domain.JobPosition{Index: i, FEN: "8/8/8/4k3/8/8/4P3/4K3 w - - 0 1"})
	}
	evs := []domain.Event{
		&domain.JobSubmitted{JobID: id, AccountID: "acct_j", KeyID: "key_j", Env: "live", Kind: "batch",
			Spec: domain.JobSpec{Depth: 10, MultiPV: 1, Engine: "sf-17.1", Path: "native"}, Positions: positions, SubmittedAt: now},
		&domain.JobStarted{Worker: "w", StartedAt: now},
	}
	for i := range n {
		evs = append(evs, &domain.JobPositionAnalysed{Index: i, Result: json.RawMessage(`{"eval":0.5}`), Units: 10})
	}
	return appendRaw(t, pool, domain.JobStream(id), domain.StreamJob, 0, evs...)
}

// applyJobs applies evs to the jobs projection in one transaction, committed or rolled
// back, and returns the round trips each took.
func applyJobs(t *testing.T, pool *pgxpool.Pool, trips *roundTrips, commit bool, evs ...eventstore.Event) []int64 {
	t.Helper()
	ctx := context.Background()
	var each []int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, e := range evs {
			before := trips.n.Load()
			if err := (projections.Jobs{}).Apply(ctx, tx, e); err != nil {
				return fmt.Errorf("position %d: %w", e.Position, err)
			}
			each = append(each, trips.n.Load()-before)
		}
		if !commit {
			return errRollBack
		}
		return nil
	})
	if err != nil && !errors.Is(err, errRollBack) {
		t.Fatal(err)
	}
	return each
}

var errRollBack = errors.New("rolled back on purpose")

// jobStream is a job's SSE events as the projection left them: seq, version and kind.
func jobStream(t *testing.T, pool *pgxpool.Pool, id string) []string {
	t.Helper()
	return column(t, pool, `SELECT concat_ws(' ', seq, version, kind) FROM job_stream WHERE job_id = $1 ORDER BY seq`, id)
}

// A job's events, applied one after another, cost one round trip each after the first;
// when the projection's memory of a job is ahead of its row (the transaction that moved
// the row rolled back) the event still lands once, in order, with the ones it missed.
func TestJobsProjectionAppliesTheNextEventInOneRoundTrip(t *testing.T) {
	pool := pgtest.NewDB(t)
	traced, trips := tracedPool(t, pool)
	want := []string{"1 1 state", "2 2 state", "3 3 position", "4 3 progress", "5 4 position", "6 4 progress", "7 5 position", "8 5 progress"}

	evs := jobEvents(t, pool, "job_next", 3)
	each := applyJobs(t, traced, trips, true, evs...)
	if !reflect.DeepEqual(each[1:], []int64{1, 1, 1, 1}) {
		t.Errorf("round trips per event %v, want one each after the first", each)
	}
	if got := jobStream(t, pool, "job_next"); !reflect.DeepEqual(got, want) {
		t.Fatalf("job stream %q, want %q", got, want)
	}

	evs = jobEvents(t, pool, "job_behind", 3)
	applyJobs(t, traced, trips, true, evs[0])
	applyJobs(t, traced, trips, false, evs[1]) // remembered at version 2, the row still at 1
	applyJobs(t, traced, trips, true, evs[2:]...)
	if got := jobStream(t, pool, "job_behind"); !reflect.DeepEqual(got, want) {
		t.Fatalf("after a rollback: job stream %q, want %q", got, want)
	}
	var version, done int
	if err := pool.QueryRow(context.Background(), `SELECT version, positions_done FROM jobs WHERE job_id = 'job_behind'`).Scan(&version, &done); err != nil || version != 5 || done != 3 {
		t.Fatalf("jobs row at version %d with %d done (%v), want 5 and 3", version, done, err)
	}
}

// sqlLog records the statements a pool sends, batched ones included.
type sqlLog struct {
	mu  sync.Mutex
	sql []string
}

func (l *sqlLog) add(sql string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = append(l.sql, sql)
}

// count is how many statements sent so far contain s.
func (l *sqlLog) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, q := range l.sql {
		if strings.Contains(q, s) {
			n++
		}
	}
	return n
}

func (l *sqlLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.add(d.SQL)
	return ctx
}
func (l *sqlLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (l *sqlLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (l *sqlLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.add(d.SQL)
}
func (l *sqlLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// loggedPool is another pool on pool's database whose statements are recorded.
func loggedPool(t *testing.T, pool *pgxpool.Pool) (*pgxpool.Pool, *sqlLog) {
	t.Helper()
	log := &sqlLog{}
	return withTracer(t, pool, log), log
}

// record appends, in one transaction, n analysed positions (from index first; those
// bad says, with a payload PostgreSQL refuses as jsonb) to each job, at its version,
// and its success when done.
func record(t *testing.T, pool *pgxpool.Pool, jobs map[string]int64, first, n int, bad func(job string, i int) bool, done bool) {
	t.Helper()
	_, err := eventstore.NewStore(pool, quiet).Transact(context.Background(), func(ctx context.Context, tx *eventstore.Tx) error {
		for id, version := range jobs {
			var news []eventstore.New
			for i := first; i < first+n; i++ {
				result := json.RawMessage(`{"eval":0.5}`)
				if bad != nil && bad(id, i) {
					result = json.RawMessage(`{"eval":"\u0000"}`)
				}
				news = append(news, eventstore.New{Type: "JobPositionAnalysed", SchemaVersion: 1,
					Payload: &domain.JobPositionAnalysed{Index: i, Result: result, Units: 10}})
			}
			if done {
				news = append(news, eventstore.New{Type: "JobSucceeded", SchemaVersion: 1, Payload: &domain.JobSucceeded{FinishedAt: time.Now().UTC()}})
			}
			if err := tx.Append(ctx, domain.JobStream(id), domain.StreamJob, version, eventstore.Metadata{RequestID: "test"}, news...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// jobVersion is the version of a job's row in the read model (0: none).
func jobVersion(t *testing.T, pool *pgxpool.Pool, id string) int64 {
	t.Helper()
	var v int64
	err := pool.QueryRow(context.Background(), `SELECT version FROM jobs WHERE job_id = $1`, id).Scan(&v)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return v
}

// projectedJobs appends jobs submitted, started and with n positions analysed, waits
// until the projection has them, and returns their versions.
func projectedJobs(t *testing.T, pool *pgxpool.Pool, n int, ids ...string) map[string]int64 {
	t.Helper()
	jobs := map[string]int64{}
	for _, id := range ids {
		jobEvents(t, pool, id, n)
		jobs[id] = int64(2 + n)
		pgtest.WaitFor(t, id+" projected", func() bool { return jobVersion(t, pool, id) == jobs[id] })
	}
	return jobs
}

// jobsReadModel is every jobs row and SSE event, as text.
func jobsReadModel(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	return append(column(t, pool, `SELECT concat_ws(' ', job_id, state, positions_done, cost_units, version) FROM jobs ORDER BY job_id`),
		column(t, pool, `SELECT concat_ws(' ', job_id, seq, version, kind, data::text) FROM job_stream ORDER BY job_id, seq`)...)
}

// A record's events of each job reach the read model in one statement per job, all of
// a batch's jobs in one round trip, and leave it as applying them one by one does (a
// rebuild).
func TestJobsProjectionAppliesARecordTogether(t *testing.T) {
	pool := pgtest.NewDB(t)
	logged, log := loggedPool(t, pool)
	runProjections(t, logged, projections.Jobs{})
	jobs := projectedJobs(t, pool, 30, "job_rec_a", "job_rec_b")
	before := log.count("WITH moved AS")
	record(t, pool, jobs, 0, 30, nil, true) // the positions analysed again, as after a takeover
	pgtest.WaitFor(t, "the record projected", func() bool {
		return jobVersion(t, pool, "job_rec_a") == 63 && jobVersion(t, pool, "job_rec_b") == 63
	})
	if moves := log.count("WITH moved AS") - before; moves != 2 {
		t.Errorf("the record of 31 events for each of two jobs took %d statements, want one per job", moves)
	}
	live := jobsReadModel(t, pool)
	if len(live) != 2+2*(2+120+2) {
		t.Fatalf("read model of %d rows, want 2 jobs and 124 SSE events each: %q", len(live), live)
	}
	if _, err := projections.Rebuild(context.Background(), pool, projections.Jobs{}); err != nil {
		t.Fatal(err)
	}
	if rebuilt := jobsReadModel(t, pool); !reflect.DeepEqual(rebuilt, live) {
		t.Fatalf("applied together:\n%q\nrebuilt one by one:\n%q", live, rebuilt)
	}
}

// An event the database refuses inside a record applied together is set aside as
// alone: the events before it stay, the later ones of its job wait behind it, and the
// other jobs of the record are applied whole.
func TestJobsProjectionSetsAsideWithinARecord(t *testing.T) {
	pool := pgtest.NewDB(t)
	runProjections(t, pool, projections.Jobs{})
	jobs := projectedJobs(t, pool, 7, "job_bad", "job_good")
	record(t, pool, jobs, 0, 3, nil, false) // applied together, so the bad one below fails the bulk writes
	pgtest.WaitFor(t, "the first record projected", func() bool {
		return jobVersion(t, pool, "job_bad") == 12 && jobVersion(t, pool, "job_good") == 12
	})
	record(t, pool, map[string]int64{"job_bad": 12, "job_good": 12}, 3, 4,
		func(job string, i int) bool { return job == "job_bad" && i == 4 }, true)
	pgtest.WaitFor(t, "the good job projected", func() bool { return jobVersion(t, pool, "job_good") == 17 })
	pgtest.WaitFor(t, "the bad job's events set aside", func() bool { return len(setAsideRows(t, pool)) == 4 })
	if v := jobVersion(t, pool, "job_bad"); v != 13 {
		t.Errorf("the bad job's row at version %d, want 13 (index 3 applied, index 4 refused)", v)
	}
	rows := setAsideRows(t, pool)
	for i, want := range []string{"job_bad JobPositionAnalysed open ERROR", "job_bad JobPositionAnalysed", "job_bad JobPositionAnalysed", "job_bad JobSucceeded"} {
		if !strings.Contains(rows[i], want) {
			t.Errorf("set-aside row %d %q, want it to hold %q", i, rows[i], want)
		}
	}
	if !strings.Contains(rows[0], "Unicode") && !strings.Contains(rows[0], "unicode") {
		t.Errorf("the refused event's error %q does not say why", rows[0])
	}
	for _, r := range rows[1:] {
		if !strings.Contains(r, "held") {
			t.Errorf("set-aside row %q is not held behind the refused event", r)
		}
	}
}
