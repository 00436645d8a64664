package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/alerts"
	"chessd/analysis"
	"chessd/auth"
	"chessd/commands"
	"chessd/engine"
	"chessd/eventstore"
	"chessd/executor"
	"chessd/httpapi"
	"chessd/ledger"
	"chessd/mail"
	"chessd/metrics"
	"chessd/postgres"
	"chessd/projections"
	"chessd/ratelimit"
	"chessd/webhook"
)

// core is what both serve and worker run on: the database, the engines, the command
// handler and the analysis service.
type core struct {
	db      *database
	pepper  []byte
	catalog *engine.Catalog
	store   *eventstore.Store
	cmds    *commands.Handler
	svc     *analysis.Service
}

func openCore(ctx context.Context, cfg config, logger *slog.Logger) (*core, error) {
	db, err := openDatabase(ctx, cfg, logger)
	if err != nil {
		return nil, err
	}
	c := &core{db: db}
	if c.pepper, err = cfg.pepper(logger); err != nil {
		c.close(logger)
		return nil, err
	}
	if err := commands.ClaimPepper(ctx, db.pool, c.pepper); err != nil {
		c.close(logger)
		return nil, err
	}
	cfg.Engines.Logger = logger
	if c.catalog, err = engine.Open(ctx, cfg.Engines); err != nil {
		c.close(logger)
		return nil, err
	}
	c.store = eventstore.NewStore(db.pool, logger)
	c.cmds = commands.New(c.store, c.pepper)
	c.svc = analysis.NewService(c.catalog, db.pool, logger)
	return c, nil
}

func (c *core) close(logger *slog.Logger) {
	if c.catalog != nil {
		c.catalog.Close()
	}
	c.db.close(logger)
}

// startupFailed is serve's and work's outcome when openCore failed: nothing when ctx
// ended first (SIGTERM or SIGINT during startup), whatever failed because of it, since
// stopping is what was asked; err otherwise.
func startupFailed(ctx context.Context, err error, logger *slog.Logger) error {
	if ctx.Err() != nil {
		logger.Info("stopped during startup", "err", err)
		return nil
	}
	return err
}

