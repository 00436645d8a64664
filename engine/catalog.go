package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Path is how an engine version is executed.
type Path string

const (
	PathNative Path = "native" // a native binary: <dir>/<id>/stockfish
	PathWasm   Path = "wasm"   // WebAssembly under Node: <dir>/<id>/stockfish-wasm (launcher)
	PathAuto   Path = "auto"   // native when installed, else wasm
)

// Latest is the version id that resolves to the newest installed version.
const Latest = "latest"

// executables maps each concrete path to its file name inside a version directory.
var executables = []struct {
	path Path
	file string
}{
	{PathNative, "stockfish"},
	{PathWasm, "stockfish-wasm"},
}

// Config configures a Catalog. Zero values take the defaults noted.
type Config struct {
	// Dir holds one directory per version, named "sf-<version>" (see docs/ENGINES.md).
	// Default: DefaultDir().
	Dir string
	// PoolSize is the number of processes in each pool; default runtime.NumCPU().
	PoolSize     int
	QueueWait    time.Duration // default 2 s
	StopGrace    time.Duration // default 1 s
	HangTimeout  time.Duration // default 60 s
	StartTimeout time.Duration // default 30 s
	MaxHashMB    int           // cap on a request's Hash (MiB); default 256, <0: the engine's own max
	MaxThreads   int           // default 1
	Boost        int           // nice levels ahead of the server (PoolConfig.Boost); default 5, <0: none
	// Eager starts every pool at Open instead of only the default one (latest, auto).
	Eager  bool
	Logger *slog.Logger
}

// DefaultDir is $CHESSD_ENGINES_DIR, else $HOME/.cache/chessd/engines (where
// scripts/install-engines.sh installs).
func DefaultDir() string {
	if d := os.Getenv("CHESSD_ENGINES_DIR"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "chessd", "engines")
}

// VersionInfo describes one installed engine version for GET /engines.
type VersionInfo struct {
	ID      string     `json:"id"`      // "sf-17.1"
	Version string     `json:"version"` // "17.1"
	Name    string     `json:"name"`    // "id name" of the default path, e.g. "Stockfish 17.1"
	NNUE    []string   `json:"nnue"`    // default net files of the default path
	Paths   []PathInfo `json:"paths"`   // installed paths, native first
}

// PathInfo describes one way of running a version, from its own handshake.
type PathInfo struct {
	Path    Path     `json:"path"`
	Name    string   `json:"name"` // "Stockfish 17.1 Lite WASM" for the wasm build
	Author  string   `json:"author"`
	NNUE    []string `json:"nnue"` // EvalFile / EvalFileSmall defaults
	Options []Option `json:"options"`
	exe     string
}

// Catalog knows the installed engines and owns one pool per (version, path). The
// default pool (latest, auto) starts in Open; the others start on first use (or in Open
// with Config.Eager), so an unused wasm path costs nothing.
type Catalog struct {
	cfg      Config
	log      *slog.Logger
	versions []VersionInfo // newest first

	mu     sync.Mutex
	pools  map[poolKey]*poolEntry
	closed bool
}

type poolKey struct {
	id   string
	path Path
}

type poolEntry struct {
	ready chan struct{} // closed when pool/err are set
	pool  *Pool
	err   error
}

