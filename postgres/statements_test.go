package postgres_test

import (
	"context"
	"strings"
	"testing"

	"chessd/postgres"
	"chessd/postgres/pgtest"
)

// TopStatements names what ran since StartStatements, most time first, and starts again.
func TestTopStatements(t *testing.T) {
	pool := pgtest.NewDB(t)
	ctx := context.Background()
	var preload string
	if err := pool.QueryRow(ctx, `SHOW shared_preload_libraries`).Scan(&preload); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(preload, "pg_stat_statements") {
		t.Skip("DATABASE_URL's server does not load pg_stat_statements (the embedded test cluster does)")
	}
	if err := postgres.StartStatements(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := pool.Exec(ctx, `SELECT pg_sleep(0.01), 'top-statements-probe'`); err != nil {
			t.Fatal(err)
		}
	}
	top, err := postgres.TopStatements(ctx, pool, 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(top) == 0 || !strings.Contains(top[0].Query, "pg_sleep") || top[0].Calls != 3 || top[0].TotalMS < 30 {
		t.Fatalf("top statements %+v, want the probe first: 3 calls, at least 30 ms", top)
	}
	again, err := postgres.TopStatements(ctx, pool, 5)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range again {
		if strings.Contains(s.Query, "pg_sleep") {
			t.Fatalf("the probe is still counted after TopStatements: %+v", s)
		}
	}
}

// Settle vacuums and analyses the table it is given (and checkpoints).
func TestSettle(t *testing.T) {
	pool := pgtest.NewDB(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE "settle me" (n int); INSERT INTO "settle me" SELECT generate_series(1, 1000)`); err != nil {
		t.Fatal(err)
	}
	if err := postgres.Settle(ctx, pool, "settle me"); err != nil {
		t.Fatal(err)
	}
	var vacuumed, analysed bool
	if err := pool.QueryRow(ctx, `SELECT last_vacuum IS NOT NULL, last_analyze IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'settle me'`).
		Scan(&vacuumed, &analysed); err != nil || !vacuumed || !analysed {
		t.Fatalf("vacuumed %v, analysed %v (%v)", vacuumed, analysed, err)
	}
}
