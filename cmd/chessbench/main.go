// Command chessbench measures the service against raw Stockfish and against a trivial Go
// JSON handler on loopback, in one run on the same positions and engine binary: raw UCI
// versus POST /eval (cache off) at several depths and concurrencies; cached POST /eval
// throughput, charged and keyless, on one server and on two replicas of one database,
// against the trivial handler driven by the same wrk command; charges per second against
// the number of accounts; the usage projection's lag; and jobs. It starts its own
// PostgreSQL cluster and servers, and prints Markdown for docs/BENCHMARKS.md.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"chessd/engine"
	"chessd/gctune"
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
	concs := flag.String("concurrencies", "1,2", "concurrencies of the paired comparison")
	nPairs := flag.Int("pairs", 120, "distinct positions per depth and concurrency in the paired comparison and its null (depth 18: at most 20)")
	nullRounds := flag.Int("null-rounds", 4, "rounds of the null part, each with fresh processes")
	cachedFor := flag.Duration("cached", 5*time.Second, "duration of each wrk run")
	conns := flag.String("conns", "4,16,32,64", "wrk connections of the one-server cached runs")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run here")
	parts := flag.String("parts", "paired,jobs,stream,cached,replicas,accounts", "which measurements to run (also: null, rebuild, usage)")
	warnings := flag.Bool("warnings", false, "log the servers' warnings and errors to stderr (a deadlock, a forgiven call); the end of a run adds the shutdown's")
	flag.Parse()
	for name, list := range map[string]string{"depths": *depths, "concurrencies": *concs, "conns": *conns} {
		if _, err := positiveInts(list); err != nil {
			return fmt.Errorf("-%s: %w", name, err)
		}
	}
	gctune.Apply() // the servers and workers in this process run as chessd's do
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil && pprof.StartCPUProfile(f) == nil {
			defer pprof.StopCPUProfile()
		}
	}
	ctx := context.Background()
	// as a server run with LOG_LEVEL=warn: no access log line per request
	logTo := io.Discard
	if *warnings {
		logTo = os.Stderr
	}
	logger := slog.New(slog.NewJSONHandler(logTo, &slog.HandlerOptions{Level: slog.LevelWarn}))
	b, err := start(ctx, logger)
	if b != nil {
		defer b.close()
	}
	if err != nil {
		return err
	}

	run := func(part string) bool { return strings.Contains(*parts, part) }
	if run("paired") {
		if err := b.pairedAll(*depths, *concs, *nPairs); err != nil {
			return err
		}
	}
	if run("null") { // not by default: what the paired part reads for a service that costs nothing
		if err := b.nullAll(*depths, *nPairs, *nullRounds); err != nil {
			return fmt.Errorf("null: %w", err)
		}
	}
	if run("jobs") {
		if err := b.jobs(); err != nil {
			return fmt.Errorf("jobs: %w", err)
		}
	}
	if run("stream") {
		if err := b.streamLatency(); err != nil {
			return fmt.Errorf("stream: %w", err)
		}
	}
	if run("cached") {
		counts, _ := positiveInts(*conns) // checked above
		if err := b.cachedAll(*cachedFor, counts); err != nil {
			return err
		}
	}
	if run("replicas") {
		if err := b.replicasAll(ctx, logger, *cachedFor); err != nil {
			return fmt.Errorf("replicas: %w", err)
		}
	}
	if run("accounts") {
		if err := b.accountsAll(ctx, *cachedFor); err != nil {
			return fmt.Errorf("accounts: %w", err)
		}
	}
	if run("rebuild") { // not by default: it adds a 200,000-charge log to the database
		if err := b.rebuildAll(ctx, 1000, 200_000, 50); err != nil {
			return fmt.Errorf("rebuild: %w", err)
		}
	}
	if run("usage") { // not by default: it adds a million charges to the database
		if err := b.usageAll(ctx, 1_000_000, 1_000, 50); err != nil {
			return fmt.Errorf("usage: %w", err)
		}
	}
	return nil
}

