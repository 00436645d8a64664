package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"chessd/postgres/pgtest"
)

// lockedBuffer collects a process's output while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A running `chessd worker` stops once a newer chessd has migrated its database, with
// an error that says so, rather than go on writing under the newer schema (servers
// step aside by /readyz; a worker has no readiness gate). Restarted, it refuses to run.
func TestOldWorkerStopsOnNewerSchema(t *testing.T) {
	bin := buildBinary(t)
	dbURL := pgtest.URL(t)
	var out lockedBuffer
	w := exec.Command(bin, "worker")
	w.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "LOG_LEVEL=info", "CHESSD_KEY_PEPPER=crash-test-pepper-0123456789",
		"CHESSD_ENGINE_POOL_SIZE=1", "CHESSD_WORKER_NAME=old", "CHESSD_DATA_DIR="+t.TempDir(), "CHESSD_SCHEMA_CHECK=100ms")
	w.Stdout, w.Stderr = &out, &out
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- w.Wait() }()
	t.Cleanup(func() { w.Process.Kill() }) //nolint:errcheck // already gone when the test passes

	deadline := time.After(60 * time.Second)
	for !strings.Contains(out.String(), "worker running") {
		select {
		case err := <-exited:
			t.Fatalf("the worker exited before running: %v\n%s", err, out.String())
		case <-deadline:
			t.Fatalf("the worker did not start:\n%s", out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO schema_migrations (name) VALUES ('9999_from_the_future.sql')`); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Fatalf("the worker ended with %v, want a failure\n%s", err, out.String())
		}
	case <-deadline:
		t.Fatalf("the worker still runs on a newer schema:\n%s", out.String())
	}
	if got := out.String(); !strings.Contains(got, "newer") || !strings.Contains(got, "9999_from_the_future.sql") {
		t.Fatalf("the worker's output does not say why it stopped:\n%s", got)
	}

	again := exec.Command(bin, "worker")
	again.Env = w.Env
	if msg, err := again.CombinedOutput(); err == nil || !strings.Contains(string(msg), "newer") {
		t.Fatalf("restarted on the newer schema: %v\n%s", err, msg)
	}
}