func serve(ctx context.Context, cfg config, logger *slog.Logger) error {
	c, err := openCore(ctx, cfg, logger)
	if err != nil {
		return startupFailed(ctx, err, logger)
	}
	defer c.close(logger)
	db, store, cmds, svc, pepper := c.db, c.store, c.cmds, c.svc, c.pepper
	cmds.APIURL = cfg.BaseURL // named in the verification mail
	// The meter outlives request handling: it settles the last answers and gives its
	// leases back once the requests have returned (stopServing).
	meterCtx, stopMeter := context.WithCancel(context.WithoutCancel(ctx))
	defer stopMeter()
	meter := ledger.NewMeter(meterCtx, store, logger, cfg.Meter)
	hooks, err := webhook.NewSecrets(pepper) // endpoints' signing secrets, sealed in the database
	if err != nil {
		return err
	}
	if cfg.Mail.Seal, err = commands.NewMailSealer(pepper); err != nil { // the outbox's bodies, sealed too
		return err
	}
	var exec *executor.Executor
	if !cfg.NoExecutor {
		exec = executor.New(cfg.Executor, db.pool, cmds, svc, logger)
	}
	authn := auth.NewAuthenticator(db.pool, pepper)
	authn.Watch(meterCtx, logger) // keys and accounts answered from memory while no server changes them
	mx := metrics.New(metrics.Sources{Engines: c.catalog, DB: db.pool, Executor: exec, Projections: allProjections(), Logger: logger})
	api := httpapi.New(httpapi.Config{BaseURL: cfg.BaseURL, NoRateLimits: cfg.NoRateLimits, InsecureWebhooks: cfg.InsecureWebhooks,
		TrustedProxies: cfg.TrustedProxies}, httpapi.Deps{
		Pool: db.pool, Commands: cmds, ObserveRequest: mx.ObserveRequest,
		Auth:           authn,
		Analysis:       svc,
		Meter:          meter,
		Logger:         logger,
		Wakeups:        eventstore.Listen(meterCtx, db.pool, logger), // job event streams wait for commits
		WebhookSecrets: hooks,
	})

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// /metrics: on its own listener when CHESSD_METRICS_ADDR says so, else beside /v1.
	// First, so that a listener that fails stops serve before anything below started
	// (which would then have to be waited for).
	var handler http.Handler = api
	switch cfg.MetricsAddr {
	case "off":
	case "":
		handler = withMetrics(api, mx.Handler(cfg.MetricsToken))
	default:
		if err := serveMetrics(ctx, cfg.MetricsAddr, mx.Handler(cfg.MetricsToken), logger); err != nil {
			return err
		}
	}
	// The API's listener too: a port in use stops serve here, before it says "serving".
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", cfg.Port))
	if err != nil {
		return fmt.Errorf("API listener: %w", err)
	}
	go expireOldRows(ctx, db, logger)
	go logAnchors(ctx, db, logger)
	// A newer chessd's migrations stop the job executor, the mail and webhook senders
	// and the budget alerts (the API steps aside by /readyz): each would write what the
	// newer schema may expect otherwise (migration 0047 changed the outbox: older
	// senders mailed sealed bodies).
	stopping := "mail sender, webhook sender and budget alerts"
	if exec != nil {
		stopping = "job executor, " + stopping
	}
	untilNewer := untilNewerSchema(ctx, db.pool, cfg.SchemaCheck, stopping, logger)
	mailDone := make(chan struct{})
	go func() { // the outbox: SMTP when configured, else the log
		defer close(mailDone)
		mail.NewSender(cfg.Mail, db.pool, logger).Run(untilNewer)
	}()
	hooksDone := make(chan struct{})
	go func() {
		defer close(hooksDone)
		webhook.NewSender(webhook.Config{AllowPrivate: cfg.InsecureWebhooks, Secrets: hooks}, db.pool, logger).Run(untilNewer)
	}()
	go alerts.Run(untilNewer, db.pool, 5*time.Second, logger) // budget thresholds crossed, told by webhook
	go projections.PruneLoop(ctx, db.pool, busConsumers(), time.Minute, logger)
	execDone := make(chan error, 1)
	if exec == nil {
		execDone <- nil
	} else {
		go func() { execDone <- exec.Run(untilNewer) }()
	}
	runner := projections.NewRunner(db.pool, logger, allProjections()...)
	runnerDone := make(chan error, 1)
	go func() { runnerDone <- runner.Run(ctx, nil) }()

	running := &inFlight{h: handler}
	srv := &http.Server{
		Handler:           running,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		// A search is bounded at analysis.SearchCap (60 s) plus 30 s for queueing and a
		// process's start; the answer, or its 503, must still be writable after that.
		WriteTimeout:   analysis.SearchCap + time.Minute,
		IdleTimeout:    120 * time.Second,
		MaxHeaderBytes: httpapi.ServerMaxHeaderBytes, // the door refuses above httpapi.MaxHeaderBytes
		ErrorLog:       slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(api.Listener(ln)) }() // net/http's own errors as problem+json
	logger.Info("serving", "addr", ln.Addr().String(), "base_url", cfg.BaseURL)

	runnerStopped := false
	select {
	case err = <-serveErr:
	case err = <-runnerDone:
		runnerStopped = true
		err = fmt.Errorf("projections stopped: %w", err)
	case <-ctx.Done():
	}
	stopServing(srv, running, api.EndStreams, meter, meter.StopGrace(), logger)
	stopMeter() // what the handlers used: keys' changes, job streams' wake-ups
	cancel()
	if !runnerStopped {
		<-runnerDone
	}
	<-execDone
	<-mailDone  // the message being sent when ctx ended (within its Timeout), recorded before the pool closes
	<-hooksDone // the same for the webhook deliveries under way
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	logger.Info("stopped")
	return err
}

// stopServing stops srv and then the meter, so that every call answered is charged
// (docs/BILLING.md): the long-lived streams end at once (a job's event stream would hold
// the server for as long as its job runs; its client reconnects, with Last-Event-ID, to
// another server), the server takes no new request, and the requests running (a search
// takes up to a minute) are waited for until they have returned or grace (the meter's
// StopGrace) is over. Only then does the meter stop: it settles what they answered and
// gives its leases back. A call still running after grace is not charged: the meter
// refuses its Settle, so its client is told to retry (503), not answered free.
func stopServing(srv *http.Server, running *inFlight, endStreams func(), meter *ledger.Meter, grace time.Duration, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	endStreams()
	// Shutdown notices the last request's end up to half a second late: its error alone
	// does not say a request is still running.
	if err := srv.Shutdown(ctx); err != nil {
		if n := running.Count(); n > 0 {
			logger.Error("stopping: requests still running after the grace; calls answered from now on are not charged",
				"grace", grace, "running", n)
		}
	}
	meter.Stop(ctx) // the last answers settled, the leases given back
}

// inFlight is a handler counting the requests it is serving.
type inFlight struct {
	h http.Handler
	n atomic.Int64
}

func (f *inFlight) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.n.Add(1)
	defer f.n.Add(-1)
	f.h.ServeHTTP(w, r)
}

// Count is how many requests are being served now.
func (f *inFlight) Count() int64 { return f.n.Load() }