// pairedAll compares raw Stockfish with POST /eval at each depth, concurrency 1 and 2,
// each pair on a position not searched before at that depth and concurrency.
func (b *bench) pairedAll(depths, concs string, nPairs int) error {
	fresh := freshPositions()
	fmt.Printf("## Raw Stockfish vs POST /eval (cache off)\n\n")
	fmt.Printf("Engine: %s native (%s), 1 thread, 16 MB hash; the service runs 2 processes.\n", b.engineID, b.binary)
	fmt.Println("Paired: each worker runs each position raw, on a process of the service's pool lent to the bench (engine.Pool.Lend: at")
	fmt.Println("concurrency 1 the very process the service's calls run on, so the two sides differ by the service alone, not by two processes'")
	fmt.Println("speeds), and through the service, alternating which goes first; every pair is a distinct position (cache off; both sides")
	fmt.Println("reset with ucinewgame after each search, untimed: at concurrency 1 each side's timed search starts once the resets are done).")
	fmt.Println("Positions: the fixed ones and the two games', then the same with the colours swapped (freshPositions); 120 pairs a row")
	fmt.Println("(depth 18: 20): with 40, the null part's ratio spread 0.97-1.02 from round to round, with 120 0.99-1.01 (session 37).")
	fmt.Println("ratio of medians = median service time / median raw time; median pair ratio = median over pairs of service / raw (the same position")
	fmt.Println("on both sides: positions that take long and short do not mix into it), with its 95 % interval (order statistics); ratio of totals = total service / total raw; added = median over pairs of (service − raw).")
	fmt.Println("HTTP alone (concurrency 1): after the pairs, for each, the client waits as long as its raw search took and times one POST to a")
	fmt.Println("trivial Go JSON handler on loopback (the machine's round trip after an idle wait: a service's least cost here); bound = median")
	fmt.Println("pair ratio of (raw + that round trip) / raw, what a service with no time of its own could reach on this machine.")
	fmt.Println("Null (concurrency 1): then the same positions raw on both sides, on the same lent process, paired alike (-parts null): the")
	fmt.Println("median pair ratio of raw against raw, with its interval, what this run reads for a service that costs nothing at all.")
	fmt.Println()
	fmt.Println("| depth | concurrency | pairs | raw median ms | service median ms | **ratio of medians** | **median pair ratio** | raw total s | service total s | ratio of totals | added median ms | HTTP alone ms | bound | null: raw / raw |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	var breakdown []string
	ds, _ := positiveInts(depths) // checked in run
	cs, _ := positiveInts(concs)
	for _, depth := range ds {
		n := min(nPairs, len(fresh))
		if depth >= 18 { // four times as long a search: 20 pairs keep the part within a minute or two
			n = max(1, min(n/2, 20))
		}
		for _, conc := range cs {
			pairs, err := b.paired(depth, conc, fresh[:n])
			if err != nil {
				return fmt.Errorf("paired: %w", err)
			}
			raw, svc := pairs.raw(), pairs.svc()
			ratios := pairRatios(svc, raw)
			alone, bound, null := "–", "–", "–"
			if conc == 1 {
				n, err := b.null(depth, fresh[:n], true)
				if err != nil {
					return fmt.Errorf("null: %w", err)
				}
				null = fmt.Sprintf("%.3f%s", medianFloat(n.ratios), interval(n.ratios, "%.3f"))
				trivial := pairs.each(func(p pair) time.Duration { return p.trivial })
				alone = fmt.Sprintf("%.2f", ms(median(trivial)))
				with := make([]time.Duration, len(raw))
				for i := range raw {
					with[i] = raw[i] + trivial[i]
				}
				bound = fmt.Sprintf("%.3f", medianFloat(pairRatios(with, raw)))
			}
			fmt.Printf("| %d | %d | %d | %.1f | %.1f | **%.3f** | **%.3f**%s | %.2f | %.2f | %.3f | %+.2f | %s | %s | %s |\n", depth, conc, len(raw),
				ms(median(raw)), ms(median(svc)), float64(median(svc))/float64(median(raw)), medianFloat(ratios), interval(ratios, "%.3f"),
				sum(raw).Seconds(), sum(svc).Seconds(), sum(svc).Seconds()/sum(raw).Seconds(), ms(medianDiff(svc, raw)), alone, bound, null)
			rawFirst, svcFirst := pairs.orderRatios()
			besideCPU := "–" // at concurrency 2 the two workers' spans overlap
			if conc == 1 {
				besideCPU = pairs.besideCPU()
			}
			breakdown = append(breakdown, fmt.Sprintf("| %d | %d | %s / %s | %+.2f | %+.1f | %d | **%.3f** | %.2f | %.2f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %s |", depth, conc,
				rawFirst, svcFirst,
				ms(pairs.median(func(p pair) time.Duration { return p.phase["engine"] - p.raw })),
				ms(pairs.median(func(p pair) time.Duration { return p.svcOwn - p.rawOwn })),
				pairs.nodesDiffer(),
				ms(pairs.median(func(p pair) time.Duration { return p.phase["total"] - p.phase["engine"] })),
				ms(pairs.median(func(p pair) time.Duration { return p.svc - p.phase["engine"] })),
				ms(pairs.median(func(p pair) time.Duration { return p.svc - p.phase["total"] })),
				ms(pairs.median(func(p pair) time.Duration { return p.phase["auth"] })),
				ms(pairs.median(func(p pair) time.Duration { return p.phase["request"] })),
				ms(pairs.median(func(p pair) time.Duration { return p.phase["analysis"] - p.phase["engine"] })),
				ms(pairs.median(func(p pair) time.Duration {
					return p.phase["total"] - p.phase["auth"] - p.phase["request"] - p.phase["analysis"]
				})),
				ms(pairs.median(func(p pair) time.Duration { return p.phase["client:send"] + p.phase["client:receive"] })),
				ms(pairs.median(func(p pair) time.Duration { return p.phase["client:wait"] - p.phase["total"] })), besideCPU))
		}
	}
	fmt.Println()
	fmt.Println("Where the service's time goes, from its Server-Timing header (medians over the same pairs, ms):")
	fmt.Println("by order: the median pair ratio of the pairs whose raw search went first, and of those whose service call did (the second")
	fmt.Println("search of a pair runs on a process the first has left cold: at depth 14 its engine counts about 2 ms more, whichever side it is);")
	fmt.Println("engine − raw: the pool's search (hand-over, options, position, go ... bestmove, parsing) against the raw search;")
	fmt.Println("of it, search − raw search: the search's own time as the engine reports it (info time, whole ms: the service's search against the raw one);")
	fmt.Println("nodes differ: pairs whose two searches reported different node counts (0: both sides searched alike);")
	fmt.Println("own time: the service's time outside the engine by its Server-Timing header (total − engine: what issue 12's 1 ms is about);")
	fmt.Println("outside the engine: the client's whole time minus the pool's search; of it, HTTP (client time minus handler time),")
	fmt.Println("auth (key from memory, vouched for by the watcher, scope), request (decode, validate, caps, lookup, reserve from the lease),")
	fmt.Println("conversion (SAN, White's view, JSON), after the answer (hand the line item to the settler: in memory, nothing durable);")
	fmt.Println("HTTP split: the client's own send and receive (until the request is written, from the answer's first byte to its last),")
	fmt.Println("and the server outside its total (from the request written to the answer's first byte, minus the handler's total).")
	fmt.Println("CPU beside the engine (concurrency 1): the mean CPU a side's span used (from just before its timed part to just after),")
	fmt.Println("service / raw, by this process (the service, its background work and the bench's client) and by PostgreSQL: what may")
	fmt.Println("slow an engine whose vCPU shares a core with another; the service's extra is its request's handling, the rest the same.")
	fmt.Println()
	fmt.Println("| depth | concurrency | median pair ratio: raw first / service first | engine − raw | search − raw search | nodes differ | **own time** | outside the engine, client-side | HTTP | auth | request | conversion | after the answer | HTTP: client send + receive | HTTP: server outside its total | CPU beside the engine ms, service / raw: this process; PostgreSQL |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, l := range breakdown {
		fmt.Println(l)
	}
	return nil
}

// pair is one position run raw and through the service, with the service's
// Server-Timing phases and each side's search time as its engine reported it.
type pair struct {
	raw, svc       time.Duration
	rawOwn, svcOwn time.Duration
	// each side's node count: the same search does the same work
	rawNodes, svcNodes int64
	phase              map[string]time.Duration
	// trivial is a trivial Go handler's round trip after an idle wait as long as the
	// raw search (concurrency 1 only): what HTTP alone costs the service here
	trivial time.Duration
	// svcFirst: the service's call went first (the order alternates, pair by pair)
	svcFirst bool
	// the CPU used beside the engine from just before each side's timed part to just
	// after it, by this process and by PostgreSQL (concurrency 1 only)
	svcBeside, rawBeside cpuSpan
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

// besideCPU formats the mean CPU used beside the engine over each side's spans.
func (ps pairs) besideCPU() string {
	var svc, raw cpuSpan
	for _, p := range ps {
		svc.self, svc.pg = svc.self+p.svcBeside.self, svc.pg+p.svcBeside.pg
		raw.self, raw.pg = raw.self+p.rawBeside.self, raw.pg+p.rawBeside.pg
	}
	n := time.Duration(max(1, len(ps)))
	return fmt.Sprintf("%.2f / %.2f; %.2f / %.2f", ms(svc.self/n), ms(raw.self/n), ms(svc.pg/n), ms(raw.pg/n))
}

// paired runs work on conc workers; each runs every position both raw, on a process of
// the service's own pool lent to it (lentSearch), and through the service (cache off),
// alternating the order. It returns the raw and service times of each pair.
func (b *bench) paired(depth, conc int, work []string) (pairs, error) {
	b.svc.DisableCache()
	var mu sync.Mutex
	var wg sync.WaitGroup
	var next atomic.Int64
	var out pairs
	errs := make(chan error, conc)
	beside := b.newBesideEngine()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(work) {
					return
				}
				var p pair
				var err, rawErr error
				runSvc := func() {
					// Alone, the call waits for the service's engines to finish their
					// resets, as the raw search starts after its own (lentSearch):
					// both sides' resets untimed. A call within ~2 ms of the previous
					// answer otherwise caught that answer's reset, the raw side never.
					if conc == 1 {
						if err = b.atRest(); err != nil {
							return
						}
					}
					c0 := beside.now()
					t0 := time.Now()
					var reported int64
					p.phase, reported, p.svcNodes, err = b.timedPost("/eval", fmt.Sprintf(`{"fen":%q,"depth":%d,"engine":%q,"path":"native"}`, work[i], depth, b.engineID), b.key)
					p.svc, p.svcOwn = time.Since(t0), time.Duration(reported)*time.Millisecond
					p.svcBeside = beside.now().sub(c0)
				}
				runRaw := func() {
					// Alone, the raw search waits for the service's engines to finish
					// their resets: it must not share the machine with the service's
					// leftovers (at concurrency 2 the other worker's calls share it anyway).
					if conc == 1 {
						if rawErr = b.atRest(); rawErr != nil {
							return
						}
					}
					var s rawSearch
					c0 := beside.now()
					s, rawErr = b.lentSearch(work[i], depth)
					p.raw, p.rawOwn, p.rawNodes = s.took, time.Duration(s.timeMS)*time.Millisecond, s.nodes
					p.rawBeside = beside.now().sub(c0)
				}
				if p.svcFirst = i%2 == 1; p.svcFirst {
					runSvc()
					runRaw()
				} else {
					runRaw()
					runSvc()
				}
				if err == nil {
					err = rawErr
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
	if err := <-errs; err != nil {
		return nil, err
	}
	if conc == 1 {
		return out, b.httpAlone(out, depth)
	}
	return out, nil
}

// httpAlone times, for each pair after the pairs (not between them: the pairs run as
// before), one POST to a trivial Go handler after the client has waited as long as
// the pair's raw search: what HTTP alone costs a client that waited a search long.
func (b *bench) httpAlone(ps pairs, depth int) error {
	trivial, err := b.trivialURLs(1)
	if err != nil {
		return err
	}
	for i := range ps {
		time.Sleep(ps[i].raw)
		t0 := time.Now()
		if err := b.post(trivial[0], "/eval", fmt.Sprintf(`{"fen":%q,"depth":%d}`, positions[i%len(positions)], depth), "", nil); err != nil {
			return err
		}
		ps[i].trivial = time.Since(t0)
	}
	return nil
}

// atRest waits until every process of the service's native pool is idle and done
// with the reset after its last search (its readyok read).
func (b *bench) atRest() error {
	pool, err := b.catalog.Pool(context.Background(), b.engineID, engine.PathNative)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for s := pool.Stats(); s.Idle < s.Live || s.Resetting > 0; s = pool.Stats() {
		if time.Now().After(deadline) {
			return fmt.Errorf("the service's engines are not at rest after 10 s: %d of %d idle, %d resetting", s.Idle, s.Live, s.Resetting)
		}
		time.Sleep(100 * time.Microsecond)
	}
	return nil
}

// timedPost posts body and returns the answer's Server-Timing phases, its time_ms (the
// engine's own count of the search) and its nodes.
func (b *bench) timedPost(path, body, key string) (map[string]time.Duration, int64, int64, error) {
	req, _ := http.NewRequest("POST", b.url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	// the client's side of the exchange: until the request is written, and from the
	// answer's first byte until its last
	start := time.Now()
	var wrote, first time.Time
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		WroteRequest:         func(httptrace.WroteRequestInfo) { wrote = time.Now() },
		GotFirstResponseByte: func() { first = time.Now() },
	}))
	res, err := b.client.Do(req)
	if err != nil {
		return nil, 0, 0, err
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	end := time.Now()
	if res.StatusCode >= 300 {
		return nil, 0, 0, fmt.Errorf("%s: %d %s", path, res.StatusCode, raw)
	}
	phases := map[string]time.Duration{"client:send": wrote.Sub(start), "client:wait": first.Sub(wrote), "client:receive": end.Sub(first)}
	for _, m := range strings.Split(res.Header.Get("Server-Timing"), ",") {
		name, dur, ok := strings.Cut(strings.TrimSpace(m), ";dur=")
		var v float64
		if _, err := fmt.Sscan(dur, &v); ok && err == nil {
			phases[name] = time.Duration(v * float64(time.Millisecond))
		}
	}
	var answer struct {
		TimeMS int64 `json:"time_ms"`
		Nodes  int64 `json:"nodes"`
	}
	if err := json.Unmarshal(raw, &answer); err != nil {
		return nil, 0, 0, fmt.Errorf("%s: %w", path, err)
	}
	return phases, answer.TimeMS, answer.Nodes, nil
}

// rawSearch is one raw search: its time by the client's clock, and the engine's own
// count of it (nodes and time, from its last info line with both).
type rawSearch struct {
	took          time.Duration
	nodes, timeMS int64
}

// count takes the nodes and time of an info line that has both.
func (s *rawSearch) count(line string) {
	f := strings.Fields(line)
	var nodes, ms int64
	for i := 0; i+1 < len(f); i++ {
		switch f[i] {
		case "nodes":
			nodes, _ = strconv.ParseInt(f[i+1], 10, 64)
		case "time":
			ms, _ = strconv.ParseInt(f[i+1], 10, 64)
		}
	}
	if nodes > 0 {
		s.nodes, s.timeMS = nodes, ms
	}
}

// lentSearch is the paired part's raw side: Stockfish driven over UCI as a client
// without our service would (position + go until bestmove, timed; then ucinewgame and
// isready, untimed), on a process of the service's own native pool lent to the bench
// (engine.Pool.Lend). At rest the pool lends the process it took back last and gives
// its next search the process lent last, so at concurrency 1 both sides of every pair
// run on one process: two processes of one binary differ by 1-3 % in speed on this
// VM (the null part), as much as the service's own cost. Nothing of the pool's runs
// between the bench and the engine but the goroutine that reads the engine's output,
// which hands the info lines to count as it reads them (as it does a search's).
func (b *bench) lentSearch(fen string, depth int) (rawSearch, error) {
	pool, err := b.catalog.Pool(context.Background(), b.engineID, engine.PathNative)
	if err != nil {
		return rawSearch{}, err
	}
	var s rawSearch
	err = pool.Lend(context.Background(), func(l *engine.Lent) error {
		ctx := context.Background()
		start := time.Now()
		if _, err := l.Exchange(ctx, "bestmove", s.count, "position fen "+fen, fmt.Sprintf("go depth %d", depth)); err != nil {
			return err
		}
		s.took = time.Since(start)
		_, err := l.Exchange(ctx, "readyok", nil, "ucinewgame", "isready")
		return err
	})
	return s, err
}

// rawEngine is Stockfish driven directly over UCI on a process of its own, as a client
// without our service would: position + go until bestmove, timed, then ucinewgame and
// isready, untimed, ready for the next position. The reset comes after the search, as
// the service's pool resets a process after each request: a reset right before the
// timed search left the raw side's hash and histories warm in the caches (just
// cleared) and the pool's cold, about 1 ms of a 100 ms depth-14 search at concurrency
// 1 (docs/BENCHMARKS.md, session 13). The jobs part and the null part's two-process
// rows use it.
type rawEngine struct {
	cmd     *exec.Cmd
	in      io.WriteCloser
	outPipe io.Closer
	out     *bufio.Scanner
	last    rawSearch // the last search's counts
}

func startRaw(binary string) (*rawEngine, error) {
	cmd := exec.Command(binary)
	// the pools' pipes: reading a line costs the raw side what it costs the service
	in, out, err := engine.StartPiped(cmd)
	if err != nil {
		return nil, err
	}
	e := &rawEngine{cmd: cmd, in: in, outPipe: out, out: bufio.NewScanner(out)}
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
	defer func() {
		fmt.Fprintln(e.in, "ucinewgame")
		fmt.Fprintln(e.in, "isready")
		e.until("readyok")
	}()
	e.last = rawSearch{}
	start := time.Now()
	fmt.Fprintf(e.in, "position fen %s\ngo depth %d\n", fen, depth)
	for e.out.Scan() {
		line := e.out.Text()
		if strings.HasPrefix(line, "bestmove") {
			break
		}
		e.last.count(line)
	}
	e.last.took = time.Since(start)
	return e.last.took
}

func (e *rawEngine) close() {
	fmt.Fprintln(e.in, "quit")
	e.cmd.Wait() //nolint:errcheck // exiting
	e.in.Close()
	e.outPipe.Close()
}

func sum(d []time.Duration) time.Duration {
	var t time.Duration
	for _, v := range d {
		t += v
	}
	return t
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

// nodesDiffer counts the pairs whose sides' node counts differ.
func (ps pairs) nodesDiffer() int {
	n := 0
	for _, p := range ps {
		if p.rawNodes != p.svcNodes {
			n++
		}
	}
	return n
}

// orderRatios is the median pair ratio of the pairs whose raw search went first, and
// of those whose service call did ("–" for none).
func (ps pairs) orderRatios() (rawFirst, svcFirst string) {
	var r, s pairs
	for _, p := range ps {
		if p.svcFirst {
			s = append(s, p)
		} else {
			r = append(r, p)
		}
	}
	ratio := func(ps pairs) string {
		if len(ps) == 0 {
			return "–"
		}
		return fmt.Sprintf("%.3f", medianFloat(pairRatios(ps.svc(), ps.raw())))
	}
	return ratio(r), ratio(s)
}

// pairRatios are svc[i] / raw[i], pair by pair.
func pairRatios(svc, raw []time.Duration) []float64 {
	r := make([]float64, len(svc))
	for i := range svc {
		r[i] = float64(svc[i]) / float64(max(raw[i], 1))
	}
	return r
}

// medianFloat is the median of xs (taken as median does).
func medianFloat(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// positiveInts reads a comma-separated list of positive integers ("10,14,18").
func positiveInts(list string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a list of positive integers", list)
		}
		out = append(out, n)
	}
	return out, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
