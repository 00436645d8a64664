package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"chessd/domain"
	"chessd/postgres/pgtest"
	"chessd/projections"
)

// `chessd rebuild`, run twice while a real server answers a load (charged evals with
// Idempotency-Keys, key and account reads, batch jobs, signups) and its projections and
// executor run: every answer is one the service may give, every eval answered 200 is
// charged once, the ledger's read model holds every charge of the log and balances,
// no event is set aside (a live projection whose snapshot was older than a rebuild
// starts again), and replay and verify find nothing wrong. The tables are swapped
// under the server's settles and reads; its prepared statements find the new ones.
func TestRebuildUnderLoad(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	srv := startServer(t, buildBinary(t), dbURL, freePort(t))
	pool, su := account(t, dbURL, "rebuild-load@example.com", domain.PlanPro)
	load := newLoad(t, srv, su.Secret)
	stopLoad := load.start(t, 4, 100000)

	for round := range 2 {
		before, _, _ := load.count()
		waitFor(t, "answers before the rebuild", time.Minute, func() bool { n, _, _ := load.count(); return n >= before+100 })
		out, err := runCLI(t, dbURL, "rebuild")
		if err != nil || !strings.Contains(out, "rebuilt ledger_v1 from") {
			t.Fatalf("rebuild %d under load: %v\n%s", round, err, out)
		}
	}
	_, _, okBefore := load.count()
	waitFor(t, "answers after the rebuilds", time.Minute, func() bool { _, _, ok := load.count(); return ok >= okBefore+100 })
	stopLoad()
	if v := load.someViolations(); v != "" {
		t.Fatalf("answers the service must never give:\n%s", v)
	}
	load.jobsSucceeded(t)
	load.chargedOnce(t, pool, su.KeyID)
	var events, rows int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM events WHERE event_type = 'UnitsCharged')
			+ (SELECT coalesce(sum(json_array_length(payload->'lines')), 0) FROM events WHERE event_type = 'ChargesSettled'),
			(SELECT count(*) FROM charge_lines())`).
		Scan(&events, &rows); err != nil || events != rows {
		t.Fatalf("%d charges in the log, %d in the read model (%v)", events, rows, err)
	}
	balanced(t, pool)
	var setAside []string
	if rows, err := pool.Query(ctx, `SELECT projection || ' ' || position || ' ' || error FROM set_aside_events`); err != nil {
		t.Fatal(err)
	} else if setAside, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || len(setAside) > 0 {
		t.Fatalf("events set aside while the rebuilds ran: %v (%v)", setAside, err)
	}
	// the jobs read model follows the events (GET /jobs/{id} folds them): replay compares
	// it once the projections have applied everything the load made
	waitFor(t, "the projections to catch up", time.Minute, func() bool {
		_, statuses, err := projections.Statuses(ctx, pool, projections.All())
		for _, st := range statuses {
			if st.Lag > 0 {
				return false
			}
		}
		return err == nil
	})
	srv.stop(t)
	if out, err := runCLI(t, dbURL, "replay"); err != nil {
		t.Fatalf("replay after the rebuilds: %v\n%s", err, out)
	}
	if out, err := runCLI(t, dbURL, "verify"); err != nil {
		t.Fatalf("chain after the rebuilds: %v\n%s", err, out)
	}
	answers, _, _ := load.count()
	t.Logf("%d answers, %d evals, %d jobs; %d charges", answers, len(load.evals), len(load.jobs), rows)
}
