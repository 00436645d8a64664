// Command chessbench measures the service against raw Stockfish on loopback, in one run
// on the same positions and engine binary: raw UCI versus POST /eval (cache off) at
// several depths and concurrencies, and cached POST /eval throughput. It starts its own
// PostgreSQL cluster and server, and prints Markdown for docs/BENCHMARKS.md.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/analysis"
	"chessd/commands"
	"chessd/domain"
	"chessd/domain/position"
	"chessd/engine"
	"chessd/engine/executor"
	"chessd/eventstore"
	"chessd/httpapi"
	"chessd/ledger"
	"chessd/postgres"
	"chessd/projections"
)

// positions are varied middlegame and endgame positions.
var positions = []string{
	"r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
	"r1bq1rk1/ppp2ppp/2np1n2/2b1p3/2B1P3/2NP1N2/PPP2PPP/R1BQ1RK1 w - - 0 7",
	"r2q1rk1/pp2bppp/2n1pn2/3p4/3P4/2NBPN2/PP3PPP/R2QK2R w KQ - 0 10",
	"rnbqkb1r/pp3ppp/4pn2/2pp4/3P4/2P1PN2/PP3PPP/RNBQKB1R w KQkq - 0 5",
	"2rq1rk1/pb1nbppp/1p2pn2/2pp4/3P4/1P2PNP1/PBPNQPBP/R4RK1 w - - 0 11",
	"r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R w KQkq - 0 1",
	"8/2p5/3p4/KP5r/1R3p1k/8/4P1P1/8 w - - 0 1",
	"r4rk1/1pp1qppp/p1np1n2/2b1p1B1/2B1P1b1/P1NP1N2/1PP1QPPP/R4RK1 w - - 0 10",
	"6k1/5ppp/8/8/8/8/5PPP/3R2K1 w - - 0 1",
	"rnbq1rk1/ppp1ppbp/3p1np1/8/2PPP3/2N2N2/PP2BPPP/R1BQK2R b KQ - 3 6",
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "chessbench:", err)
		os.Exit(1)
	}
}

// run does the work, so that the cluster and engines are stopped on every return.
func run() error {
	depths := flag.String("depths", "10,14,18", "depths to compare")
	rounds := flag.Int("rounds", 3, "passes over the positions per depth (deep ones: 1)")
	cachedFor := flag.Duration("cached", 5*time.Second, "duration of the cached-throughput run")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run here")
	parts := flag.String("parts", "paired,jobs,cached", "which measurements to run")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil && pprof.StartCPUProfile(f) == nil {
			defer pprof.StopCPUProfile()
		}
	}
	ctx := context.Background()
	// as a server run with LOG_LEVEL=warn: no access log line per request
	logger := slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn}))
	b, err := start(ctx, logger)
	if b != nil {
		defer b.close()
	}
	if err != nil {
		return err
	}

	run := func(part string) bool { return strings.Contains(*parts, part) }
	if run("paired") {
		if err := b.pairedAll(*depths, *rounds); err != nil {
			return err
		}
	}
	if run("jobs") {
		if err := b.jobs(); err != nil {
			return fmt.Errorf("jobs: %w", err)
		}
	}
	if run("cached") {
		if err := b.cachedAll(*cachedFor); err != nil {
			return err
		}
	}
	return nil
}

