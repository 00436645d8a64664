package main

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"chessd/postgres/pgtest"
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
