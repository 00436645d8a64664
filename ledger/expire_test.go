package ledger_test

import (
	"context"
	"testing"

	"chessd/ledger"
	"chessd/postgres/pgtest"
)

// Expire deletes Idempotency-Key answers past 24 hours and keyless allowances of days
// before yesterday, and nothing younger.
func TestExpire(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	if _, err := pool.Exec(ctx, `
		INSERT INTO idempotency (scope, idem_key, request_hash, status, response, created_at) VALUES
			('k', 'old', '', 200, '', now() - interval '25 hours'),
			('k', 'new', '', 200, '', now() - interval '23 hours');
		INSERT INTO keyless_usage (ip, day, calls) VALUES
			('10.0.0.1', (now() AT TIME ZONE 'UTC')::date - 2, 1),
			('10.0.0.1', (now() AT TIME ZONE 'UTC')::date - 1, 1),
			('10.0.0.1', (now() AT TIME ZONE 'UTC')::date, 1)`); err != nil {
		t.Fatal(err)
	}
	n, err := ledger.Expire(ctx, pool)
	if err != nil || n != 2 {
		t.Fatalf("expired %d rows (%v), want 2", n, err)
	}
	var idem, keyless int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM idempotency WHERE idem_key = 'new'),
		(SELECT count(*) FROM keyless_usage WHERE day >= (now() AT TIME ZONE 'UTC')::date - 1)`).Scan(&idem, &keyless); err != nil {
		t.Fatal(err)
	}
	if idem != 1 || keyless != 2 {
		t.Fatalf("kept %d answers and %d allowances, want 1 and 2", idem, keyless)
	}
}
