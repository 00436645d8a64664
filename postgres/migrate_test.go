package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/migrations"
	"chessd/postgres"
	"chessd/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// emptyDB creates a database with no migrations applied, on the test server, dropped
// when the test ends.
func emptyDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	base := pgtest.URL(t) // a database on the test server to connect through
	name := fmt.Sprintf("chessd_empty_%d_%d", os.Getpid(), time.Now().UnixNano())
	if err := postgres.CreateDatabase(ctx, base, name); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	pool, err := postgres.Open(ctx, u.String(), 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		if conn, err := pgx.Connect(ctx, base); err == nil {
			conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)") //nolint:errcheck // best effort
			conn.Close(ctx)
		}
	})
	return pool
}

func embedded(t *testing.T) []string {
	t.Helper()
	entries, err := migrations.FS.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".sql") {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	if len(names) == 0 {
		t.Fatal("no embedded migrations")
	}
	return names
}

// On an empty database every migration is applied once, in file-name order, and
// recorded; Pending then lists nothing; running Migrate again (two servers starting
// together) changes nothing; a migration whose record is missing is pending again.
func TestMigrate(t *testing.T) {
	ctx := context.Background()
	pool := emptyDB(t)
	if _, err := postgres.Pending(ctx, pool); err == nil {
		t.Fatal("Pending on a database never migrated: no error")
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = postgres.Migrate(ctx, pool, quiet) }()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent migrations: %v", err)
	}
	rows, err := pool.Query(ctx, `SELECT name FROM schema_migrations ORDER BY applied_at, name`)
	if err != nil {
		t.Fatal(err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := embedded(t); !slices.Equal(applied, want) {
		t.Fatalf("applied in this order:\n%v\nwant every migration once, in file-name order:\n%v", applied, want)
	}
	if pending, err := postgres.Pending(ctx, pool); err != nil || len(pending) != 0 {
		t.Fatalf("pending after migrating: %v (%v)", pending, err)
	}
	if err := postgres.Migrate(ctx, pool, quiet); err != nil {
		t.Fatalf("migrating a migrated database: %v", err)
	}
	last := applied[len(applied)-1]
	if _, err := pool.Exec(ctx, `DELETE FROM schema_migrations WHERE name = $1`, last); err != nil {
		t.Fatal(err)
	}
	if pending, err := postgres.Pending(ctx, pool); err != nil || !slices.Equal(pending, []string{last}) {
		t.Fatalf("pending with %s unrecorded: %v (%v)", last, pending, err)
	}

	// A newer chessd migrated the database further: this one refuses to run on it.
	if _, err := pool.Exec(ctx, `INSERT INTO schema_migrations (name) VALUES ($1), ('9999_from_the_future.sql')`, last); err != nil {
		t.Fatal(err)
	}
	if _, newer, err := postgres.Compare(ctx, pool); err != nil || !slices.Equal(newer, []string{"9999_from_the_future.sql"}) {
		t.Fatalf("newer: %v (%v)", newer, err)
	}
	if err := postgres.Migrate(ctx, pool, quiet); !errors.Is(err, postgres.ErrSchemaNewer) || !strings.Contains(err.Error(), "9999_from_the_future.sql") {
		t.Fatalf("migrating a database a newer chessd migrated: %v, want ErrSchemaNewer naming the migration", err)
	}
	if pending, err := postgres.Pending(ctx, pool); err != nil || len(pending) != 0 {
		t.Fatalf("the older binary still applied what it had: pending %v (%v)", pending, err)
	}
}

// WatchNewer waits while the schema is this binary's, and tells once a newer chessd
// has migrated the database.
func TestWatchNewer(t *testing.T) {
	pool := pgtest.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	quietCtx, stop := context.WithTimeout(ctx, 200*time.Millisecond)
	defer stop()
	if err := postgres.WatchNewer(quietCtx, pool, 20*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("on this binary's schema: %v, want the context's end", err)
	}
	done := make(chan error, 1)
	go func() { done <- postgres.WatchNewer(ctx, pool, 20*time.Millisecond) }()
	if _, err := pool.Exec(ctx, `INSERT INTO schema_migrations (name) VALUES ('9999_from_the_future.sql')`); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, postgres.ErrSchemaNewer) || !strings.Contains(err.Error(), "9999_from_the_future.sql") {
		t.Fatalf("after a newer migration: %v, want ErrSchemaNewer naming it", err)
	}
}

