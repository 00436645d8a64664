package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/analysis"
	"chessd/auth"
	"chessd/commands"
	"chessd/domain"
	"chessd/engine"
	"chessd/eventstore"
	"chessd/executor"
	"chessd/httpapi"
	"chessd/ledger"
	"chessd/postgres"
	"chessd/projections"
)

var pepper = []byte("bench-pepper-0123456789")

// bench is the run's database, engines and first server (url, svc, pool); replicas
// holds every server started, the first one included.
type bench struct {
	url      string
	key      string
	binary   string
	engineID string
	catalog  *engine.Catalog
	cluster  *postgres.Cluster
	dir      string
	svc      *analysis.Service
	client   *http.Client
	pool     *pgxpool.Pool
	cmds     *commands.Handler
	exec     *executor.Executor // the first worker, beside the first server
	logger   *slog.Logger
	replicas []*replica
	wake     *eventstore.Wakeups // the bench's own listener (jobs' progress)
	trivial  []string            // base URLs of the trivial handlers (load.go)
	raw      []*rawEngine        // the jobs part's raw processes, kept from run to run (closeRaw)
	closers  []func()
	// ctx is the servers' and workers' background work (projections, the executors, the
	// meters' settlers, the listeners); stop ends it and background waits for it: close
	// stops them before the cluster, so that none logs the database going away
	ctx        context.Context
	stop       context.CancelFunc
	background sync.WaitGroup
}

// replica is one `serve` as the bench runs it: its own connection pool, event store,
// meter, authenticator and analysis service (with its own cache in front of the shared
// eval_cache table) on its own port; the engine catalog is shared.
type replica struct {
	url   string
	svc   *analysis.Service
	meter *ledger.Meter
	cmds  *commands.Handler
}

func start(ctx context.Context, logger *slog.Logger) (*bench, error) {
	dir, err := os.MkdirTemp("", "chessbench-")
	if err != nil {
		return nil, err
	}
	b := &bench{dir: dir}
	ctx, b.stop = context.WithCancel(ctx)
	b.ctx = ctx
	b.cluster, err = postgres.NewCluster(filepath.Join(dir, "pg"), 5433, logger)
	if err != nil {
		return b, err
	}
	b.cluster.Settings = []string{postgres.StatementsSetting} // where PostgreSQL's time goes, per run
	if _, err := b.cluster.Start(ctx); err != nil {
		return b, err
	}
	// `make bench | head` ends us by SIGPIPE, past every deferred cleanup
	b.cluster.Watchdog(dir)
	if err := postgres.CreateDatabase(ctx, b.cluster.URL("postgres"), "bench"); err != nil {
		return b, err
	}
	b.catalog, err = engine.Open(ctx, engine.Config{PoolSize: 2, Logger: logger})
	if err != nil {
		return b, err
	}
	b.engineID = b.catalog.Default()
	b.binary = filepath.Join(engine.DefaultDir(), b.engineID, "stockfish")
	first, pool, err := b.addReplica(logger)
	if err != nil {
		return b, err
	}
	b.url, b.svc, b.pool, b.cmds = first.url, first.svc, pool, first.cmds
	b.wake = eventstore.Listen(ctx, pool, logger)
	// one projection runner and one job executor, as with one serve and its database
	// (sharing its command handler, as serve's executor does: it knows the jobs the
	// server submitted without reading them)
	runner := projections.NewRunner(pool, logger, projections.Accounts{}, projections.Ledger{}, projections.Jobs{})
	b.background.Go(func() { runner.Run(ctx, nil) }) //nolint:errcheck // stopped by close
	b.exec, b.logger = executor.New(executor.Config{Worker: "bench", Parallel: 2}, pool, b.cmds, b.svc, logger), logger
	b.background.Go(func() { b.exec.Run(ctx) }) //nolint:errcheck // stopped by close
	b.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	keys, err := b.signup(ctx, 1, "bench")
	if err != nil {
		return b, err
	}
	b.key = keys[0]
	return b, nil
}

var rateLimits = flag.Bool("ratelimits", false, "serve with the rate limits on, as `chessd serve` does (the bench's keys are on the pro plan: 3,000 calls a minute, "+
	"taken from the shared bucket in leases); for the paired and jobs parts: the throughput parts would be refused past the plan's rate")

// addReplica starts one more server on the bench's database (migrating it first when it
// is the first) and returns it with its connection pool. It runs until close.
func (b *bench) addReplica(logger *slog.Logger) (*replica, *pgxpool.Pool, error) {
	ctx := b.ctx
	pool, err := postgres.Open(ctx, b.cluster.URL("bench"), 40)
	if err != nil {
		return nil, nil, err
	}
	if len(b.replicas) == 0 {
		if err := postgres.Migrate(ctx, pool, logger); err != nil {
			return nil, nil, err
		}
	}
	store := eventstore.NewStore(pool, logger)
	r := &replica{svc: analysis.NewService(b.catalog, pool, logger), meter: ledger.NewMeter(ctx, store, logger, ledger.MeterConfig{}),
		cmds: commands.New(store, pepper)}
	authn := auth.NewAuthenticator(pool, pepper)
	authn.Watch(ctx, logger) // as `chessd serve`
	api := httpapi.New(httpapi.Config{BaseURL: "http://127.0.0.1/v1", NoRateLimits: !*rateLimits, KeylessPerDay: 1 << 30}, httpapi.Deps{
		Pool: pool, Commands: r.cmds,
		Auth: authn, Analysis: r.svc,
		Meter: r.meter, Logger: logger,
		Wakeups: eventstore.Listen(ctx, pool, logger), // as `chessd serve`: job event streams wait for commits
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	r.url = "http://" + ln.Addr().String() + "/v1"
	srv := &http.Server{Handler: api}
	go srv.Serve(api.Listener(ln)) //nolint:errcheck // closed at the end
	b.closers = append(b.closers, func() { srv.Close() })
	b.replicas = append(b.replicas, r)
	return r, pool, nil
}

// signup makes n accounts on the pro plan (its allowance covers the whole run) and
// returns one key of each.
func (b *bench) signup(ctx context.Context, n int, name string) ([]string, error) {
	var keys []string
	for i := range n {
		var su struct {
			APIKey    string `json:"api_key"`
			AccountID string `json:"account_id"`
		}
		if err := b.post(b.url, "/signup", fmt.Sprintf(`{"email":"%s-%d@example.com"}`, name, i), "", &su); err != nil {
			return nil, err
		}
		if err := b.cmds.ChangePlan(ctx, su.AccountID, domain.PlanPro, "benchmark"); err != nil {
			return nil, err
		}
		keys = append(keys, su.APIKey)
	}
	return keys, nil
}

func (b *bench) close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
	if b.stop != nil {
		b.stop()
		b.background.Wait()
		for _, r := range b.replicas {
			<-r.meter.Done() // its last calls settled
		}
	}
	if b.catalog != nil {
		b.catalog.Close()
	}
	if b.cluster != nil {
		b.cluster.Stop(context.Background()) //nolint:errcheck // best effort
	}
	os.RemoveAll(b.dir)
}

// post posts body to base+path, with a key when key is set.
func (b *bench) post(base, path, body, key string, out any) error {
	req, _ := http.NewRequest("POST", base+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := b.client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	if res.StatusCode >= 300 {
		return fmt.Errorf("%s: %d %s", path, res.StatusCode, raw)
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}
