// Command chessbench measures the service against raw Stockfish on loopback, in one run
// on the same positions and engine binary: raw UCI versus POST /eval (cache off) at
// several depths and concurrencies, and cached POST /eval throughput. It starts its own
// PostgreSQL cluster and server, and prints Markdown for docs/BENCHMARKS.md.
package main

import (
	"bufio"
	"bytes"
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
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"chessd/analysis"
	"chessd/commands"
	"chessd/engine"
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
	depths := flag.String("depths", "10,14,18", "depths to compare")
	rounds := flag.Int("rounds", 2, "passes over the positions per depth (deep ones: 1)")
	cachedFor := flag.Duration("cached", 5*time.Second, "duration of the cached-throughput run")
	flag.Parse()
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	b, err := start(ctx, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chessbench:", err)
		os.Exit(1)
	}
	defer b.close()

	fmt.Printf("## Raw Stockfish vs POST /eval (cache off)\n\n")
	fmt.Printf("Engine: %s native (%s), 1 thread, 16 MB hash, %d positions; the service runs 2 processes.\n\n", b.engineID, b.binary, len(positions))
	fmt.Println("| depth | concurrency | positions | raw wall s | service wall s | ratio | raw median ms | service median ms | added median ms |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for _, d := range strings.Split(*depths, ",") {
		var depth int
		fmt.Sscan(d, &depth)
		n := *rounds
		if depth >= 18 {
			n = 1
		}
		for _, conc := range []int{1, 2} {
			work := repeat(positions, n)
			raw, err := runRaw(b.binary, depth, conc, work)
			if err != nil {
				fmt.Fprintln(os.Stderr, "raw:", err)
				os.Exit(1)
			}
			svc, err := b.runService(depth, conc, work)
			if err != nil {
				fmt.Fprintln(os.Stderr, "service:", err)
				os.Exit(1)
			}
			fmt.Printf("| %d | %d | %d | %.2f | %.2f | %.3f | %.1f | %.1f | %+.2f |\n", depth, conc, len(work),
				raw.wall.Seconds(), svc.wall.Seconds(), svc.wall.Seconds()/raw.wall.Seconds(),
				ms(median(raw.each)), ms(median(svc.each)), ms(medianDiff(svc.each, raw.each)))
		}
	}

	fmt.Printf("\n## Cached POST /eval throughput (with a key, cache on)\n\n")
	for _, clients := range []int{4, 16} {
		rate, p50, p99, err := b.cached(clients, *cachedFor)
		if err != nil {
			fmt.Fprintln(os.Stderr, "cached:", err)
			os.Exit(1)
		}
		fmt.Printf("- %d clients, %s: **%.0f requests/s**, latency p50 %.2f ms, p99 %.2f ms\n", clients, *cachedFor, rate, ms(p50), ms(p99))
	}
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
}

func start(ctx context.Context, logger *slog.Logger) (*bench, error) {
	dir, err := os.MkdirTemp("", "chessbench-")
	if err != nil {
		return nil, err
	}
	b := &bench{dir: dir}
	b.cluster, err = postgres.NewCluster(filepath.Join(dir, "pg"), 5433, logger)
	if err != nil {
		return nil, err
	}
	if _, err := b.cluster.Start(ctx); err != nil {
		return nil, err
	}
	if err := postgres.CreateDatabase(ctx, b.cluster.URL("postgres"), "bench"); err != nil {
		return nil, err
	}
	pool, err := postgres.Open(ctx, b.cluster.URL("bench"), 40)
	if err != nil {
		return nil, err
	}
	if err := postgres.Migrate(ctx, pool, logger); err != nil {
		return nil, err
	}
	b.catalog, err = engine.Open(ctx, engine.Config{PoolSize: 2, Logger: logger})
	if err != nil {
		return nil, err
	}
	b.engineID = b.catalog.Default()
	b.binary = filepath.Join(engine.DefaultDir(), b.engineID, "stockfish")
	pepper := []byte("bench-pepper-0123456789")
	b.svc = analysis.NewService(b.catalog, pool, logger)
	store := eventstore.NewStore(pool, logger)
	api := httpapi.New(httpapi.Config{BaseURL: "http://127.0.0.1/v1", NoRateLimits: true}, httpapi.Deps{
		Pool: pool, Commands: commands.New(store, pepper),
		Auth: projections.NewAuthenticator(pool, pepper), Analysis: b.svc,
		Charger: ledger.NewCharger(ctx, store, logger), Logger: logger,
	})
	go projections.NewRunner(pool, logger, projections.Accounts{}, projections.Ledger{}).Run(ctx, nil) //nolint:errcheck // ends with the process
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b.url = "http://" + ln.Addr().String() + "/v1"
	b.srv = &http.Server{Handler: api}
	go b.srv.Serve(ln) //nolint:errcheck // closed at the end
	b.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var su struct {
		APIKey string `json:"api_key"`
	}
	if err := b.post("/signup", `{"email":"bench@example.com"}`, "", &su); err != nil {
		return nil, err
	}
	b.key = su.APIKey
	return b, nil
}