// pairedAll compares raw Stockfish with POST /eval at each depth, concurrency 1 and 2.
func (b *bench) pairedAll(depths string, rounds int) error {
	fmt.Printf("## Raw Stockfish vs POST /eval (cache off)\n\n")
	fmt.Printf("Engine: %s native (%s), 1 thread, 16 MB hash, %d positions; the service runs 2 processes.\n", b.engineID, b.binary, len(positions))
	fmt.Println("Paired: each worker runs every position on its own raw process and through the service, alternating which goes first;")
	fmt.Println("ratio = total service time / total raw time; added = median over pairs of (service - raw).")
	fmt.Println()
	fmt.Println("| depth | concurrency | pairs | raw total s | service total s | ratio | raw median ms | service median ms | added median ms |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	var breakdown []string
	for _, d := range strings.Split(depths, ",") {
		var depth int
		fmt.Sscan(d, &depth)
		n := rounds
		if depth >= 18 {
			n = max(1, n/2)
		}
		for _, conc := range []int{1, 2} {
			pairs, err := b.paired(depth, conc, repeat(positions, n))
			if err != nil {
				return fmt.Errorf("paired: %w", err)
			}
			raw, svc := pairs.raw(), pairs.svc()
			fmt.Printf("| %d | %d | %d | %.2f | %.2f | %.3f | %.1f | %.1f | %+.2f |\n", depth, conc, len(raw),
				sum(raw).Seconds(), sum(svc).Seconds(), sum(svc).Seconds()/sum(raw).Seconds(),
				ms(median(raw)), ms(median(svc)), ms(medianDiff(svc, raw)))
			breakdown = append(breakdown, fmt.Sprintf("| %d | %d | %+.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |", depth, conc,
				ms(pairs.median(func(p pair) time.Duration { return p.phase["engine"] - p.raw })),
				ms(pairs.median(func(p pair) time.Duration { return p.svc - p.phase["engine"] })),
				ms(pairs.median(func(p pair) time.Duration { return p.svc - p.phase["total"] })),
				ms(pairs.median(func(p pair) time.Duration { return p.phase["auth"] })),
				ms(pairs.median(func(p pair) time.Duration { return p.phase["request"] })),
				ms(pairs.median(func(p pair) time.Duration { return p.phase["analysis"] - p.phase["engine"] })),
				ms(pairs.median(func(p pair) time.Duration { return p.phase["charge"] }))))
		}
	}
	fmt.Println()
	fmt.Println("Where the service's time goes, from its Server-Timing header (medians over the same pairs, ms):")
	fmt.Println("engine − raw: the pool's search (hand-over, options, position, go ... bestmove, parsing) against the raw process;")
	fmt.Println("outside the engine: the client's whole time minus the pool's search; of it, HTTP (client time minus handler time),")
	fmt.Println("auth (key lookup, scope, rate limit), request (decode, validate, caps), conversion (SAN, White's view, JSON), charge (durable).")
	fmt.Println()
	fmt.Println("| depth | concurrency | engine − raw | outside the engine | HTTP | auth | request | conversion | charge |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for _, l := range breakdown {
		fmt.Println(l)
	}
	return nil
}

// cachedAll measures cached POST /eval throughput with wrk at several concurrencies.
func (b *bench) cachedAll(cachedFor time.Duration) error {
	fmt.Printf("\n## Cached POST /eval throughput, each call charged in the ledger\n\n")
	fmt.Println("With a key (authenticated, plan caps checked, charged: one UnitsCharged event and its postings per call), cache on, rate limits off.")
	fmt.Println("Lag: how far the ledger projection's checkpoint (charges, ledger_entries) is behind the event log's head, in events, sampled every 50 ms.")
	fmt.Println()
	fmt.Println("Load from wrk (a second process, keep-alive connections).")
	fmt.Println()
	fmt.Println("| connections | duration | requests | non-2xx | requests/s | p50 | p99 | charges recorded | projection lag max (events) | lag mean | caught up after the load |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|")
	for _, clients := range []int{4, 16, 32, 64} {
		before := b.chargeCount()
		stopLag := b.watchLag()
		l, err := b.cached(clients, cachedFor)
		if err != nil {
			return fmt.Errorf("cached: %w", err)
		}
		lagMax, lagMean, catchUp := stopLag()
		fmt.Printf("| %d | %s | %d | %d | **%.0f** | %s | %s | %d | %d | %.0f | %s |\n", clients, cachedFor, l.requests, l.non2, l.rate,
			l.p50, l.p99, b.chargeCount()-before-int64(len(positions)), lagMax, lagMean, catchUp.Round(time.Millisecond))
	}
	return nil
}

type bench struct {
	srv      *http.Server
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
}

func start(ctx context.Context, logger *slog.Logger) (*bench, error) {
	dir, err := os.MkdirTemp("", "chessbench-")
	if err != nil {
		return nil, err
	}
	b := &bench{dir: dir}
	b.cluster, err = postgres.NewCluster(filepath.Join(dir, "pg"), 5433, logger)
	if err != nil {
		return b, err
	}
	if _, err := b.cluster.Start(ctx); err != nil {
		return b, err
	}
	// `make bench | head` ends us by SIGPIPE, past every deferred cleanup
	b.cluster.Watchdog(dir)
	if err := postgres.CreateDatabase(ctx, b.cluster.URL("postgres"), "bench"); err != nil {
		return b, err
	}
	pool, err := postgres.Open(ctx, b.cluster.URL("bench"), 40)
	if err != nil {
		return b, err
	}
	if err := postgres.Migrate(ctx, pool, logger); err != nil {
		return b, err
	}
	b.catalog, err = engine.Open(ctx, engine.Config{PoolSize: 2, Logger: logger})
	if err != nil {
		return b, err
	}
	b.engineID = b.catalog.Default()
	b.binary = filepath.Join(engine.DefaultDir(), b.engineID, "stockfish")
	pepper := []byte("bench-pepper-0123456789")
	b.svc = analysis.NewService(b.catalog, pool, logger)
	store := eventstore.NewStore(pool, logger)
	api := httpapi.New(httpapi.Config{BaseURL: "http://127.0.0.1/v1", NoRateLimits: true}, httpapi.Deps{
		Pool: pool, Commands: commands.New(store, pepper),
		Auth: projections.NewAuthenticator(pool, pepper), Analysis: b.svc,
		Meter: ledger.NewMeter(ctx, store, logger, ledger.MeterConfig{}), Logger: logger,
	})
	go projections.NewRunner(pool, logger, projections.Accounts{}, projections.Ledger{}, projections.Jobs{}).Run(ctx, nil) //nolint:errcheck // ends with the process
	x := executor.New(executor.Config{Worker: "bench", MaxJobs: 2, Parallel: 2}, pool, commands.New(store, pepper), b.svc, logger)
	go x.Run(ctx) //nolint:errcheck // ends with the process
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return b, err
	}
	b.url = "http://" + ln.Addr().String() + "/v1"
	b.srv = &http.Server{Handler: api}
	go b.srv.Serve(ln) //nolint:errcheck // closed at the end
	b.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var su struct {
		APIKey    string `json:"api_key"`
		AccountID string `json:"account_id"`
	}
	if err := b.post("/signup", `{"email":"bench@example.com"}`, "", &su); err != nil {
		return b, err
	}
	b.key = su.APIKey
	// the pro plan's allowance covers the whole run
	if err := commands.New(store, pepper).ChangePlan(ctx, su.AccountID, domain.PlanPro, "benchmark"); err != nil {
		return b, err
	}
	b.pool = pool
	return b, nil
}

