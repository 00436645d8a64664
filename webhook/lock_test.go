package webhook_test

import (
	"context"
	"fmt"
	"testing"

	"chessd/postgres/pgtest"
	"chessd/webhook"
)

// A budget alerts' transaction and a key recovery's DeleteAll do not deadlock.
// alerts.Check queues in one transaction, crossing after crossing in key order, so it
// may queue to an account's test endpoints and then to its live ones; each Enqueue
// holds its endpoints' rows (FOR SHARE). DeleteAll marks every env's endpoints deleted,
// live ones first here. Taking rows alone, the recovery held the live rows and waited
// for the test ones, the alerts held the test ones and asked for the live ones, and
// PostgreSQL aborted one of them (40P01). Enqueue takes the account's endpoints lock
// shared before any row, DeleteAll exclusive: the recovery waits for the alerts'
// transaction before it takes a row.
func TestAlertsAndDeleteAllDoNotDeadlock(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	secrets := testSecrets(t)
	account := fmt.Sprintf("acct_%d", accounts.Add(1))
	var ids []string
	for _, env := range []string{"live", "live", "test", "test"} {
		e, err := webhook.Create(ctx, pool, secrets, account, env, "http://127.0.0.1:9/hooks", true, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, e.ID)
	}
	alerts, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer alerts.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := webhook.Enqueue(ctx, alerts, account, "test", "", "budget.threshold", map[string]int{"n": 1}); err != nil {
		t.Fatal(err)
	}
	recovered := make(chan error, 1)
	go func() {
		tx, err := pool.Begin(ctx)
		if err != nil {
			recovered <- err
			return
		}
		defer tx.Rollback(ctx) //nolint:errcheck // committed when DeleteAll is done
		if _, err := webhook.DeleteAll(ctx, tx, account); err != nil {
			recovered <- err
			return
		}
		recovered <- tx.Commit(ctx)
	}()
	pgtest.WaitFor(t, "the recovery to wait for the alerts", func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND datname = current_database())`).Scan(&waiting)
		return err == nil && waiting
	})
	if _, err := webhook.Enqueue(ctx, alerts, account, "live", "", "budget.threshold", map[string]int{"n": 2}); err != nil {
		t.Fatalf("the alerts' second queueing: %v", err)
	}
	if err := alerts.Commit(ctx); err != nil {
		t.Fatalf("the alerts' commit: %v", err)
	}
	if err := <-recovered; err != nil {
		t.Fatalf("the recovery: %v", err)
	}
	// the recovery came second: it ended what the alerts queued
	if n := count(t, pool, "last_error = 'endpoint deleted'", ids...); n != len(ids) {
		t.Errorf("%d deliveries ended by the recovery, want the %d the alerts queued", n, len(ids))
	}
}
