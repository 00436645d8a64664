// Package pgtest gives tests a real PostgreSQL: one server per test binary (a private
// throw-away cluster, or the server of DATABASE_URL when set) and a fresh, migrated
// database per call of NewDB.
package pgtest

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/postgres"
)

var (
	mu       sync.Mutex
	adminURL string // a URL of the server's maintenance database
	template string // migrated template database name
	cluster  *postgres.Cluster
	counter  atomic.Int64
)

// Main runs the package's tests with a server available and stops a private cluster
// afterwards. Use it as: func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }.
func Main(m *testing.M) int {
	code := m.Run()
	mu.Lock()
	defer mu.Unlock()
	if cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := cluster.Stop(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: stop cluster:", err)
		}
		os.RemoveAll(cluster.Dir)
	}
	return code
}

func logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// server starts (once) the server and the migrated template database.
func server(tb testing.TB) (string, string) {
	mu.Lock()
	defer mu.Unlock()
	if template != "" {
		return adminURL, template
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if u := os.Getenv("DATABASE_URL"); u != "" {
		adminURL = u
	} else {
		dir, err := os.MkdirTemp("", "chessd-pgtest-")
		if err != nil {
			tb.Fatal(err)
		}
		c, err := postgres.NewCluster(dir, 20000+os.Getpid()%20000, logger())
		if err != nil {
			tb.Fatal(err)
		}
		c.Fast = true
		c.Settings = []string{postgres.StatementsSetting} // for postgres.TopStatements' test
		if _, err := c.Start(ctx); err != nil {
			tb.Fatalf("start test PostgreSQL: %v", err)
		}
		cluster = c
		// a test timeout panics straight out of the process, past Main's cleanup
		c.Watchdog(dir)
		adminURL = c.URL("postgres")
	}
	name := fmt.Sprintf("chessd_tmpl_%d_%d", os.Getpid(), time.Now().UnixNano()%1_000_000)
	if err := postgres.CreateDatabase(ctx, adminURL, name); err != nil {
		tb.Fatalf("create template database: %v", err)
	}
	pool, err := postgres.Open(ctx, withDB(tb, adminURL, name), 2)
	if err != nil {
		tb.Fatal(err)
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool, logger()); err != nil {
		tb.Fatalf("migrate template: %v", err)
	}
	template = name
	return adminURL, template
}

// URL creates a fresh migrated database and returns its connection string. The database
// is dropped when the test ends.
func URL(tb testing.TB) string {
	tb.Helper()
	admin, tmpl := server(tb)
	name := fmt.Sprintf("chessd_test_%d_%d", os.Getpid(), counter.Add(1))
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, tmpl)); err != nil {
		tb.Fatalf("create test database: %v", err)
	}
	tb.Cleanup(func() {
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)") //nolint:errcheck // best effort
	})
	return withDB(tb, admin, name)
}

// NewDB returns a pool on a fresh migrated database, closed when the test ends.
func NewDB(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	return NewDBAt(tb, URL(tb))
}

// NewDBAt returns a pool on the database at url, closed when the test ends.
func NewDBAt(tb testing.TB, url string) *pgxpool.Pool {
	tb.Helper()
	pool, err := postgres.Open(context.Background(), url, 20)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

func withDB(tb testing.TB, raw, db string) string {
	u, err := url.Parse(raw)
	if err != nil {
		tb.Fatalf("bad database URL: %v", err)
	}
	u.Path = "/" + db
	return u.String()
}

// Within waits for a value from c, failing the test after 30 s (as WaitFor).
func Within[T any](t testing.TB, what string, c <-chan T) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// WaitFor polls cond until it holds, failing the test after 30 s: the tests wait for
// conditions (a projection caught up, a row written by another process), not sleeps.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