// Open discovers the engines under cfg.Dir, checks each answers the UCI handshake
// (which also yields names and option lists), and starts the default pool. It fails
// when nothing usable is installed, naming `make engines`, and with ctx's error when ctx
// ends first.
func Open(ctx context.Context, cfg Config) (*Catalog, error) {
	if cfg.Dir == "" {
		cfg.Dir = DefaultDir()
	}
	if cfg.PoolSize <= 0 {
		cfg.PoolSize = runtime.NumCPU()
	}
	if cfg.MaxHashMB == 0 {
		cfg.MaxHashMB = defaultMaxHashMB
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Catalog{cfg: cfg, log: cfg.Logger, pools: make(map[poolKey]*poolEntry)}
	if err := c.discover(ctx); err != nil {
		return nil, err
	}
	keys := []poolKey{}
	if cfg.Eager {
		for _, v := range c.versions {
			for _, p := range v.Paths {
				keys = append(keys, poolKey{v.ID, p.Path})
			}
		}
	} else {
		id, path, err := c.Resolve(Latest, PathAuto)
		if err != nil {
			return nil, err
		}
		keys = append(keys, poolKey{id, path})
	}
	for _, k := range keys {
		if _, err := c.pool(ctx, k); err != nil {
			_ = c.Close()
			return nil, err
		}
	}
	return c, nil
}

// discover lists sf-* directories and probes each executable with a handshake.
func (c *Catalog) discover(ctx context.Context) error {
	entries, err := os.ReadDir(c.cfg.Dir)
	if err != nil {
		return fmt.Errorf("%w: engines dir %s: %v (run `make engines`)", ErrUnknownEngine, c.cfg.Dir, err)
	}
	type probe struct {
		vi  int
		pi  PathInfo
		err error
	}
	var probes []*probe
	for _, e := range entries {
		name := e.Name()
		ver, ok := strings.CutPrefix(name, "sf-")
		if !ok || !e.IsDir() || versionKey(ver) == nil {
			continue
		}
		v := VersionInfo{ID: name, Version: ver}
		for _, x := range executables {
			exe := filepath.Join(c.cfg.Dir, name, x.file)
			if st, err := os.Stat(exe); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
				v.Paths = append(v.Paths, PathInfo{Path: x.path, exe: exe})
			}
		}
		if len(v.Paths) > 0 {
			c.versions = append(c.versions, v)
		}
	}
	for i := range c.versions {
		for _, p := range c.versions[i].Paths {
			probes = append(probes, &probe{vi: i, pi: p})
		}
	}
	var wg sync.WaitGroup
	for _, pr := range probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pc := &procConfig{path: pr.pi.exe, startTimeout: cmp.Or(c.cfg.StartTimeout, 30*time.Second),
				stopGrace: time.Second, hangTimeout: time.Minute, log: c.log}
			p, err := startProcess(ctx, pc)
			if err != nil {
				pr.err = err
				return
			}
			p.quit(time.Second)
			pr.pi.Name, pr.pi.Author, pr.pi.Options = p.ident.Name, p.ident.Author, p.ident.Options
			pr.pi.NNUE = p.ident.NNUE()
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err // the probes were cut short (a stop during startup): no verdict on the engines
	}
	// Rebuild each version's path list from the probes that answered; a broken
	// executable is logged and left out rather than taking the service down.
	for i := range c.versions {
		c.versions[i].Paths = nil
	}
	for _, pr := range probes {
		if pr.err != nil {
			c.log.Error("engine does not answer uci; ignored", "exe", pr.pi.exe, "err", pr.err)
			continue
		}
		v := &c.versions[pr.vi]
		v.Paths = append(v.Paths, pr.pi)
	}
	c.versions = slices.DeleteFunc(c.versions, func(v VersionInfo) bool { return len(v.Paths) == 0 })
	for i := range c.versions {
		v := &c.versions[i]
		slices.SortFunc(v.Paths, func(a, b PathInfo) int { return cmp.Compare(pathOrder(a.Path), pathOrder(b.Path)) })
		v.Name, v.NNUE = v.Paths[0].Name, v.Paths[0].NNUE
	}
	slices.SortFunc(c.versions, func(a, b VersionInfo) int {
		return -slices.Compare(versionKey(a.Version), versionKey(b.Version))
	})
	if len(c.versions) == 0 {
		return fmt.Errorf("%w: no working engine in %s (run `make engines`)", ErrUnknownEngine, c.cfg.Dir)
	}
	return nil
}

func pathOrder(p Path) int {
	if p == PathNative {
		return 0
	}
	return 1
}

// versionKey turns "17.1" into [17 1] for ordering; nil if it is not a dotted number.
func versionKey(v string) []int {
	var k []int
	for _, part := range strings.Split(v, ".") {
		n, err := strconv.Atoi(part)
		if err != nil || n < 0 {
			return nil
		}
		k = append(k, n)
	}
	return k
}

// Versions returns the installed versions, newest first. The slice is shared: do not
// modify it.
func (c *Catalog) Versions() []VersionInfo { return c.versions }

// MaxHashMB is the cap on a request's Hash (MiB) that every pool of the catalog
// enforces (Config.MaxHashMB, the operator's CHESSD_ENGINE_MAX_HASH_MB; 256 by default);
// <0: none beyond the engine's own maximum. Request validation and GET /engines' option
// schema read it here, so that they refuse and advertise what the pools enforce.
func (c *Catalog) MaxHashMB() int { return c.cfg.MaxHashMB }

// Default is the id "latest" resolves to.
func (c *Catalog) Default() string { return c.versions[0].ID }

