package projections_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/postgres/pgtest"
	"chessd/projections"
)

// A subscriber that has caught up waits for the commit's notification, not for its
// next poll: with polling put off for an hour, every new account still reaches the
// read model.
func TestProjectionFollowsNotifications(t *testing.T) {
	pool := pgtest.NewDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	h := commands.New(eventstore.NewStore(pool, logger), []byte("pepper-for-the-wakeup-test"))
	r := projections.NewRunner(pool, logger, projections.Accounts{})
	r.Waiting = eventstore.Waiting{Idle: time.Hour, Poll: time.Hour, Retry: time.Second}
	ready := make(chan struct{})
	go r.Run(ctx, ready) //nolint:errcheck // stops with ctx
	<-ready
	for i := range 3 {
		// let the subscriber reach its wait first, so only a notification can end it:
		// notifications are listened for, and no session is in a query or transaction
		waitQuiet(t, pool)
		if _, err := h.Signup(ctx, domain.Signup{Email: fmt.Sprintf("w%d@example.com", i)}, "req"); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM accounts`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == i+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("account %d never reached the read model (%d there)", i+1, n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// waitQuiet waits until the bus's notifications are listened for and no other session
// of the database is running a statement or holding a transaction open.
func waitQuiet(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var quiet bool
		err := pool.QueryRow(context.Background(), `SELECT
			EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND position('LISTEN ' || $1 IN query) > 0)
			AND NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database()
				AND backend_type = 'client backend' AND pid <> pg_backend_pid() AND state <> 'idle')`, eventstore.NotifyChannel).Scan(&quiet)
		if err != nil {
			t.Fatal(err)
		}
		if quiet {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the subscriber never went quiet")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