// Every PL/pgSQL function of the schema plans its statements once per session
// (migration 0028): a later CREATE OR REPLACE that drops the setting puts planning back
// on every call of the money path. The two bulk refreshes are left to custom plans.
func TestFunctionsPlanOnce(t *testing.T) {
	pool := pgtest.NewDB(t)
	rows, err := pool.Query(context.Background(), `SELECT p.oid::regprocedure::text
		  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
		 WHERE l.lanname = 'plpgsql' AND p.pronamespace = current_schema()::regnamespace
		   AND p.proname NOT IN ('usage_refresh', 'usage_fill')
		   AND NOT coalesce('plan_cache_mode=force_generic_plan' = ANY (p.proconfig), false)
		 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	missing, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) > 0 {
		t.Fatalf("PL/pgSQL functions without SET plan_cache_mode = force_generic_plan: %v", missing)
	}
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
		 WHERE l.lanname = 'plpgsql' AND p.pronamespace = current_schema()::regnamespace`).Scan(&n); err != nil || n < 10 {
		t.Fatalf("PL/pgSQL functions found: %d (%v); the query looks in the wrong place", n, err)
	}
}

// The error classes of errors PostgreSQL and the network really produce.
func TestErrorClassesFromTheServer(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE t (id int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO t VALUES (1), (2)`); err != nil {
		t.Fatal(err)
	}

	_, unique := pool.Exec(ctx, `INSERT INTO t VALUES (1)`)
	_, syntax := pool.Exec(ctx, `SELEC 1`)
	_, refused := pgx.Connect(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=5")
	for _, tc := range []struct {
		name                   string
		err                    error
		retryable, unavailable bool
	}{
		{"unique violation", unique, false, false},
		{"syntax error", syntax, false, false},
		{"deadlock", deadlock(t, pool), true, false},
		{"connection refused", refused, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.err == nil {
				t.Fatal("no error produced")
			}
			if got := postgres.IsRetryable(tc.err); got != tc.retryable {
				t.Errorf("IsRetryable(%v) = %v", tc.err, got)
			}
			if got := postgres.IsUnavailable(tc.err); got != tc.unavailable {
				t.Errorf("IsUnavailable(%v) = %v", tc.err, got)
			}
			if got := postgres.IsTransient(tc.err); got != (tc.retryable || tc.unavailable) {
				t.Errorf("IsTransient(%v) = %v", tc.err, got)
			}
		})
	}
}

// deadlock makes two transactions lock t's two rows in opposite orders and returns the
// error of the one PostgreSQL chose as the victim.
func deadlock(t *testing.T, pool *pgxpool.Pool) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first, second := make(chan struct{}), make(chan struct{})
	errs := make(chan error, 2)
	lock := func(a, b int, mine, theirs chan struct{}) {
		errs <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT 1 FROM t WHERE id = $1 FOR UPDATE`, a); err != nil {
				return err
			}
			close(mine)
			<-theirs // both hold their first row: the second locks cross
			_, err := tx.Exec(ctx, `SELECT 1 FROM t WHERE id = $1 FOR UPDATE`, b)
			return err
		})
	}
	go lock(1, 2, first, second)
	go lock(2, 1, second, first)
	var failed error
	for range 2 {
		if err := <-errs; err != nil {
			failed = err
		}
	}
	return failed
}

// Migration 0029 gives the jobs that failed before it their JobFailed event's code and
// message, and leaves the other jobs without: run again on a database as 0028 left it.
func TestJobErrorsBackfill(t *testing.T) {
	ctx := context.Background()
	pool := emptyDB(t)
	if err := postgres.Migrate(ctx, pool, quiet); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`ALTER TABLE jobs DROP COLUMN error_code, DROP COLUMN error_message`,
		`DELETE FROM schema_migrations WHERE name = '0029_job_errors.sql'`,
		`INSERT INTO jobs (job_id, account_id, key_id, kind, state, positions_total, positions_done, cost_units, cost_usd, created_at, version)
		 VALUES ('job_failed', 'acct_a', 'key_a', 'batch', 'failed', 2, 1, 1, 0, now(), 4),
		        ('job_done', 'acct_a', 'key_a', 'batch', 'succeeded', 2, 2, 2, 0, now(), 5)`,
		`INSERT INTO events (position, stream_id, stream_type, version, event_type, schema_version, payload, metadata, recorded_at, hash)
		 VALUES (1, 'job-job_failed', 'job', 4, 'JobFailed', 1, '{"code":"engine_failed","message":"the engine stopped","finished_at":"2026-11-24T00:00:00Z"}', '{}', now(), '\x01'),
		        (2, 'job-job_done', 'job', 5, 'JobSucceeded', 1, '{"finished_at":"2026-11-24T00:00:00Z"}', '{}', now(), '\x02')`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := postgres.Migrate(ctx, pool, quiet); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT job_id || ' ' || coalesce(error_code, '-') || ' ' || coalesce(error_message, '-') FROM jobs ORDER BY job_id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if want := []string{"job_done - -", "job_failed engine_failed the engine stopped"}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("after the backfill: %q (%v), want %q", got, err, want)
	}
}

