// Package postgres connects to PostgreSQL, applies the embedded migrations and, when no
// server is given, runs a private cluster in a project-local directory.
package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"chessd/procenv"
)

// Cluster is a PostgreSQL server this process started (or found running) in Dir.
// The server listens only on a unix socket inside Dir, so nothing else can reach it.
type Cluster struct {
	Dir  string // data directory; the socket lives here too
	Port int
	// Fast turns off fsync: for throw-away test clusters only.
	Fast bool
	// Settings are more server settings, "name=value" each (the benchmark's
	// shared_preload_libraries=pg_stat_statements).
	Settings []string

	bin    string
	runAs  *user.User // set when running as root: initdb refuses root
	logger *slog.Logger
	share  *os.File // held with a shared flock while this process uses the cluster
}

// NewCluster describes a cluster in dir on port; nothing is started yet.
func NewCluster(dir string, port int, logger *slog.Logger) (*Cluster, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	bin, err := findBinDir()
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: abs, Port: port, bin: bin, logger: logger}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root needs the postgres system user for initdb: %w", err)
		}
		c.runAs = u
	}
	return c, nil
}

// findBinDir locates initdb and pg_ctl: PG_BIN wins, then Debian's versioned directories
// (newest first), then PATH.
func findBinDir() (string, error) {
	if dir := os.Getenv("PG_BIN"); dir != "" {
		return dir, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("PostgreSQL server binaries not found (install postgresql or set PG_BIN)")
}

func pgMajor(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// URL is the connection string for database db on this cluster.
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d&sslmode=disable", db, c.Dir, c.Port)
}

// Start initialises the data directory if it is new and starts the server, unless one is
// already running there. started says whether this call started it.
func (c *Cluster) Start(ctx context.Context) (started bool, err error) {
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return false, err
	}
	if err := c.chown(c.Dir); err != nil {
		return false, err
	}
	if _, err := os.Stat(filepath.Join(c.Dir, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		c.logger.Info("initialising PostgreSQL cluster", "dir", c.Dir)
		args := []string{"-D", c.Dir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"}
		if c.Fast {
			args = append(args, "--no-sync")
		}
		if err := c.run(ctx, "initdb", args...); err != nil {
			return false, err
		}
	}
	if c.running(ctx) {
		c.logger.Info("PostgreSQL already running", "dir", c.Dir)
		return false, nil
	}
	opts := fmt.Sprintf("-c listen_addresses='' -k %s -p %d -c max_connections=200", c.Dir, c.Port)
	for _, kv := range c.Settings {
		opts += " -c " + kv
	}
	if c.Fast {
		opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
	}
	logFile := filepath.Join(c.Dir, "server.log")
	if err := c.run(ctx, "pg_ctl", "-D", c.Dir, "-l", logFile, "-w", "-t", "60", "-o", opts, "start"); err != nil {
		return false, fmt.Errorf("%w (see %s)", err, logFile)
	}
	c.logger.Info("PostgreSQL started", "dir", c.Dir, "port", c.Port)
	return true, nil
}

// Stop shuts the server down, letting running transactions finish or roll back.
func (c *Cluster) Stop(ctx context.Context) error {
	if !c.running(ctx) {
		return nil
	}
	err := c.run(ctx, "pg_ctl", "-D", c.Dir, "-w", "-t", "60", "-m", "fast", "stop")
	if err == nil {
		c.logger.Info("PostgreSQL stopped", "dir", c.Dir)
	}
	return err
}

func (c *Cluster) running(ctx context.Context) bool {
	return c.run(ctx, "pg_ctl", "-D", c.Dir, "status") == nil
}

// Watchdog stops the cluster and removes removeDir once this process has ended, however
// it ends (a panic, SIGKILL, SIGPIPE from a closed pipe): for throw-away clusters of
// tests and benchmarks, which must never outlive the program that made them.
func (c *Cluster) Watchdog(removeDir string) {
	script := fmt.Sprintf(`while kill -0 %d 2>/dev/null; do sleep 1; done
pid=$(head -n 1 %q/postmaster.pid 2>/dev/null) && kill -INT "$pid" 2>/dev/null
sleep 2; rm -rf %q`, os.Getpid(), c.Dir, removeDir)
	cmd := exec.Command("sh", "-c", script)
	cmd.Env = procenv.Environ()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // not killed with our process group
	if err := cmd.Start(); err == nil {
		go cmd.Wait() //nolint:errcheck // reaped if we outlive it
	}
}

// Running reports whether a server runs in Dir.
func (c *Cluster) Running(ctx context.Context) bool { return c.running(ctx) }

// Share registers this process as a user of the cluster: a shared flock on Dir+".lock".
// The kernel drops it when the process ends, however it ends, so the lock counts the
// live users: a cluster left running by a server that was killed has none, and the next
// server adopts it (StopIfLast stops it when that one leaves). Call before Start.
func (c *Cluster) Share() error {
	if err := os.MkdirAll(filepath.Dir(c.Dir), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(c.Dir+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("open the cluster's lock: %w", err)
	}
	// Blocks while a last user is stopping the cluster (it holds the lock exclusively);
	// Start then starts it again.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
		f.Close()
		return fmt.Errorf("lock the cluster: %w", err)
	}
	c.share = f
	return nil
}

// StopIfLast stops the cluster when no other live process shares it, and says whether
// it did. Without Share it does nothing: the cluster is someone else's.
func (c *Cluster) StopIfLast(ctx context.Context) (bool, error) {
	if c.share == nil {
		return false, nil
	}
	defer func() { c.share.Close(); c.share = nil }()
	if err := syscall.Flock(int(c.share.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return false, nil // another server still uses it
		}
		return false, fmt.Errorf("lock the cluster: %w", err)
	}
	return true, c.Stop(ctx)
}

func (c *Cluster) run(ctx context.Context, tool string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, tool), args...)
	cmd.Dir = c.Dir // the postgres user may not be allowed into the caller's cwd
	// A terminal's Ctrl-C must reach us, not the server: we stop it ourselves.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = procenv.Environ() // the server outlives us: none of our secrets
	if c.runAs != nil {
		uid, _ := strconv.Atoi(c.runAs.Uid)
		gid, _ := strconv.Atoi(c.runAs.Gid)
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		cmd.Env = append(cmd.Env, "HOME="+c.runAs.HomeDir, "USER=postgres", "LOGNAME=postgres")
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", tool, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// chown hands dir to the postgres user when we run as root, and makes sure that user can
// reach it through its parents.
func (c *Cluster) chown(dir string) error {
	if c.runAs == nil {
		return nil
	}
	uid, _ := strconv.Atoi(c.runAs.Uid)
	gid, _ := strconv.Atoi(c.runAs.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return err
	}
	for p := filepath.Dir(dir); p != "/"; p = filepath.Dir(p) {
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		if st.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(p, st.Mode().Perm()|0o001); err != nil {
				return fmt.Errorf("postgres user cannot reach %s: %w", dir, err)
			}
		}
	}
	return nil
}

// WaitReady polls until the server accepts connections or ctx ends.
func WaitReady(ctx context.Context, ping func(context.Context) error) error {
	for {
		err := ping(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("PostgreSQL not ready: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