// logAnchors logs the event chain's head, at start and every 10 minutes, as an anchor
// for `chessd verify --anchor`: logs kept outside the database then catch a rewrite
// of the log that recomputes its hashes (eventstore.Anchor).
func logAnchors(ctx context.Context, db *database, logger *slog.Logger) {
	t := time.NewTicker(10 * time.Minute)
	defer t.Stop()
	for {
		if a, err := eventstore.HeadAnchor(ctx, db.pool); err != nil {
			if ctx.Err() == nil {
				logger.Warn("event chain anchor", "err", err)
			}
		} else if a.Position > 0 {
			logger.Info("event chain anchor", "anchor", a.String())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// expireOldRows has, every 10 minutes, each package delete what of its own has
// outlived its use: first responses older than the 24-hour Idempotency-Key window and
// keyless allowances of past days (ledger), eval-cache entries not refreshed for 30
// days (analysis), rate-limit buckets that are full again (ratelimit), the mail
// outbox's messages sent or given up more than 30 days ago (mail), and webhook
// deliveries delivered or failed more than 30 days ago and the endpoints deleted more
// than 30 days ago that have none left (webhook), and e-mail verification and
// key-recovery tokens used or expired more than 30 days ago (commands).
func expireOldRows(ctx context.Context, db *database, logger *slog.Logger) {
	t := time.NewTicker(10 * time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, expire := range []func() (int64, error){
			func() (int64, error) { return ledger.Expire(ctx, db.pool) },
			func() (int64, error) { return analysis.ExpireCache(ctx, db.pool, 30*24*time.Hour) },
			func() (int64, error) { return ratelimit.Sweep(ctx, db.pool) },
			func() (int64, error) { return mail.Expire(ctx, db.pool, 30*24*time.Hour) },
			func() (int64, error) { return webhook.Expire(ctx, db.pool, 30*24*time.Hour) },
			func() (int64, error) { return commands.ExpireTokens(ctx, db.pool, 30*24*time.Hour) },
		} {
			if _, err := expire(); err != nil && ctx.Err() == nil {
				logger.Warn("expire old rows", "err", err)
			}
		}
	}
}

// work runs only the job executor: `chessd worker`, for machines that analyse jobs
// beside (or instead of) the API servers, against the same database.
func work(ctx context.Context, cfg config, logger *slog.Logger) error {
	c, err := openCore(ctx, cfg, logger)
	if err != nil {
		return startupFailed(ctx, err, logger)
	}
	defer c.close(logger)
	if cfg.NoExecutor {
		return fmt.Errorf("CHESSD_WORKER_JOBS=0 leaves a worker nothing to do")
	}
	exec := executor.New(cfg.Executor, c.db.pool, c.cmds, c.svc, logger)
	logger.Info("worker running", "worker", exec.Name())
	if a := cfg.MetricsAddr; a != "" && a != "off" { // a worker has no other listener
		mx := metrics.New(metrics.Sources{Engines: c.catalog, DB: c.db.pool, Executor: exec, Logger: logger})
		if err := serveMetrics(ctx, a, mx.Handler(cfg.MetricsToken), logger); err != nil {
			return err
		}
	}
	ctx = untilNewerSchema(ctx, c.db.pool, cfg.SchemaCheck, "job executor", logger)
	err = exec.Run(ctx)
	if cause := context.Cause(ctx); errors.Is(cause, postgres.ErrSchemaNewer) {
		return cause
	}
	return err
}

// untilNewerSchema is ctx, ended (with cause ErrSchemaNewer) once a newer chessd has
// migrated the database: a job executor or an outbox's sender has no readiness gate to step
// aside by, and an old one would go on writing what the newer schema expects
// differently. stopping names what stops, for the log.
func untilNewerSchema(ctx context.Context, pool *pgxpool.Pool, every time.Duration, stopping string, logger *slog.Logger) context.Context {
	ctx, stop := context.WithCancelCause(ctx)
	go func() {
		err := postgres.WatchNewer(ctx, pool, every)
		if errors.Is(err, postgres.ErrSchemaNewer) {
			logger.Error("a newer chessd migrated the database: this "+stopping+" stops; run the newer version", "err", err)
		}
		stop(err)
	}()
	return ctx
}

// withMetrics serves GET /metrics beside the API (outside /v1, so not counted as an
// API request) and everything else by api.
func withMetrics(api, metrics http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			metrics.ServeHTTP(w, r)
			return
		}
		api.ServeHTTP(w, r)
	})
}

// serveMetrics serves /metrics alone on addr (CHESSD_METRICS_ADDR) until ctx ends; it
// fails at once when addr cannot be listened on.
func serveMetrics(ctx context.Context, addr string, h http.Handler, logger *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 30 * time.Second,
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("metrics listener", "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		srv.Close() //nolint:errcheck // stopping; a scrape in flight is cut
	}()
	logger.Info("serving metrics", "addr", ln.Addr().String())
	return nil
}

// busConsumers says how many consumer groups read each bus topic: every projection
// but an inline one reads its topic, and the executors (here or in `chessd worker`)
// read the commands.
func busConsumers() map[string]int {
	m := map[string]int{commands.TopicJobCommands: 1}
	for _, p := range allProjections() {
		if !projections.Inline(p) {
			m[p.Topic()]++
		}
	}
	return m
}