func (b *bench) close() {
	b.srv.Close()
	b.catalog.Close()
	b.cluster.Stop(context.Background()) //nolint:errcheck // best effort
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

type timing struct {
	wall time.Duration
	each []time.Duration // per position, in work order
}

// runParallel spreads work over conc workers; do returns the time one position took.
func runParallel(conc int, work []string, setup func(w int) (func(fen string) (time.Duration, error), func(), error)) (timing, error) {
	t := timing{each: make([]time.Duration, len(work))}
	var next atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	workers := make([]func(string) (time.Duration, error), conc)
	for w := range conc {
		do, done, err := setup(w)
		if err != nil {
			return t, err
		}
		defer done()
		workers[w] = do
	}
	start := time.Now()
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(work) {
					return
				}
				d, err := workers[w](work[i])
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				t.each[i] = d
			}
		}()
	}
	wg.Wait()
	t.wall = time.Since(start)
	return t, firstErr
}

// runRaw drives Stockfish directly over UCI: one process per worker, ucinewgame between
// positions (as the service's pool does), timing position + go until bestmove.
func runRaw(binary string, depth, conc int, work []string) (timing, error) {
	return runParallel(conc, work, func(int) (func(string) (time.Duration, error), func(), error) {
		cmd := exec.Command(binary)
		in, _ := cmd.StdinPipe()
		outPipe, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			return nil, nil, err
		}
		out := bufio.NewScanner(outPipe)
		until := func(prefix string) {
			for out.Scan() {
				if strings.HasPrefix(out.Text(), prefix) {
					return
				}
			}
		}
		fmt.Fprintln(in, "uci")
		until("uciok")
		fmt.Fprintln(in, "isready")
		until("readyok")
		do := func(fen string) (time.Duration, error) {
			fmt.Fprintln(in, "ucinewgame")
			fmt.Fprintln(in, "isready")
			until("readyok")
			start := time.Now()
			fmt.Fprintf(in, "position fen %s\ngo depth %d\n", fen, depth)
			until("bestmove")
			return time.Since(start), nil
		}
		return do, func() { fmt.Fprintln(in, "quit"); cmd.Wait() }, nil //nolint:errcheck // exiting
	})
}

func (b *bench) runService(depth, conc int, work []string) (timing, error) {
	b.svc.DisableCache()
	return runParallel(conc, work, func(int) (func(string) (time.Duration, error), func(), error) {
		return func(fen string) (time.Duration, error) {
			start := time.Now()
			err := b.post("/eval", fmt.Sprintf(`{"fen":%q,"depth":%d,"engine":%q,"path":"native"}`, fen, depth, b.engineID), b.key, nil)
			return time.Since(start), err
		}, func() {}, nil
	})
}

// cached measures throughput of cache hits: the positions are evaluated once, then
// clients ask for them again and again for d.
func (b *bench) cached(clients int, d time.Duration) (float64, time.Duration, time.Duration, error) {
	b.svc.EnableCache()
	for _, fen := range positions {
		if err := b.post("/eval", fmt.Sprintf(`{"fen":%q,"depth":10}`, fen), b.key, nil); err != nil {
			return 0, 0, 0, err
		}
	}
	var count atomic.Int64
	lat := make([][]time.Duration, clients)
	var wg sync.WaitGroup
	var failed atomic.Value
	stop := time.Now().Add(d)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bodies := make([][]byte, len(positions))
			for i, fen := range positions {
				bodies[i] = []byte(fmt.Sprintf(`{"fen":%q,"depth":10}`, fen))
			}
			for i := c; time.Now().Before(stop); i++ {
				req, _ := http.NewRequest("POST", b.url+"/eval", bytes.NewReader(bodies[i%len(bodies)]))
				req.Header.Set("Authorization", "Bearer "+b.key)
				t0 := time.Now()
				res, err := b.client.Do(req)
				if err != nil {
					failed.Store(err)
					return
				}
				io.Copy(io.Discard, res.Body) //nolint:errcheck // draining
				res.Body.Close()
				if res.StatusCode != 200 {
					failed.Store(fmt.Errorf("status %d", res.StatusCode))
					return
				}
				lat[c] = append(lat[c], time.Since(t0))
				count.Add(1)
			}
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		return 0, 0, 0, err
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	return float64(count.Load()) / d.Seconds(), all[len(all)/2], all[len(all)*99/100], nil
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
