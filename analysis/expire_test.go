package analysis

import (
	"context"
	"testing"
	"time"

	"chessd/postgres/pgtest"
)

// ExpireCache deletes the entries not written for longer than the age given.
func TestExpireCache(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	if _, err := pool.Exec(ctx, `INSERT INTO eval_cache (pos_key, multipv, depth, result, created_at) VALUES
		('old', 1, 10, '{}', now() - interval '31 days'), ('new', 1, 10, '{}', now() - interval '29 days')`); err != nil {
		t.Fatal(err)
	}
	n, err := ExpireCache(ctx, pool, 30*24*time.Hour)
	if err != nil || n != 1 {
		t.Fatalf("expired %d (%v), want 1", n, err)
	}
	var left string
	if err := pool.QueryRow(ctx, `SELECT string_agg(pos_key, ',') FROM eval_cache`).Scan(&left); err != nil || left != "new" {
		t.Fatalf("left %q (%v), want new", left, err)
	}
}
