package engine

import (
	"bufio"
	"context"
	"io"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The Depth14 benchmarks measure what the pool adds over driving Stockfish by hand:
// same binary, same positions in the same order, a fresh game before each search (the
// pool's reset; timer stopped in the raw benchmark, off the request path in the pool),
// one search at a time. Each reports the median per-search latency as median-ms;
// compare the two medians:
//
//	go test -run '^$' -bench 'Depth14|Depth1$' -benchtime 40x ./engine
//
// BenchmarkPairedDepth14 gives the overhead directly (median of per-search differences).

var benchFENs = []string{
	"rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1",
	"r1bqkbnr/pppp1ppp/2n5/4p3/2B1P3/5N2/PPPP1PPP/RNBQK2R b KQkq - 3 3",
	fenMiddlegame,
	"8/2p5/3p4/KP5r/1R3p1k/8/4P1P1/8 w - - 0 1",
	"r4rk1/1pp1qppp/p1np1n2/2b1p1B1/2B1P1b1/P1NP1N2/1PP1QPPP/R4RK1 w - - 0 10",
}

// rawEngine drives a Stockfish process by hand, with nothing of this package but its
// pipes: the baseline the pool is measured against.
type rawEngine struct {
	in  io.WriteCloser
	out *bufio.Scanner
	tb  testing.TB
}

func startRaw(tb testing.TB) *rawEngine {
	tb.Helper()
	return startRawBuild(tb, "sf-17.1", PathNative)
}

func startRawBuild(tb testing.TB, id string, path Path) *rawEngine {
	tb.Helper()
	cmd := exec.Command(enginePath(tb, id, path))
	in, out, err := StartPiped(cmd) // the pool's pipes: the same cost to read a line
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_, _ = io.WriteString(in, "quit\n")
		_ = in.Close()
		_ = cmd.Wait()
		_ = out.Close()
	})
	r := &rawEngine{in: in, out: bufio.NewScanner(out), tb: tb}
	r.send("uci")
	r.until("uciok")
	return r
}

func (r *rawEngine) send(s string) { _, _ = io.WriteString(r.in, s+"\n") }

func (r *rawEngine) until(prefix string) {
	for r.out.Scan() {
		if strings.HasPrefix(r.out.Text(), prefix) {
			return
		}
	}
	r.tb.Fatalf("engine output ended before %q", prefix)
}

// search sends go, then returns the info lines up to the bestmove and that line.
func (r *rawEngine) search(fen, limits string) (info []string, best string) {
	r.send("position fen " + fen + "\ngo " + limits)
	for r.out.Scan() {
		switch l := r.out.Text(); {
		case strings.HasPrefix(l, "info "):
			info = append(info, l)
		case strings.HasPrefix(l, "bestmove"):
			return info, l
		}
	}
	r.tb.Fatalf("engine output ended before bestmove")
	return nil, ""
}

func (r *rawEngine) newGame() {
	r.send("ucinewgame\nisready")
	r.until("readyok")
}

func (r *rawEngine) depth14(fen string) time.Duration {
	start := time.Now()
	r.send("position fen " + fen + "\ngo depth 14")
	r.until("bestmove")
	return time.Since(start)
}

func BenchmarkRawUCIDepth14(b *testing.B) {
	r := startRaw(b)
	durs := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		r.newGame()
		b.StartTimer()
		durs = append(durs, r.depth14(benchFENs[i%len(benchFENs)]))
	}
	reportMedian(b, durs)
}

// BenchmarkPairedDepth14 alternates a raw search and a pool search of the same
// position (the engine is deterministic: same nodes, same work) and reports the median
// of the per-pair differences, which cancels most noise from a busy machine.
func BenchmarkPairedDepth14(b *testing.B) {
	r := startRaw(b)
	pl := newPool(b, "sf-17.1", PathNative, nil)
	ctx := context.Background()
	var raws, pools, diffs []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		fen := benchFENs[i%len(benchFENs)]
		r.newGame()
		onlyProcess(b, pl)
		viaPool := func() time.Duration {
			start := time.Now()
			if _, err := pl.Search(ctx, Interactive, Search{FEN: fen, Depth: 14}); err != nil {
				b.Fatal(err)
			}
			return time.Since(start)
		}
		// Alternate which goes first so neither gains from running second.
		var raw, pool time.Duration
		if i%2 == 0 {
			raw, pool = r.depth14(fen), viaPool()
		} else {
			pool, raw = viaPool(), r.depth14(fen)
		}
		raws, pools, diffs = append(raws, raw), append(pools, pool), append(diffs, pool-raw)
	}
	b.StopTimer()
	med := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	b.ReportMetric(med(raws), "raw-median-ms")
	b.ReportMetric(med(pools), "pool-median-ms")
	b.ReportMetric(med(diffs), "overhead-median-ms")
}

