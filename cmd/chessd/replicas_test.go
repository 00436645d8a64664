package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"chessd/commands"
	"chessd/postgres"
	"chessd/postgres/pgtest"
)

// A server whose pepper differs from the one the database's keys were hashed under
// would answer 401 to every valid key: it refuses to start and says why.
func TestServerWithAnotherPepperRefusesToStart(t *testing.T) {
	bin := buildBinary(t)
	url := pgtest.URL(t)
	first := startServer(t, bin, url, freePort(t))
	first.signupOK(t, "pepper@example.com")

	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+url, fmt.Sprintf("PORT=%d", freePort(t)), "LOG_LEVEL=error",
		"CHESSD_KEY_PEPPER=another-pepper-0123456789", "CHESSD_ENGINE_POOL_SIZE=1", "CHESSD_DATA_DIR="+t.TempDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Fatalf("the server with another pepper exited with %v", err)
		}
		if !strings.Contains(stderr.String(), "CHESSD_KEY_PEPPER differs") {
			t.Fatalf("it did not say why: %q", stderr.String())
		}
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill() //nolint:errcheck // failing anyway
		t.Fatal("the server with another pepper started")
	}
	// the same pepper is welcome
	startServer(t, bin, url, freePort(t)).signupOK(t, "pepper2@example.com")
}

func TestClaimPepper(t *testing.T) {
	pool := pgtest.NewDB(t)
	ctx := context.Background()
	for _, tc := range []struct {
		pepper string
		ok     bool
	}{{"first-pepper-0123456789", true}, {"first-pepper-0123456789", true}, {"other-pepper-0123456789", false}} {
		err := commands.ClaimPepper(ctx, pool, []byte(tc.pepper))
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, commands.ErrPepperMismatch)) {
			t.Fatalf("claim %s: %v, want ok=%v", tc.pepper, err, tc.ok)
		}
	}
}

// The embedded cluster is shared by the servers of one data directory: one that is
// killed leaves it running and the next adopts it; the last one to stop stops it.
func TestEmbeddedClusterIsAdoptedAndStoppedByTheLastServer(t *testing.T) {
	bin := buildBinary(t)
	data := t.TempDir()
	cluster, err := postgres.NewCluster(filepath.Join(data, "pg"), 0, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cluster.Stop(context.Background()) }) //nolint:errcheck // whatever the test left
	ctx := context.Background()

	first := startEmbedded(t, bin, data)
	first.signupOK(t, "embedded1@example.com")
	first.cmd.Process.Kill() //nolint:errcheck // the crash under test
	first.cmd.Wait()         //nolint:errcheck // killed
	if !cluster.Running(ctx) {
		t.Fatal("the cluster stopped with the killed server")
	}

	second := startEmbedded(t, bin, data) // adopts the cluster left running
	third := startEmbedded(t, bin, data)
	second.signupOK(t, "embedded2@example.com")
	third.stop(t)
	if !cluster.Running(ctx) {
		t.Fatal("a server stopped the cluster while another still used it")
	}
	second.signupOK(t, "embedded3@example.com")
	second.stop(t)
	if cluster.Running(ctx) {
		t.Fatal("the last server left the cluster running")
	}
}

// startEmbedded runs `chessd serve` with no DATABASE_URL over the data directory.
func startEmbedded(t *testing.T, bin, data string) *server {
	t.Helper()
	port := freePort(t)
	cmd := exec.Command(bin, "serve")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, fmt.Sprintf("PORT=%d", port), "LOG_LEVEL=error", "CHESSD_KEY_PEPPER=embedded-test-pepper-0123456789",
		"CHESSD_ENGINE_POOL_SIZE=1", "CHESSD_DATA_DIR="+data, "CHESSD_PG_PORT=54391")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, cmd: cmd, base: fmt.Sprintf("http://127.0.0.1:%d/v1", port)}
	checkTraffic(t, s.base)
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck // may be dead already
	s.waitReady(t)
	return s
}

func (s *server) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		res, err := http.Get(s.base + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("server did not become ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop ends the server with SIGTERM and waits for it.
func (s *server) stop(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Wait(); err != nil {
		t.Fatalf("server exit: %v", err)
	}
}

func (s *server) signupOK(t *testing.T, email string) {
	t.Helper()
	res, err := http.Post(s.base+"/signup", "application/json", strings.NewReader(`{"email":"`+email+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 201 {
		t.Fatalf("signup: %d", res.StatusCode)
	}
}
