package engine

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Tests run the real engines installed by scripts/install-engines.sh (`make engines`).
// A missing engine fails the test that needs it, with that instruction: never a skip,
// so a machine without engines cannot pass by silence.

// required lists every executable the tests need, relative to the engines dir.
var required = []string{"sf-17.1/stockfish", "sf-17.1/stockfish-wasm", "sf-15.1/stockfish"}

// allEngines is every (version, path) the service can run.
var allEngines = []struct {
	id   string
	path Path
	name string // what the engine reports as "id name"
}{
	{"sf-17.1", PathNative, "Stockfish 17.1"},
	{"sf-17.1", PathWasm, "Stockfish 17.1 Lite WASM"},
	{"sf-15.1", PathNative, "Stockfish 15.1"},
}

var shared struct {
	once    sync.Once
	dir     string
	missing []string
	cat     *Catalog
	err     error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.cat != nil {
		_ = shared.cat.Close()
	}
	os.Exit(code)
}

// testLogger keeps test output quiet unless CHESSD_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("CHESSD_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// catalog returns the package's shared Catalog: every engine, a one-process pool
// each, started once for the whole test binary and closed in TestMain.
func catalog(t testing.TB) *Catalog {
	t.Helper()
	shared.once.Do(func() {
		shared.dir = DefaultDir()
		for _, rel := range required {
			if st, err := os.Stat(filepath.Join(shared.dir, rel)); err != nil || st.Mode()&0o111 == 0 {
				shared.missing = append(shared.missing, rel)
			}
		}
		if len(shared.missing) > 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		shared.cat, shared.err = Open(ctx, Config{
			Dir: shared.dir, PoolSize: 1, Eager: true,
			// Tests share these pools and may queue behind each other on 2 cores.
			QueueWait: 5 * time.Minute,
			Logger:    testLogger(),
		})
	})
	if len(shared.missing) > 0 {
		t.Fatalf("engines missing in %s: %v; run `make engines` (scripts/install-engines.sh)", shared.dir, shared.missing)
	}
	if shared.err != nil {
		t.Fatalf("opening engine catalog in %s: %v; run `make engines`", shared.dir, shared.err)
	}
	return shared.cat
}

// enginePath returns the executable for (id, path), failing if it is not installed.
func enginePath(t testing.TB, id string, path Path) string {
	t.Helper()
	catalog(t)
	file := "stockfish"
	if path == PathWasm {
		file = "stockfish-wasm"
	}
	return filepath.Join(shared.dir, id, file)
}

// newPool starts a private pool (for tests that kill, saturate or inspect processes)
// and closes it when the test ends.
func newPool(t testing.TB, id string, path Path, mod func(*PoolConfig)) *Pool {
	t.Helper()
	cfg := PoolConfig{Path: enginePath(t, id, path), Size: 1, QueueWait: time.Minute, Logger: testLogger()}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pl, err := NewPool(ctx, cfg)
	if err != nil {
		t.Fatalf("NewPool(%s): %v", cfg.Path, err)
	}
	t.Cleanup(func() {
		if err := pl.Close(); err != nil {
			t.Errorf("closing pool: %v", err)
		}
	})
	return pl
}

// search runs s on (id, path) through the shared catalog with a generous deadline.
func search(t testing.TB, id string, path Path, s Search) *Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := catalog(t).Search(ctx, id, path, Interactive, s)
	if err != nil {
		t.Fatalf("search %s/%s %+v: %v", id, path, s, err)
	}
	return res
}

// onlyProcess returns the single process of a size-1 pool, waiting for it to be idle
// and at rest: a process is idle as soon as its reset is sent, and the benchmarks time
// a search, not the hash's clearing before it. Nothing else may use the pool meanwhile.
func onlyProcess(t testing.TB, pl *Pool) *process {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		pl.mu.Lock()
		if len(pl.idle) == 1 && len(pl.all) == 1 {
			p := pl.idle[0]
			pl.mu.Unlock()
			if err := p.send("isready"); err != nil {
				t.Fatal(err)
			}
			if err := p.readUntil(context.Background(), "readyok", 30*time.Second, nil); err != nil {
				t.Fatal(err)
			}
			return p
		}
		pl.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("pool never became idle: %+v", pl.Stats())
	return nil
}

func engineLabel(id string, path Path) string { return fmt.Sprintf("%s/%s", id, path) }

// everyBuild is every engine build the service installs, for tests of what each must do.
var everyBuild = []struct {
	id   string
	path Path
}{{"sf-17.1", PathNative}, {"sf-17.1", PathWasm}, {"sf-15.1", PathNative}}
