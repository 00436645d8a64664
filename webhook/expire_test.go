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
// however old. Then it deletes the endpoints deleted more than the age ago that have
// no delivery left (it kept them, URL and sealed secret, for ever), and leaves live
// ones, those deleted lately, and those a delivery still references. It works in
// batches (of 2 here, so the old rows take more than one).
func TestExpire(t *testing.T) {
	const age = 30 * 24 * time.Hour
	const (
		old   = "now() - interval '31 days'"
		young = "now() - interval '29 days'"
	)
	// deleted "" is NULL
	endpoints := []struct {
		id, deleted string
		gone        bool
	}{
		{"live", "", false},
		{"live, no deliveries", "", false},
		{"deleted long ago", old, false}, // a delivery finished lately references it
		{"deleted long ago, its deliveries expire now", old, true},
		{"deleted long ago, no deliveries", old, true},
		{"deleted long ago, none, 2", "now() - interval '400 days'", true},
		{"deleted long ago, a delivery still pending", old, false}, // an older server's DELETE
		{"deleted lately, its deliveries expire now", young, false},
		{"deleted lately, no deliveries", young, false},
	}
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
		{"ended by its endpoint's deletion long ago", "deleted long ago", old, "", old, true},
		{"ended by its endpoint's deletion lately", "deleted long ago", young, "", young, false},
		{"queued long ago, delivered lately", "live", "now() - interval '40 days'", young, "", false},
		{"pending, queued long ago", "live", "now() - interval '40 days'", "", "", false},
		{"pending, queued just now", "live", "now()", "", "", false},
		{"a deleted endpoint's, long ago", "deleted long ago, its deliveries expire now", old, "", old, true},
		{"a deleted endpoint's, long ago, 2", "deleted long ago, its deliveries expire now", old, old, "", true},
		{"a deleted endpoint's, pending", "deleted long ago, a delivery still pending", "now() - interval '40 days'", "", "", false},
		{"a lately deleted endpoint's, long ago", "deleted lately, its deliveries expire now", old, "", old, true},
	}
	pool := pgtest.NewDB(t)
	bg := context.Background()
	gone := 0
	var wantEndpoints []string
	for _, e := range endpoints {
		deleted := "NULL"
		if e.deleted != "" {
			deleted = e.deleted
		}
		if _, err := pool.Exec(bg, fmt.Sprintf(`INSERT INTO webhook_endpoints (endpoint_id, account_id, env, url, secret, deleted_at)
			VALUES ($1, 'acct_a', 'live', 'https://example.com/a', 's', %s)`, deleted), e.id); err != nil {
			t.Fatalf("%s: %v", e.id, err)
		}
		if e.gone {
			gone++
		} else {
			wantEndpoints = append(wantEndpoints, e.id)
		}
	}
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
		t.Errorf("deliveries after Expire:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	rs, err := pool.Query(bg, `SELECT endpoint_id FROM webhook_endpoints ORDER BY endpoint_id COLLATE "C"`)
	if err != nil {
		t.Fatal(err)
	}
	left, err := pgx.CollectRows(rs, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if slices.Sort(wantEndpoints); !slices.Equal(left, wantEndpoints) {
		t.Errorf("endpoints after Expire:\n  %s\nwant:\n  %s", strings.Join(left, "\n  "), strings.Join(wantEndpoints, "\n  "))
	}
	if n != int64(gone) {
		t.Errorf("Expire answered %d rows deleted, want %d", n, gone)
	}
	if n, err := webhook.Expire(bg, pool, age); err != nil || n != 0 {
		t.Errorf("Expire again: %d deleted (%v), want none", n, err)
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
// holds every delivery finished within the age, and looks a deleted endpoint's
// deliveries up by their endpoint. (enable_seqscan off: an empty test table would be
// scanned anyway; a scan then shows only for want of an index.)
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
	stmts, args := webhook.ExpireStatements(30 * 24 * time.Hour)
	for _, stmt := range stmts {
		rows, err := tx.Query(bg, "EXPLAIN "+stmt, args...)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		// every read of the deliveries (or of one of their indexes) is bounded by a
		// condition on an index: a scan without one reads every delivery
		for i, line := range lines {
			if !strings.Contains(line, "Scan") || !strings.Contains(line, " on webhook_deliveries") || strings.Contains(line, "Bitmap Heap Scan") {
				continue
			}
			if strings.Contains(line, "Seq Scan") || i+1 == len(lines) || !strings.Contains(lines[i+1], "Index Cond:") {
				t.Errorf("%s\nreads the deliveries without an index's condition (%s):\n%s", stmt, strings.TrimSpace(line), strings.Join(lines, "\n"))
			}
		}
	}
}
