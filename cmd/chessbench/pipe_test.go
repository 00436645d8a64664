package main

import (
	"bufio"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// `make bench | head -1`: chessbench is killed by SIGPIPE at its next write, past every
// deferred cleanup; its PostgreSQL cluster must still not outlive it.
func TestClosedPipeLeavesNoCluster(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "chessbench")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-parts", "paired", "-depths", "1", "-pairs", "2")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() }) //nolint:errcheck // dead by then
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("no output: %v", err)
	}
	clusters := runningClusters(t)
	if len(clusters) == 0 {
		t.Fatalf("no chessbench cluster running after its first line %q", line)
	}
	stdout.Close() // as head does after one line
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGPIPE {
		t.Fatalf("chessbench ended with %v, not by SIGPIPE", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for left := runningClusters(t); len(left) > 0; left = runningClusters(t) {
		if time.Now().After(deadline) {
			t.Fatalf("PostgreSQL still running after chessbench died: %v", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runningClusters lists the postmasters whose data directory is a chessbench one.
func runningClusters(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("ps", "-eo", "args").Output()
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "postgres") && strings.Contains(l, "-D") && strings.Contains(l, "chessbench-") {
			found = append(found, l)
		}
	}
	return found
}