func (b *bench) close() {
	if b.srv != nil {
		b.srv.Close()
	}
	if b.catalog != nil {
		b.catalog.Close()
	}
	if b.cluster != nil {
		b.cluster.Stop(context.Background()) //nolint:errcheck // best effort
	}
	os.RemoveAll(b.dir)
}

func (b *bench) post(path, body, key string, out any) error {
	req, _ := http.NewRequest("POST", b.url+path, strings.NewReader(body))
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

// pair is one position run raw and through the service, with the service's
// Server-Timing phases.
type pair struct {
	raw, svc time.Duration
	phase    map[string]time.Duration
}

type pairs []pair

func (ps pairs) raw() []time.Duration { return ps.each(func(p pair) time.Duration { return p.raw }) }
func (ps pairs) svc() []time.Duration { return ps.each(func(p pair) time.Duration { return p.svc }) }

func (ps pairs) each(f func(pair) time.Duration) []time.Duration {
	out := make([]time.Duration, len(ps))
	for i, p := range ps {
		out[i] = f(p)
	}
	return out
}

func (ps pairs) median(f func(pair) time.Duration) time.Duration { return median(ps.each(f)) }

// paired runs work on conc workers; each worker has its own raw Stockfish process and
// runs every position both raw and through the service (cache off), alternating the
// order. It returns the raw and service times of each pair.
func (b *bench) paired(depth, conc int, work []string) (pairs, error) {
	b.svc.DisableCache()
	var mu sync.Mutex
	var wg sync.WaitGroup
	var next atomic.Int64
	var out pairs
	errs := make(chan error, conc)
	for range conc {
		eng, err := startRaw(b.binary)
		if err != nil {
			return nil, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer eng.close()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(work) {
					return
				}
				var p pair
				var err error
				runSvc := func() {
					t0 := time.Now()
					p.phase, err = b.timedPost("/eval", fmt.Sprintf(`{"fen":%q,"depth":%d,"engine":%q,"path":"native"}`, work[i], depth, b.engineID), b.key)
					p.svc = time.Since(t0)
				}
				if i%2 == 0 {
					p.raw = eng.search(work[i], depth)
					runSvc()
				} else {
					runSvc()
					p.raw = eng.search(work[i], depth)
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				out = append(out, p)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	return out, <-errs
}

// timedPost posts body and returns the answer's Server-Timing phases.
func (b *bench) timedPost(path, body, key string) (map[string]time.Duration, error) {
	req, _ := http.NewRequest("POST", b.url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := b.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	if res.StatusCode >= 300 {
		return nil, fmt.Errorf("%s: %d %s", path, res.StatusCode, raw)
	}
	phases := map[string]time.Duration{}
	for _, m := range strings.Split(res.Header.Get("Server-Timing"), ",") {
		name, dur, ok := strings.Cut(strings.TrimSpace(m), ";dur=")
		var v float64
		if _, err := fmt.Sscan(dur, &v); ok && err == nil {
			phases[name] = time.Duration(v * float64(time.Millisecond))
		}
	}
	return phases, nil
}

// rawEngine is Stockfish driven directly over UCI, as a client without our service
// would: ucinewgame between positions (untimed, as the service's pool resets between
// requests), then position + go until bestmove, timed.
type rawEngine struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startRaw(binary string) (*rawEngine, error) {
	cmd := exec.Command(binary)
	in, _ := cmd.StdinPipe()
	outPipe, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	e := &rawEngine{cmd: cmd, in: in, out: bufio.NewScanner(outPipe)}
	fmt.Fprintln(in, "uci")
	e.until("uciok")
	return e, nil
}

func (e *rawEngine) until(prefix string) {
	for e.out.Scan() {
		if strings.HasPrefix(e.out.Text(), prefix) {
			return
		}
	}
}

func (e *rawEngine) search(fen string, depth int) time.Duration {
	fmt.Fprintln(e.in, "ucinewgame")
	fmt.Fprintln(e.in, "isready")
	e.until("readyok")
	start := time.Now()
	fmt.Fprintf(e.in, "position fen %s\ngo depth %d\n", fen, depth)
	e.until("bestmove")
	return time.Since(start)
}

func (e *rawEngine) close() {
	fmt.Fprintln(e.in, "quit")
	e.cmd.Wait() //nolint:errcheck // exiting
}

func sum(d []time.Duration) time.Duration {
	var t time.Duration
	for _, v := range d {
		t += v
	}
	return t
}

// cached measures throughput of cache hits: the positions are evaluated once, then
// wrk (a separate, efficient load generator) asks for them again and again for d.
func (b *bench) cached(clients int, d time.Duration) (load, error) {
	b.svc.EnableCache()
	for _, fen := range positions {
		if err := b.post("/eval", fmt.Sprintf(`{"fen":%q,"depth":10}`, fen), b.key, nil); err != nil {
			return load{}, err
		}
	}
	var bodies []string
	for _, fen := range positions {
		bodies = append(bodies, fmt.Sprintf("'{\"fen\":\"%s\",\"depth\":10}'", fen))
	}
	script := filepath.Join(b.dir, "eval.lua")
	lua := fmt.Sprintf(`local bodies = {%s}
local i = 0
request = function()
  i = i + 1
  return wrk.format("POST", nil, {["Authorization"] = "Bearer %s", ["Content-Type"] = "application/json"}, bodies[(i %% #bodies) + 1])
end
`, strings.Join(bodies, ", "), b.key)
	if err := os.WriteFile(script, []byte(lua), 0o644); err != nil {
		return load{}, err
	}
	threads := min(2, clients)
	out, err := exec.Command("wrk", "--latency", fmt.Sprintf("-t%d", threads), fmt.Sprintf("-c%d", clients),
		fmt.Sprintf("-d%ds", int(d.Seconds())), "-s", script, b.url+"/eval").CombinedOutput()
	if err != nil {
		return load{}, fmt.Errorf("wrk: %v: %s", err, out)
	}
	return parseWrk(string(out))
}

// load is what wrk reports.
type load struct {
	rate           float64
	p50, p99       string
	requests, non2 int64
}

func parseWrk(out string) (load, error) {
	var l load
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "Requests/sec:":
			fmt.Sscan(f[1], &l.rate)
		case len(f) == 2 && f[0] == "50%":
			l.p50 = f[1]
		case len(f) == 2 && f[0] == "99%":
			l.p99 = f[1]
		case len(f) > 2 && f[1] == "requests" && f[2] == "in":
			fmt.Sscan(f[0], &l.requests)
		case strings.HasPrefix(strings.TrimSpace(line), "Non-2xx or 3xx responses:"):
			fmt.Sscan(f[len(f)-1], &l.non2)
		}
	}
	if l.rate == 0 {
		return l, fmt.Errorf("could not read wrk's output: %s", out)
	}
	return l, nil
}

// games give 50 distinct positions for the job benchmarks.
var games = []string{
	"1. e4 c5 2. Nf3 d6 3. d4 cxd4 4. Nxd4 Nf6 5. Nc3 a6 6. Be3 e5 7. Nb3 Be6 8. f3 Be7 9. Qd2 O-O 10. O-O-O Nbd7 11. g4 b5 12. g5 b4 13. Ne2 Ne8 *",
	"1. d4 Nf6 2. c4 e6 3. Nc3 Bb4 4. e3 O-O 5. Bd3 d5 6. Nf3 c5 7. O-O Nc6 8. a3 Bxc3 9. bxc3 dxc4 10. Bxc4 Qc7 11. Bd3 e5 12. Qc2 Re8 13. Nxe5 Nxe5 14. dxe5 Qxe5 *",
}

func jobPositions() []string {
	var fens []string
	seen := map[string]bool{}
	for _, g := range games {
		game, err := position.ParsePGN(g, false, 0)
		if err != nil {
			panic(err)
		}
		for _, p := range game.Plies {
			if !seen[p.FEN] && len(fens) < 50 {
				seen[p.FEN] = true
				fens = append(fens, p.FEN)
			}
		}
	}
	return fens
}

// jobs measures 50-position batches through the service (submit to succeeded, cache
// off) against raw Stockfish on the same positions with the same number of processes,
// and single /eval latency while a batch runs.
func (b *bench) jobs() error {
	fens := jobPositions()
	fmt.Printf("\n## Jobs: 50-position batches against raw Stockfish (cache off)\n\n")
	fmt.Printf("%d distinct positions from two games; 2 engine processes on both sides (raw: two warm processes splitting the positions, ucinewgame before each).\n\n", len(fens))
	fmt.Println("| depth | raw positions/s | service positions/s | service / raw |")
	fmt.Println("|---|---|---|---|")
	b.svc.DisableCache()
	defer b.svc.EnableCache()
	for _, depth := range []int{10, 14} {
		took, err := runRawAll(b.binary, depth, 2, fens)
		if err != nil {
			return err
		}
		raw := float64(len(fens)) / took.Seconds()
		start := time.Now()
		if err := b.runJob(fens, depth); err != nil {
			return err
		}
		svc := float64(len(fens)) / time.Since(start).Seconds()
		fmt.Printf("| %d | %.1f | %.1f | **%.2f** |\n", depth, raw, svc, svc/raw)
	}

	fmt.Printf("\n## Single POST /eval latency while a batch runs\n\n")
	fmt.Println("Sequential depth-10 evals of one client (cache off), alone and while a 50-position depth-14 batch uses both processes.")
	fmt.Println()
	fmt.Println("| while | evals | p50 ms | p99 ms | max ms |")
	fmt.Println("|---|---|---|---|---|")
	evals := func(n int) ([]time.Duration, error) {
		var lat []time.Duration
		for i := range n {
			t0 := time.Now()
			if err := b.post("/eval", fmt.Sprintf(`{"fen":%q,"depth":10}`, positions[i%len(positions)]), b.key, nil); err != nil {
				return nil, err
			}
			lat = append(lat, time.Since(t0))
		}
		return lat, nil
	}
	idle, err := evals(40)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- b.runJob(fens, 14) }()
	time.Sleep(300 * time.Millisecond)
	busy, err := evals(40)
	if err != nil {
		return err
	}
	if err := <-done; err != nil {
		return err
	}
	for _, row := range []struct {
		name string
		lat  []time.Duration
	}{{"idle", idle}, {"a batch runs", busy}} {
		sorted := append([]time.Duration(nil), row.lat...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
		fmt.Printf("| %s | %d | %.1f | %.1f | %.1f |\n", row.name, len(sorted), ms(sorted[len(sorted)/2]),
			ms(sorted[len(sorted)*99/100]), ms(sorted[len(sorted)-1]))
	}
	return nil
}

// runJob submits a batch and waits until it succeeded.
func (b *bench) runJob(fens []string, depth int) error {
	body, _ := json.Marshal(map[string]any{"fens": fens, "depth": depth})
	var job struct {
		ID    string `json:"job_id"`
		State string `json:"state"`
	}
	if err := b.post("/batch", string(body), b.key, &job); err != nil {
		return err
	}
	for job.State != "succeeded" {
		if job.State == "failed" || job.State == "cancelled" {
			return fmt.Errorf("job %s %s", job.ID, job.State)
		}
		time.Sleep(20 * time.Millisecond)
		req, _ := http.NewRequest("GET", b.url+"/jobs/"+job.ID, nil)
		req.Header.Set("Authorization", "Bearer "+b.key)
		res, err := b.client.Do(req)
		if err != nil {
			return err
		}
		err = json.NewDecoder(res.Body).Decode(&job)
		res.Body.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// runRawAll runs fens on conc raw processes, splitting them, and returns the time
// they took. The processes are started and ready (network loaded) before the clock
// starts, as the service's pool is.
func runRawAll(binary string, depth, conc int, fens []string) (time.Duration, error) {
	var wg sync.WaitGroup
	var next atomic.Int64
	engines := make([]*rawEngine, conc)
	for i := range engines {
		eng, err := startRaw(binary)
		if err != nil {
			return 0, err
		}
		fmt.Fprintln(eng.in, "isready")
		eng.until("readyok")
		engines[i] = eng
	}
	start := time.Now()
	for _, eng := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(fens) {
					return
				}
				eng.search(fens[i], depth)
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	for _, eng := range engines {
		eng.close()
	}
	return took, nil
}

func (b *bench) chargeCount() int64 {
	var n int64
	b.pool.QueryRow(context.Background(), `SELECT count(*) FROM events WHERE stream_type = 'ledger'`).Scan(&n) //nolint:errcheck // reported as 0
	return n
}

// lag is how far the ledger projection's checkpoint is behind the log's head, in
// events (during the load nearly every event is a charge).
func (b *bench) lag() int64 {
	var n int64
	b.pool.QueryRow(context.Background(), `SELECT (SELECT position FROM event_chain) -
		coalesce((SELECT position FROM projection_checkpoints WHERE name = 'ledger_v1'), 0)`).Scan(&n) //nolint:errcheck // sampled
	return n
}

// watchLag samples the projection lag until the returned function is called; that
// function then waits for the projection to catch up and reports max, mean and the
// time the catch-up took.
func (b *bench) watchLag() func() (int64, float64, time.Duration) {
	stop := make(chan struct{})
	var samples []int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				samples = append(samples, b.lag())
			}
		}
	}()
	return func() (int64, float64, time.Duration) {
		close(stop)
		<-done
		start := time.Now()
		for b.lag() > 0 && time.Since(start) < time.Minute {
			time.Sleep(5 * time.Millisecond)
		}
		var maxLag, sum int64
		for _, s := range samples {
			maxLag = max(maxLag, s)
			sum += s
		}
		return maxLag, float64(sum) / float64(max(1, len(samples))), time.Since(start)
	}
}

func repeat(s []string, n int) []string {
	var out []string
	for range n {
		out = append(out, s...)
	}
	return out
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// medianDiff is the median over positions of (service − raw) for the same position.
func medianDiff(svc, raw []time.Duration) time.Duration {
	d := make([]time.Duration, len(svc))
	for i := range svc {
		d[i] = svc[i] - raw[i]
	}
	return median(d)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
