package webhook_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"chessd/postgres/pgtest"
	"chessd/webhook"
)

// Expire deletes the deliveries delivered or failed (out of tries, or their endpoint
// deleted) more than the age ago, and leaves the younger ones and every pending one,
// however old. It works in batches (of 2 here, so the old ones take more than one).
func TestExpire(t *testing.T) {
	const age = 30 * 24 * time.Hour
	const (
		old   = "now() - interval '31 days'"
		young = "now() - interval '29 days'"
	)
	// delivered and failed "" are NULL
	rows := []struct {
		name, endpoint, created, delivered, failed string
		gone                                       bool
	}{
		{"delivered long ago", "live", old, old, "", true},
		{"delivered long ago, 2", "live", old, old, "", true},
		{"delivered long ago, 3", "live", old, old, "", true},
		{"delivered lately", "live", old, young, "", false},
		{"delivered just now", "live", "now()", "now()", "", false},
		{"failed long ago", "live", old, "", old, true},
		{"failed lately", "live", old, "", young, false},
		{"ended by its endpoint's deletion long ago", "deleted", old, "", old, true},
		{"ended by its endpoint's deletion lately", "deleted", young, "", young, false},
		{"queued long ago, delivered lately", "live", "now() - interval '40 days'", young, "", false},
		{"pending, queued long ago", "live", "now() - interval '40 days'", "", "", false},
		{"pending, queued just now", "live", "now()", "", "", false},
	}
	pool := pgtest.NewDB(t)
	bg := context.Background()
	if _, err := pool.Exec(bg, `INSERT INTO webhook_endpoints (endpoint_id, account_id, env, url, secret, deleted_at)
		VALUES ('live', 'acct_a', 'live', 'https://example.com/a', 's', NULL),
		       ('deleted', 'acct_a', 'live', 'https://example.com/b', 's', now() - interval '31 days')`); err != nil {
		t.Fatal(err)
	}
	gone := 0
	var want []string
	for i, r := range rows {
		delivered, failed := "NULL", "NULL"
		if r.delivered != "" {
			delivered = r.delivered
		}
		if r.failed != "" {
			failed = r.failed
		}
		if _, err := pool.Exec(bg, fmt.Sprintf(`INSERT INTO webhook_deliveries
			(delivery_id, endpoint_id, account_id, event_type, payload, created_at, delivered_at, failed_at)
			VALUES ($1, $2, 'acct_a', 'ping', jsonb_build_object('name', $3::text), %s, %s, %s)`, r.created, delivered, failed),
			fmt.Sprintf("whd_%02d", i), r.endpoint, r.name); err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
		if r.gone {
			gone++
		} else {
			want = append(want, r.name)
		}
	}
	webhook.SetExpireBatch(t, 2)

	n, err := webhook.Expire(bg, pool, age)
	if err != nil {
		t.Fatal(err)
	}
	if got := deliveries(t, pool); !slices.Equal(got, want) {
		t.Errorf("after Expire:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if n != int64(gone) {
		t.Errorf("Expire answered %d deliveries deleted, want %d", n, gone)
	}
	if n, err := webhook.Expire(bg, pool, age); err != nil || n != 0 {
		t.Errorf("Expire again: %d deleted (%v), want none", n, err)
	}
	var endpoints int
	if err := pool.QueryRow(bg, `SELECT count(*) FROM webhook_endpoints`).Scan(&endpoints); err != nil || endpoints != 2 {
		t.Errorf("%d endpoints left (%v), want both: Expire deletes deliveries only", endpoints, err)
	}
}

// deliveries answers the name of each delivery left, in the order they were queued.
func deliveries(t *testing.T, pool interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT payload->>'name' FROM webhook_deliveries ORDER BY delivery_id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// Expire finds the finished deliveries by an index, not a scan of the table, which
// holds every delivery finished within the age. (enable_seqscan off: an empty test
// table would be scanned anyway; a scan then shows only for want of an index.)
func TestExpireUsesAnIndex(t *testing.T) {
	pool := pgtest.NewDB(t)
	bg := context.Background()
	tx, err := pool.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(bg) //nolint:errcheck // only explained
	if _, err := tx.Exec(bg, `SET LOCAL enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	stmt, args := webhook.ExpireStatement(30 * 24 * time.Hour)
	rows, err := tx.Query(bg, "EXPLAIN "+stmt, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if plan := strings.Join(lines, "\n"); strings.Contains(plan, "Seq Scan") {
		t.Errorf("Expire scans the table:\n%s", plan)
	}
}
