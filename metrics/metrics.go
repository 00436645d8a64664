// Package metrics is the service's Prometheus registry: requests by route, and, read at
// scrape time from the stats the other packages already keep, the engine pools, the
// money path, the job queue and executor, the projections, the database pool and the
// Go runtime. docs/METRICS.md lists every metric.
package metrics

import (
	"context"
	"crypto/subtle"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"chessd/commands"
	"chessd/engine"
	"chessd/executor"
	"chessd/ledger"
	"chessd/projections"
)

// Sources are what the collectors read at each scrape; a nil one is left out.
type Sources struct {
	Engines  *engine.Catalog
	DB       *pgxpool.Pool
	Executor *executor.Executor // this process's job executor, if it runs one
	// Projections, when set, adds the database-wide gauges (the projections' lag, the
	// log's head, the job queue): every process would report the same values, so one
	// kind of process (`chessd serve`) reports them.
	Projections []projections.Projection
	Logger      *slog.Logger
}

// Metrics is one process's registry (never the global default one).
type Metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.HistogramVec
	logger   *slog.Logger
}

// RequestBuckets are the bounds of the request latency histogram, in seconds: from a
// cached answer to a 60 s search.
var RequestBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// scrapeTimeout bounds the database reads of one scrape.
const scrapeTimeout = 5 * time.Second

// New builds the registry over src.
func New(src Sources) *Metrics {
	if src.Logger == nil {
		src.Logger = slog.New(slog.DiscardHandler)
	}
	m := &Metrics{reg: prometheus.NewRegistry(), logger: src.Logger}
	m.requests = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "chessd_http_request_duration_seconds",
		Help:    "Time from a request's arrival to its answer's last byte, by route template, method and status code.",
		Buckets: RequestBuckets,
	}, []string{"route", "method", "code"})
	m.reg.MustRegister(m.requests,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&state{src: src})
	return m
}

// Registry is the registry itself (tests, more collectors).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// methods bounds the method label: anything else is "other".
var methods = map[string]bool{"GET": true, "HEAD": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true, "OPTIONS": true}

// ObserveRequest records one answered request. route is the route's template
// ("/v1/jobs/{id}"), never the raw path, so the label's values stay few.
func (m *Metrics) ObserveRequest(route, method string, status int, took time.Duration) {
	if !methods[method] {
		method = "other"
	}
	m.requests.WithLabelValues(route, method, strconv.Itoa(status)).Observe(took.Seconds())
}

