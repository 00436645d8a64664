package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/postgres/pgtest"
	"chessd/projections"
)

// An account whose name holds a NUL (PostgreSQL refuses it in text), appended below
// the HTTP layer between good events: the live projections set it and the plan change
// after it aside and go on; `rebuild` and `replay` do the same and say so; `verify`
// still passes; `setaside` lists, retries and skips, and records who did.
func TestSetAsideCommands(t *testing.T) {
	url := pgtest.URL(t)
	pool := pgtest.NewDBAt(t, url)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	store := eventstore.NewStore(pool, logger)
	h := commands.New(store, []byte("pepper-for-the-cli-test"))
	if _, err := h.Signup(ctx, domain.Signup{Email: "first@example.com"}, "req"); err != nil {
		t.Fatal(err)
	}
	evs, err := store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		return tx.Append(ctx, domain.AccountStream("acct_nul"), domain.StreamAccount, 0, eventstore.Metadata{RequestID: "test"},
			eventstore.New{Type: "AccountCreated", Payload: &domain.AccountCreated{AccountID: "acct_nul", Email: "nul@example.com",
				Name: "Nul\x00", Plan: "free", CreatedAt: time.Now().UTC()}})
	})
	if err != nil {
		t.Fatal(err)
	}
	bad := evs[0].Position
	if err := h.ChangePlan(ctx, "acct_nul", domain.PlanHobby, "test"); err != nil {
		t.Fatal(err)
	}
	last, err := h.Signup(ctx, domain.Signup{Email: "last@example.com"}, "req")
	if err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	go projections.NewRunner(pool, logger, allProjections()...).Run(ctx, ready) //nolint:errcheck // stops with ctx
	<-ready
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM accounts WHERE account_id = $1`, last.AccountID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the account signed up after the poisoned event never reached the read model")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cli := func(wantErr bool, want []string, args ...string) string {
		t.Helper()
		out, err := runCLI(t, url, args...)
		if (err != nil) != wantErr {
			t.Fatalf("chessd %s: error %v, want error: %v\n%s", strings.Join(args, " "), err, wantErr, out)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Fatalf("chessd %s: no %q in\n%s", strings.Join(args, " "), w, out)
			}
		}
		return out
	}
	list := cli(false, []string{"AccountCreated", "0x00", "PlanChanged", fmt.Sprintf("held: an earlier event of stream account-acct_nul (position %d)", bad)},
		"setaside", "list")
	id := strings.Fields(strings.Split(list, "\n")[1])[0]
	cli(false, []string{"rebuilt accounts_v1 from 6 events; 2 set aside (chessd setaside list)"}, "rebuild")
	cli(false, []string{"accounts_v1; 2 set aside", "equal   accounts: 2 rows", "replay: the read models and balances equal"}, "replay")
	cli(false, []string{"ok: 8 events"}, "verify")
	cli(true, []string{"still cannot be applied (1 held behind it)", "0x00"}, "setaside", "retry", id, "--by", "alice")
	if _, err := runCLI(t, url, "setaside", "skip", id); err == nil {
		t.Fatal("a skip without a reason was accepted")
	}
	cli(false, []string{"skipped", fmt.Sprintf("applied position %d, held behind it", bad+1)}, "setaside", "skip", id, "--reason", "test data", "--by", "alice")
	cli(false, []string{"no set-aside events"}, "setaside", "list")
	cli(false, []string{"skip by alice", "skipped (test data)", "retry by alice", "applied (held behind set-aside event " + id + ")"}, "setaside", "list", "--all")
	cli(false, []string{"rebuilt accounts_v1 from 7 events; 1 skipped by an operator"}, "rebuild")
	cli(false, []string{"ok: 8 events"}, "verify")
}