// Resolve turns a request's engine ("" or "latest" or an id) and path ("" or "auto",
// "native", "wasm") into an installed (id, concrete path), or ErrUnknownEngine.
func (c *Catalog) Resolve(version string, path Path) (string, Path, error) {
	var v *VersionInfo
	if version == "" || version == Latest {
		v = &c.versions[0]
	} else {
		for i := range c.versions {
			if c.versions[i].ID == version {
				v = &c.versions[i]
				break
			}
		}
	}
	if v == nil {
		return "", "", fmt.Errorf("%w: version %q is not installed", ErrUnknownEngine, version)
	}
	if path == "" || path == PathAuto {
		return v.ID, v.Paths[0].Path, nil // native sorts first
	}
	for _, p := range v.Paths {
		if p.Path == path {
			return v.ID, path, nil
		}
	}
	return "", "", fmt.Errorf("%w: %s has no %q path installed", ErrUnknownEngine, v.ID, path)
}

// Pool returns the pool for (version, path), starting it on first use.
func (c *Catalog) Pool(ctx context.Context, version string, path Path) (*Pool, error) {
	id, p, err := c.Resolve(version, path)
	if err != nil {
		return nil, err
	}
	return c.pool(ctx, poolKey{id, p})
}

func (c *Catalog) pool(ctx context.Context, k poolKey) (*Pool, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	e, ok := c.pools[k]
	if !ok {
		e = &poolEntry{ready: make(chan struct{})}
		c.pools[k] = e
		c.mu.Unlock()
		// Start outside the lock; concurrent first users wait on ready. The start is
		// not tied to the first caller's ctx (it serves everyone after it).
		e.pool, e.err = NewPool(context.WithoutCancel(ctx), c.poolConfig(k))
		if e.err != nil {
			c.log.Error("engine pool failed to start", "engine", k.id, "path", k.path, "err", e.err)
			c.mu.Lock()
			delete(c.pools, k) // let a later call retry
			c.mu.Unlock()
		} else {
			c.log.Info("engine pool started", "engine", k.id, "path", k.path, "size", e.pool.Size())
		}
		close(e.ready)
	} else {
		c.mu.Unlock()
	}
	select {
	case <-e.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if e.err != nil {
		return nil, fmt.Errorf("%w: starting %s/%s: %v", ErrEngineFailed, k.id, k.path, e.err)
	}
	// Close may have run while the pool started: do not hand out a pool nobody closes.
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		_ = e.pool.Close()
		return nil, ErrClosed
	}
	return e.pool, nil
}

func (c *Catalog) poolConfig(k poolKey) PoolConfig {
	var exe string
	for _, v := range c.versions {
		if v.ID == k.id {
			for _, p := range v.Paths {
				if p.Path == k.path {
					exe = p.exe
				}
			}
		}
	}
	return PoolConfig{
		Path: exe, Size: c.cfg.PoolSize,
		QueueWait: c.cfg.QueueWait, StopGrace: c.cfg.StopGrace,
		HangTimeout: c.cfg.HangTimeout, StartTimeout: c.cfg.StartTimeout,
		MaxHashMB: c.cfg.MaxHashMB, MaxThreads: c.cfg.MaxThreads, Boost: c.cfg.Boost,
		Logger: c.log.With("engine_id", k.id, "engine_path", string(k.path)),
	}
}

// Search resolves (version, path), takes that pool (starting it if needed) and runs s.
// The result names the engine and path that answered.
func (c *Catalog) Search(ctx context.Context, version string, path Path, prio Priority, s Search) (*Result, error) {
	id, p, err := c.Resolve(version, path)
	if err != nil {
		return nil, err
	}
	pl, err := c.pool(ctx, poolKey{id, p})
	if err != nil {
		return nil, err
	}
	res, err := pl.Search(ctx, prio, s)
	if err != nil {
		return nil, err
	}
	res.Engine, res.Path = id, p
	return res, nil
}

// Close closes every pool (quit, reap). Safe to call more than once.
func (c *Catalog) Close() error {
	c.mu.Lock()
	c.closed = true
	entries := make([]*poolEntry, 0, len(c.pools))
	for _, e := range c.pools {
		entries = append(entries, e)
	}
	c.pools = map[poolKey]*poolEntry{}
	c.mu.Unlock()
	var errs []error
	for _, e := range entries {
		<-e.ready
		if e.pool != nil {
			errs = append(errs, e.pool.Close())
		}
	}
	return errors.Join(errs...)
}
