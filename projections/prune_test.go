package projections_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/postgres/pgtest"
	"chessd/projections"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// Pruning deletes only what every consumer has acknowledged, and the projection goes
// on with the messages that come after.
func TestPruneBus(t *testing.T) {
	pool := pgtest.NewDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	h := commands.New(eventstore.NewStore(pool, logger), []byte("pepper-for-the-prune-test"))
	signup := func(i int) {
		if _, err := h.Signup(ctx, domain.Signup{Email: fmt.Sprintf("p%d@example.com", i)}, "req"); err != nil {
			t.Fatal(err)
		}
	}
	rows := func(q string) int {
		var n int
		if err := pool.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitAccounts := func(n int) {
		deadline := time.Now().Add(20 * time.Second)
		for rows(`SELECT count(*) FROM accounts`) != n {
			if time.Now().After(deadline) {
				t.Fatalf("the projection never reached %d accounts", n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for i := range 5 {
		signup(i)
	}
	// before any consumer subscribed, nothing may go
	if n, err := projections.PruneBus(ctx, pool, "accounts", 1); err != nil || n != 0 {
		t.Fatalf("pruned %d (%v) before the consumer existed", n, err)
	}
	ready := make(chan struct{})
	go projections.NewRunner(pool, logger, projections.Accounts{}).Run(ctx, ready) //nolint:errcheck // stops with ctx
	<-ready
	waitAccounts(5)
	// the fifth account does not mean the last message (its key's) is processed too:
	// wait until the consumer group has acknowledged every message
	deadline := time.Now().Add(20 * time.Second)
	for rows(`SELECT count(*) FROM watermill_accounts m WHERE NOT EXISTS (SELECT 1 FROM watermill_offsets_accounts o
		WHERE m.transaction_id < o.last_processed_transaction_id
			OR (m.transaction_id = o.last_processed_transaction_id AND m."offset" <= o.offset_acked))`) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the consumer group never acknowledged every message")
		}
		time.Sleep(10 * time.Millisecond)
	}
	n, err := projections.PruneBus(ctx, pool, "accounts", 1)
	if err != nil || n != 15 || rows(`SELECT count(*) FROM watermill_accounts`) != 0 {
		t.Fatalf("pruned %d (%v), %d messages left; want all 15 gone", n, err, rows(`SELECT count(*) FROM watermill_accounts`))
	}
	if n, _ := projections.PruneBus(ctx, pool, "accounts", 2); n != 0 {
		t.Fatal("pruned while a second expected consumer group is missing")
	}
	for i := 5; i < 8; i++ {
		signup(i)
	}
	waitAccounts(8)
	if rows(`SELECT count(*) FROM events`) != 24 {
		t.Fatal("the events table must keep everything")
	}
}
