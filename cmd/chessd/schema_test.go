package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"chessd/domain"
	"chessd/postgres/pgtest"
	"chessd/syncbuf"
	"chessd/webhook"
)

// A running `chessd worker` stops once a newer chessd has migrated its database, with
// an error that says so, rather than go on writing under the newer schema (servers
// step aside by /readyz; a worker has no readiness gate). Restarted, it refuses to run.
func TestOldWorkerStopsOnNewerSchema(t *testing.T) {
	bin := buildBinary(t)
	dbURL := pgtest.URL(t)
	w := exec.Command(bin, "worker")
	w.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "LOG_LEVEL=info", "CHESSD_KEY_PEPPER=crash-test-pepper-0123456789",
		"CHESSD_ENGINE_POOL_SIZE=1", "CHESSD_WORKER_NAME=old", "CHESSD_DATA_DIR="+t.TempDir(), "CHESSD_SCHEMA_CHECK=100ms")
	stderr, err := w.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Process.Kill() }) //nolint:errcheck // already gone when the test passes
	lines := make(chan string, 1024)
	go func() { // until the process closes its stderr: it exited
		for sc := bufio.NewScanner(stderr); sc.Scan(); {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var log []string
	deadline := time.After(60 * time.Second)
	waitFor := func(what string, done func(line string, open bool) bool) {
		t.Helper()
		for {
			select {
			case line, open := <-lines:
				if open {
					log = append(log, line)
				}
				if done(line, open) {
					return
				}
				if !open {
					t.Fatalf("the worker exited before %s:\n%s", what, strings.Join(log, "\n"))
				}
			case <-deadline:
				t.Fatalf("no %s within a minute:\n%s", what, strings.Join(log, "\n"))
			}
		}
	}
	waitFor("its start", func(line string, _ bool) bool { return strings.Contains(line, "worker running") })

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO schema_migrations (name) VALUES ('9999_from_the_future.sql')`); err != nil {
		t.Fatal(err)
	}
	waitFor("its exit on the newer schema", func(_ string, open bool) bool { return !open })
	var exit *exec.ExitError
	if err := w.Wait(); !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("the worker ended with %v, want a failure\n%s", err, strings.Join(log, "\n"))
	}
	if got := strings.Join(log, "\n"); !strings.Contains(got, "newer") || !strings.Contains(got, "9999_from_the_future.sql") {
		t.Fatalf("the worker's log does not say why it stopped:\n%s", got)
	}

	again := exec.Command(bin, "worker")
	again.Env = w.Env
	if msg, err := again.CombinedOutput(); err == nil || !strings.Contains(string(msg), "newer") {
		t.Fatalf("restarted on the newer schema: %v\n%s", err, msg)
	}
}

// A running `chessd serve` stops its mail and webhook senders, as its job executor,
// once a newer chessd has migrated its database: a newer release may change an outbox
// (0047 did: an older sender mailed its sealed bodies as the messages), so an older
// server leaves what is queued from then on to the newer servers.
func TestOldServerStopsOutboxesOnNewerSchema(t *testing.T) {
	bin := buildBinary(t)
	dbURL := pgtest.URL(t)
	port := freePort(t)
	var log syncbuf.Buffer
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, fmt.Sprintf("PORT=%d", port), "LOG_LEVEL=info",
		"CHESSD_KEY_PEPPER=crash-test-pepper-0123456789", "CHESSD_ENGINE_POOL_SIZE=1", "CHESSD_DATA_DIR="+t.TempDir(),
		"CHESSD_SCHEMA_CHECK=100ms", "CHESSD_WEBHOOKS_INSECURE=true")
	cmd.Stderr = &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	srv := &server{t: t, cmd: cmd, base: fmt.Sprintf("http://127.0.0.1:%d/v1", port)}
	checkTraffic(t, srv.base)
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck // may be dead already
	srv.waitReady(t)

	ctx := context.Background()
	pool, su := account(t, dbURL, "before@example.com", domain.PlanFree)
	var hooked atomic.Int32
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hooked.Add(1) }))
	t.Cleanup(receiver.Close)
	secrets, err := webhook.NewSecrets([]byte("crash-test-pepper-0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	ep, err := webhook.Create(ctx, pool, secrets, su.AccountID, domain.EnvLive.String(), receiver.URL, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	deliver := func() {
		t.Helper()
		if _, err := webhook.Enqueue(ctx, pool, su.AccountID, domain.EnvLive.String(), ep.ID, "test.event", map[string]any{}); err != nil {
			t.Fatal(err)
		}
	}
	deliver()
	pgtest.WaitFor(t, "the server to deliver a webhook", func() bool { return hooked.Load() == 1 })
	sent := func(to string) bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM mail_outbox WHERE to_email = $1 AND sent_at IS NOT NULL`, to).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	pgtest.WaitFor(t, "the server to send a message", func() bool { return sent("before@example.com") })

	if _, err := pool.Exec(ctx, `INSERT INTO schema_migrations (name) VALUES ('9999_from_the_future.sql')`); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, "the server to see the newer schema", func() bool {
		return strings.Contains(log.String(), "a newer chessd migrated the database")
	})
	account(t, dbURL, "after@example.com", domain.PlanFree) // its commit would wake a running sender at once
	deliver()
	time.Sleep(time.Second) // what a running sender takes well within
	if sent("after@example.com") {
		t.Fatalf("the server sent a message queued after a newer chessd migrated the database:\n%s", log.String())
	}
	if n := hooked.Load(); n != 1 {
		t.Fatalf("the server delivered %d webhooks, one after a newer chessd migrated the database:\n%s", n, log.String())
	}
	if !strings.Contains(log.String(), "mail sender, webhook sender and budget alerts stops") {
		t.Fatalf("the server's log does not say its senders stop:\n%s", log.String())
	}
}