func BenchmarkPoolDepth14(b *testing.B) {
	pl := newPool(b, "sf-17.1", PathNative, nil)
	ctx := context.Background()
	durs := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		onlyProcess(b, pl) // the previous search's reset is done
		b.StartTimer()
		start := time.Now()
		if _, err := pl.Search(ctx, Interactive, Search{FEN: benchFENs[i%len(benchFENs)], Depth: 14}); err != nil {
			b.Fatal(err)
		}
		durs = append(durs, time.Since(start))
	}
	reportMedian(b, durs)
}

func reportMedian(b *testing.B, durs []time.Duration) {
	b.Helper()
	if len(durs) == 0 {
		return
	}
	slices.Sort(durs)
	b.ReportMetric(float64(durs[len(durs)/2].Microseconds())/1000, "median-ms")
}

// BenchmarkPoolOverhead isolates the pool's own per-request cost: a depth-1 search
// from the start position takes the engine a fraction of a millisecond.
func BenchmarkPoolOverheadDepth1(b *testing.B) {
	pl := newPool(b, "sf-17.1", PathNative, nil)
	ctx := context.Background()
	durs := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		onlyProcess(b, pl)
		b.StartTimer()
		start := time.Now()
		if _, err := pl.Search(ctx, Interactive, Search{Depth: 1}); err != nil {
			b.Fatal(err)
		}
		durs = append(durs, time.Since(start))
	}
	reportMedian(b, durs)
}

func BenchmarkParseInfo(b *testing.B) {
	line := "info depth 14 seldepth 19 multipv 1 score cp 34 wdl 61 925 14 nodes 170239 nps 1203178 hashfull 60 tbhits 0 time 141 pv e2e4 e7e5 g1f3 b8c6 f1b5 a7a6 b5a4 g8f6"
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, ok := ParseInfo(line); !ok {
			b.Fatal("not parsed")
		}
	}
}

// BenchmarkPoolCPU measures what driving the engines costs this process: two searches
// at a time at depth 12 on a pool of two, so the engines keep both cores busy as in a
// batch job, and this process's CPU per search as cpu-us/search, of which sys-us/search
// in the kernel (reads, writes, wake-ups). Its wake-ups then compete with the engines
// for the cores.
func BenchmarkPoolCPU(b *testing.B) {
	pl := newPool(b, "sf-17.1", PathNative, func(c *PoolConfig) { c.Size = 2 })
	searchTwoAtATime(b, func(_, i int) error {
		_, err := pl.Search(context.Background(), Batch, Search{FEN: benchFENs[i%len(benchFENs)], Depth: 12})
		return err
	})
}

// BenchmarkRawCPU is BenchmarkPoolCPU's baseline: two Stockfish processes driven by
// hand (a scanner each, a fresh game after each search), nothing of this package.
func BenchmarkRawCPU(b *testing.B) {
	raws := []*rawEngine{startRaw(b), startRaw(b)}
	searchTwoAtATime(b, func(worker, i int) error {
		r := raws[worker]
		r.send("position fen " + benchFENs[i%len(benchFENs)] + "\ngo depth 12")
		r.until("bestmove")
		r.newGame()
		return nil
	})
}

// searchTwoAtATime runs search for b.N positions on two goroutines (worker 0 and 1)
// and reports this process's CPU per search.
func searchTwoAtATime(b *testing.B, search func(worker, i int) error) {
	b.ResetTimer()
	user, sys := processCPU(b)
	var next atomic.Int64
	var wg sync.WaitGroup
	for worker := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < b.N; i = int(next.Add(1)) - 1 {
				if err := search(worker, i); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	user2, sys2 := processCPU(b)
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N) }
	b.ReportMetric(per(user2-user+sys2-sys), "cpu-us/search")
	b.ReportMetric(per(sys2-sys), "sys-us/search")
}

// processCPU is this process's CPU time so far, in user space and in the kernel.
func processCPU(tb testing.TB) (user, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}