// Migration 0044 ends the pending deliveries of endpoints deleted before it (the sender
// still sent them), and leaves the other endpoints' and the finished ones as they were.
func TestDeletedWebhookEndpointsDeliveriesEnd(t *testing.T) {
	ctx := context.Background()
	pool := emptyDB(t)
	if err := postgres.Migrate(ctx, pool, quiet); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`DELETE FROM schema_migrations WHERE name = '0044_deleted_webhook_endpoints.sql'`,
		`INSERT INTO webhook_endpoints (endpoint_id, account_id, env, url, secret, deleted_at)
		 VALUES ('whe_gone', 'acct_a', 'live', 'https://example.com/a', 's', now()),
		        ('whe_kept', 'acct_a', 'live', 'https://example.com/b', 's', NULL)`,
		`INSERT INTO webhook_deliveries (delivery_id, endpoint_id, account_id, event_type, payload, delivered_at, failed_at, last_error)
		 VALUES ('whd_gone_pending', 'whe_gone', 'acct_a', 'ping', '{}', NULL, NULL, 'HTTP 500'),
		        ('whd_gone_delivered', 'whe_gone', 'acct_a', 'ping', '{}', now(), NULL, NULL),
		        ('whd_kept_pending', 'whe_kept', 'acct_a', 'ping', '{}', NULL, NULL, 'HTTP 500')`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := postgres.Migrate(ctx, pool, quiet); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT delivery_id || ' ' || CASE WHEN delivered_at IS NOT NULL THEN 'delivered'
		WHEN failed_at IS NOT NULL THEN 'failed' ELSE 'pending' END || ' ' || coalesce(last_error, '-')
		FROM webhook_deliveries ORDER BY delivery_id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	want := []string{"whd_gone_delivered delivered -", "whd_gone_pending failed endpoint deleted", "whd_kept_pending pending HTTP 500"}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("after the migration: %q (%v), want %q", got, err, want)
	}
}

// Migration 0045 clears the bodies of sent messages and ends the unsent ones whose token
// has expired, clearing theirs; a younger unsent message stays as it was, to be sealed
// by the first sender of this release that runs (mail's adoptOlder), and sent.
func TestMailBodiesClearedAtRest(t *testing.T) {
	ctx := context.Background()
	pool := emptyDB(t)
	if err := postgres.Migrate(ctx, pool, quiet); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`DELETE FROM schema_migrations WHERE name = '0045_mail_bodies_at_rest.sql'`,
		`INSERT INTO mail_outbox (id, account_id, to_email, subject, body, created_at, sent_at, sent_via, last_error) VALUES
		 (1, 'acct_a', 'a@example.com', 'Verify', 'token ev_sent', now() - interval '2 days', now() - interval '2 days', 'smtp', NULL),
		 (2, 'acct_b', 'b@example.com', 'Verify', 'token ev_expired', now() - interval '25 hours', NULL, NULL, 'smtp: refused'),
		 (3, 'acct_c', 'c@example.com', 'Verify', 'token ev_young', now() - interval '1 hour', NULL, NULL, NULL)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := postgres.Migrate(ctx, pool, quiet); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT to_email || ' ' || subject || ' [' || body || '] ' ||
		CASE WHEN sent_at IS NOT NULL THEN 'sent' WHEN next_attempt_at = 'infinity' THEN 'ended' ELSE 'due' END || ' ' || coalesce(last_error, '-')
		FROM mail_outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	want := []string{
		"a@example.com Verify [] sent -",
		"b@example.com Verify [] ended smtp: refused; not sent: its token had expired when migration 0045 cleared its body",
		"c@example.com Verify [token ev_young] due -",
	}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("after the migration: %q (%v), want %q", got, err, want)
	}
}
