package projections_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
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