// Handler serves the registry in Prometheus' text format (or OpenMetrics when asked).
// With a token, only requests that carry it as a bearer token are served.
func (m *Metrics) Handler(token string) http.Handler {
	h := promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(m.logger.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError, // a failed read leaves its metrics out, not the scrape
		Registry:      m.reg,
		Timeout:       2 * scrapeTimeout,
	})
	if token == "" {
		return h
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="metrics"`)
			http.Error(w, "the metrics token is required (Authorization: Bearer …)", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// state reads the other packages' stats at scrape time: nothing is counted twice and
// nothing on the request path waits for the metrics.
type state struct{ src Sources }

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

var (
	engineLabels = []string{"engine", "path"}

	engineProcesses = desc("chessd_engine_processes", "Engine processes of a pool by state: busy (searching), idle (free, or clearing its hash after a search: the next search is handed to it at once and runs after the reset), starting (replacing a dead one), dead (exited while idle: replaced when a search next needs one).",
		"engine", "path", "state")
	enginePoolSize   = desc("chessd_engine_pool_size", "Engine processes a pool is configured to keep.", engineLabels...)
	engineQueued     = desc("chessd_engine_queue_length", "Searches waiting for a free process of a pool, by priority.", "engine", "path", "priority")
	engineQueueWait  = desc("chessd_engine_queue_wait_seconds", "How long searches that got a process waited for it, by priority.", "engine", "path", "priority")
	engineTimeouts   = desc("chessd_engine_queue_timeouts_total", "Searches that found no free process within the queue wait (503), by priority.", "engine", "path", "priority")
	engineSearches   = desc("chessd_engine_searches_total", "Searches handed to an engine process.", engineLabels...)
	engineNodes      = desc("chessd_engine_nodes_total", "Nodes the finished searches reported.", engineLabels...)
	enginePreempted  = desc("chessd_engine_preemptions_total", "Batch searches stopped to serve an interactive one (run again).", engineLabels...)
	charges          = desc("chessd_charges_total", "Charges this process committed (line items), by endpoint and whether the cached price applied.", "endpoint", "cached")
	chargedUnits     = desc("chessd_charged_units_total", "Units of the charges this process committed.", "endpoint", "cached")
	chargedUSD       = desc("chessd_charged_usd_total", "US dollars of the charges this process committed.", "endpoint", "cached")
	forgiven         = desc("chessd_charges_forgiven_total", "Answered calls this process's meter forgave (their answers stood, nothing charged), by reason: late (not committed within 20 s of the answer), unknown (whether the commit went through could not be learnt within 30 s), refused (the ledger refused the charge), lost (the lease or Idempotency-Key claim was lost).", "reason")
	refused          = desc("chessd_reservations_refused_total", "Calls the money path refused, nothing charged, by reason: before any work (nothing reserved), but stopped_unsettled (answered after the final settle at shutdown, withheld).", "reason")
	positionsDone    = desc("chessd_job_positions_done_total", "Job positions this process's executor finished searching (recorded, failed or given up).")
	positionsSearch  = desc("chessd_job_search_seconds_total", "Time this process's executor spent analysing job positions (waiting for a process included).")
	queueTakes       = desc("chessd_job_queue_takes_total", "Queries of the job queue by this process's executor, by whether they found positions to take.", "result")
	positionsQueued  = desc("chessd_job_positions_queued", "Job positions on the queue, of every process: waiting for a worker, or held by one.", "state")
	projectionLag    = desc("chessd_projection_lag_events", "Events of a projection's topic it has not applied yet (counted up to 100000).", "projection")
	projectionPos    = desc("chessd_projection_position", "The highest event position a projection has applied.", "projection")
	projectionAside  = desc("chessd_projection_set_aside_events", "Events a projection set aside and nobody has retried or skipped yet.", "projection")
	eventsHead       = desc("chessd_events_head_position", "The position of the event log's last event.")
	dbConns          = desc("chessd_db_connections", "This process's database connections by state.", "state")
	dbMaxConns       = desc("chessd_db_connections_max", "The most database connections this process opens.")
	dbAcquires       = desc("chessd_db_acquires_total", "Connections taken from the pool.")
	dbAcquireWaits   = desc("chessd_db_acquire_waits_total", "Connections taken after waiting for one (none was idle).")
	dbAcquireSeconds = desc("chessd_db_acquire_seconds_total", "Time spent taking connections from the pool.")
	dbAcquireCancel  = desc("chessd_db_acquires_canceled_total", "Waits for a connection that ended with their context.")
	scrapeErrors     = desc("chessd_metrics_read_errors", "Sources that failed to be read in this scrape (their metrics are missing from it).")
	dbClockOffset    = desc("chessd_db_clock_offset_seconds", "The database's clock less this process's, read at scrape time (the midpoint of the query's round trip): charges are dated by the answering server's clock and budget periods roll by the database's, taken at most a minute ahead (docs/BILLING.md), so servers should agree with the database within a second.")
	logCount         = desc("chessd_log_records_total", "Records this process logged at warning level and above, by level, printed or not (LOG_LEVEL): a background loop failing at each pass shows here.", "level")
)

// stateDescs are the metrics state collects.
var stateDescs = []*prometheus.Desc{engineProcesses, enginePoolSize, engineQueued, engineQueueWait, engineTimeouts,
	engineSearches, engineNodes, enginePreempted, charges, chargedUnits, chargedUSD, forgiven, refused, positionsDone,
	positionsSearch, queueTakes, positionsQueued, projectionLag, projectionPos, projectionAside, eventsHead, dbConns, dbMaxConns,
	dbAcquires, dbAcquireWaits, dbAcquireSeconds, dbAcquireCancel, dbClockOffset, scrapeErrors, logCount}

func (s *state) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range stateDescs {
		ch <- d
	}
}

func (s *state) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	if s.src.Engines != nil {
		for _, p := range s.src.Engines.Stats() {
			e, path := p.Engine, string(p.Path)
			gauge(engineProcesses, float64(p.Live-p.Idle), e, path, "busy")
			gauge(engineProcesses, float64(p.Idle), e, path, "idle")
			gauge(engineProcesses, float64(p.Healing), e, path, "starting")
			gauge(engineProcesses, float64(p.Dead), e, path, "dead")
			gauge(enginePoolSize, float64(p.Size), e, path)
			counter(engineSearches, float64(p.Searches), e, path)
			counter(engineNodes, float64(p.Nodes), e, path)
			counter(enginePreempted, float64(p.Preempted), e, path)
			for prio := range p.Waiting {
				name := engine.Priority(prio).String()
				gauge(engineQueued, float64(p.Waiting[prio]), e, path, name)
				w := p.QueueWait[prio]
				ch <- prometheus.MustNewConstHistogram(engineQueueWait, waitCount(w), w.Sum.Seconds(), waitBuckets(w), e, path, name)
				counter(engineTimeouts, float64(w.Saturated), e, path, name)
			}
		}
	}
	counter(logCount, float64(logRecords.warn.Load()), "warn")
	counter(logCount, float64(logRecords.error.Load()), "error")
	money := ledger.Counted()
	for k, t := range money.Charges {
		cached := strconv.FormatBool(k.Cached)
		counter(charges, float64(t.Charges), k.Endpoint, cached)
		counter(chargedUnits, float64(t.Units), k.Endpoint, cached)
		counter(chargedUSD, t.USD.InexactFloat64(), k.Endpoint, cached)
	}
	for reason, n := range money.Refusals {
		counter(refused, float64(n), reason)
	}
	for reason, n := range money.Forgiven {
		counter(forgiven, float64(n), reason)
	}
	if s.src.Executor != nil {
		st := s.src.Executor.Stats()
		counter(positionsDone, float64(st.Positions))
		counter(positionsSearch, st.Searching.Seconds())
		counter(queueTakes, float64(st.Takes-st.EmptyTakes), "found")
		counter(queueTakes, float64(st.EmptyTakes), "empty")
	}
	if db := s.src.DB; db != nil {
		st := db.Stat()
		gauge(dbConns, float64(st.AcquiredConns()), "acquired")
		gauge(dbConns, float64(st.IdleConns()), "idle")
		gauge(dbConns, float64(st.ConstructingConns()), "constructing")
		gauge(dbMaxConns, float64(st.MaxConns()))
		counter(dbAcquires, float64(st.AcquireCount()))
		counter(dbAcquireWaits, float64(st.EmptyAcquireCount()))
		counter(dbAcquireSeconds, st.AcquireDuration().Seconds())
		counter(dbAcquireCancel, float64(st.CanceledAcquireCount()))
		if offset, err := clockOffset(db); err == nil {
			gauge(dbClockOffset, offset.Seconds())
		} else if s.src.Logger != nil {
			s.src.Logger.Warn("metrics: database clock", "err", err)
		}
		if s.src.Projections != nil {
			gauge(scrapeErrors, float64(s.shared(db, gauge)))
		}
	}
}

// shared reads the database-wide gauges and returns how many reads failed (logged).
func (s *state) shared(db *pgxpool.Pool, gauge func(*prometheus.Desc, float64, ...string)) int {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	failed := 0
	head, sts, err := projections.Statuses(ctx, db, s.src.Projections)
	if err != nil {
		s.src.Logger.Warn("metrics: projection statuses", "err", err)
		failed++
	} else {
		gauge(eventsHead, float64(head))
		for _, st := range sts {
			gauge(projectionLag, float64(st.Lag), st.Name)
			gauge(projectionPos, float64(st.Position), st.Name)
			gauge(projectionAside, float64(st.SetAside), st.Name)
		}
	}
	waiting, held, err := commands.QueueDepth(ctx, db)
	if err != nil {
		s.src.Logger.Warn("metrics: job queue", "err", err)
		failed++
	} else {
		gauge(positionsQueued, float64(waiting), "waiting")
		gauge(positionsQueued, float64(held), "held")
	}
	return failed
}

// clockOffset is the database's clock less this process's, taking the database's
// reading to be at the midpoint of the query's round trip, timed once a connection is
// held (a wait for one would count as half the offset).
func clockOffset(db *pgxpool.Pool) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	conn, err := db.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	var theirs time.Time
	before := time.Now()
	if err := conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&theirs); err != nil {
		return 0, err
	}
	after := time.Now()
	return theirs.Sub(before.Add(after.Sub(before) / 2)), nil
}

func waitCount(w engine.WaitStats) uint64 {
	var n int64
	for _, b := range w.Buckets {
		n += b
	}
	return uint64(n)
}

// waitBuckets turns the pool's per-bucket counts into Prometheus' cumulative ones.
func waitBuckets(w engine.WaitStats) map[float64]uint64 {
	out := make(map[float64]uint64, len(engine.QueueWaitBuckets))
	var n int64
	for i, le := range engine.QueueWaitBuckets {
		n += w.Buckets[i]
		out[le.Seconds()] = uint64(n)
	}
	return out
}
