package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"chessd/analysis"
	"chessd/commands"
	"chessd/domain"
	"chessd/domain/position"
	"chessd/engine"
	"chessd/executor"
	"chessd/postgres"
	"chessd/projections"
)

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

// jobs measures 50-position batches through the service (submit to the commit of
// JobSucceeded, cache off) against raw Stockfish on the same positions with as many
// processes, with one worker and with two, and single /eval latency while a batch runs.
func (b *bench) jobs() error {
	defer b.closeRaw()
	fens := jobPositions()
	fmt.Printf("\n## Jobs: 50-position batches against raw Stockfish (cache off)\n\n")
	fmt.Printf("%d distinct positions from two games. One worker: the server's own executor on its pool of 2 processes; two workers: "+
		"a second executor with its own pool of 2 joins it (4 processes). Raw: as many warm processes splitting the positions, ucinewgame after each, kept from run to run as the service's are. "+
		"Pairs: a raw run and a service job, raw first in every other pair; the interval is the median's 95 %% confidence interval from the pairs' order statistics "+
		"(the machine's speed moves between pairs: a target inside it is within what the run can tell). "+
		"Service time: submission until JobSucceeded is recorded. Engine ms and nodes: what the engines reported (info time, nodes). "+
		"Engines' CPU: the user and system time the engine processes used while the raw runs, or the jobs, ran (from /proc: the same nodes on both sides). "+
		"Searching: raw, go to bestmove; the service, the executors' time in analysis (acquiring a process, the search, conversion). "+
		"Engines idle: processes × run time − searching, per position (raw: resets between searches and the tail, where some processes have "+
		"nothing left; the service: also the job's start and its last record). "+
		"CPU outside the engines: what this process (the server, its executor and projections, the bench's client) and PostgreSQL used while the job ran, per position; "+
		"the same while the raw runs ran (the raw client's reading of the engines' output, and what the idle service and PostgreSQL spend anyway). "+
		"Wake-ups: the times this process's threads and PostgreSQL's processes went to sleep and were woken (voluntary context switches), "+
		"and the engines' threads were preempted (involuntary ones), per position: each takes a core from an engine for longer than its own work. "+
		"Takes: the executors' queries of the queue a job (those that found nothing).\n\n", len(fens))
	fmt.Println("| workers | processes | depth | raw positions/s | service positions/s | **service / raw, median pair** [95 % interval] | pairs | engine ms per position, raw / service | engines' CPU ms per position, raw / service | nodes per position, raw / service | searching ms per position, raw / service | engines idle ms per position, raw / service | CPU ms per position outside the engines: chessd / PostgreSQL | the same during the raw runs | wake-ups a position: chessd / PostgreSQL / engines preempted, service; raw | takes a job (empty) |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	b.svc.DisableCache()
	defer b.svc.EnableCache()
	depths, err := intList(*jobDepths)
	if err != nil {
		return err
	}
	workerCounts, err := intList(*jobWorkers)
	if err != nil {
		return err
	}
	for _, workers := range workerCounts {
		stop := func() {}
		execs := []*executor.Executor{b.exec}
		if workers == 2 {
			x, halt, err := b.secondWorker()
			if err != nil {
				return err
			}
			stop, execs = halt, append(execs, x)
		}
		for _, depth := range depths {
			top, err := b.jobRow(workers, depth, execs, fens)
			if err != nil {
				stop()
				return err
			}
			if top != nil { // printed after the table
				defer printStatementsPer(fmt.Sprintf("%d worker(s)' third depth-%d job", workers, depth), "position", top)
			}
		}
		stop()
	}

	if !*jobLatency {
		return nil
	}
	return b.evalLatency(fens)
}

// evalLatency measures sequential depth-10 evals alone and while depth-14 batches keep
// both engines busy.
func (b *bench) evalLatency(fens []string) error {
	n := *latencyEvals
	fmt.Printf("\n## Single POST /eval latency while a batch runs\n\n")
	fmt.Printf("Sequential depth-10 evals of one client (cache off), alone and while 50-position depth-14 batches use both processes "+
		"(one worker; a new batch is submitted as each one ends, so that two are always in flight until the last eval answers); "+
		"an eval that finds both busy preempts a batch search. %d evals each: the p99 is the %s slowest.\n\n", n, ordinal(n-n*99/100))
	fmt.Println("| while | evals | p50 ms | p99 ms | max ms |")
	fmt.Println("|---|---|---|---|---|")
	evals := func(n int) ([]time.Duration, error) {
		var lat []time.Duration
		for i := range n {
			t0 := time.Now()
			if err := b.post(b.url, "/eval", fmt.Sprintf(`{"fen":%q,"depth":10}`, positions[i%len(positions)]), b.key, nil); err != nil {
				return nil, err
			}
			lat = append(lat, time.Since(t0))
		}
		return lat, nil
	}
	idle, err := evals(n)
	if err != nil {
		return err
	}
	// batches, two in flight, each replaced as it ends until the evals are done
	evalsDone := make(chan struct{})
	batchErr := make(chan error, 1)
	firstRunning := make(chan string, 1)
	var inFlight atomic.Int32
	var batches sync.WaitGroup
	var submit func()
	submit = func() {
		batches.Go(func() {
			submitted := make(chan string, 1)
			inFlight.Add(1)
			go func() {
				if id, ok := <-submitted; ok {
					select {
					case firstRunning <- id:
					default:
					}
				}
			}()
			_, _, err := b.runJobNotify(fens, 14, submitted)
			close(submitted)
			inFlight.Add(-1)
			if err != nil {
				select {
				case batchErr <- err:
				default:
				}
				return
			}
			select {
			case <-evalsDone:
			default:
				submit()
			}
		})
	}
	submit()
	submit()
	stop := func() { close(evalsDone); batches.Wait() }
	var first string
	select {
	case first = <-firstRunning:
	case err := <-batchErr:
		stop()
		return err
	}
	if err := b.waitAnalysed(first, 1); err != nil { // both processes are on the batches
		stop()
		return err
	}
	pool, err := b.catalog.Pool(context.Background(), b.engineID, engine.PathNative)
	if err != nil {
		stop()
		return err
	}
	before := pool.Stats()
	busy, err := evals(n)
	after := pool.Stats()
	preempted := after.Preempted - before.Preempted
	running := inFlight.Load()
	stop()
	if err != nil {
		return err
	}
	select {
	case err := <-batchErr:
		return err
	default:
	}
	for _, row := range []struct {
		name string
		lat  []time.Duration
	}{{"idle", idle}, {"batches run", busy}} {
		sorted := append([]time.Duration(nil), row.lat...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
		fmt.Printf("| %s | %d | %.1f | %.1f | %.1f |\n", row.name, len(sorted), ms(sorted[len(sorted)/2]),
			ms(sorted[len(sorted)*99/100]), ms(sorted[len(sorted)-1]))
	}
	fmt.Printf("\nBatches in flight when the last eval answered: %d; batch searches preempted by the %d evals: %d.\n", running, n, preempted)
	// how long searches waited for a process meanwhile, by the pool's own histogram
	waits := func(prio engine.Priority) string {
		b, a := before.QueueWait[prio].Buckets, after.QueueWait[prio].Buckets
		var parts []string
		for i := range a {
			if d := a[i] - b[i]; d > 0 {
				bound := "longer"
				if i < len(engine.QueueWaitBuckets) {
					bound = "≤ " + engine.QueueWaitBuckets[i].String()
				}
				parts = append(parts, fmt.Sprintf("%s: %d", bound, d))
			}
		}
		return strings.Join(parts, ", ")
	}
	fmt.Printf("Waits for a process while the evals ran, interactive: %s; batch: %s.\n", waits(engine.Interactive), waits(engine.Batch))
	return nil
}

// latencyEvals is how many evals each latency row times. With 200 the p99 was the
// second slowest eval, and the idle row's moved from 21 to 35 ms between two runs of
// the same code (session 25): one hiccup of the machine decided the row.
var latencyEvals = flag.Int("latency-evals", 1000, "jobs part: sequential evals timed alone and while batches run (the p99 is the (n/100+1)th slowest)")

func ordinal(n int) string {
	switch n {
	case 1:
		return "1st"
	case 2:
		return "2nd"
	case 3:
		return "3rd"
	}
	return fmt.Sprintf("%dth", n)
}

// jobRounds is how many raw and service runs of the batch each row alternates. This
// machine's speed moves by a quarter from one second to the next (Stockfish's own
// bench, alone: 455,000 to 766,000 nodes/s in six runs in a row), and one pair with
// it: the row gives the median pair's ratio and its 95 % interval, over twenty pairs,
// and over forty-one at depth 10, where a batch takes under a second. That holds the
// interval to about ±0.03; seven and fifteen left it twice as wide, wider than the
// rows' distance from their targets.
var jobRounds = flag.Int("job-rounds", 20, "jobs part: raw and service runs of the batch each row alternates (twice as many plus one at depth 10; the row gives the median pair's ratio)")

// jobDepths and jobWorkers choose the jobs table's rows, to rerun the one under study.
var (
	jobDepths  = flag.String("job-depths", "10,14", "jobs part: the depths of the batches")
	jobWorkers = flag.String("job-workers", "1,2", "jobs part: the numbers of workers (1 or 2)")
	jobLatency = flag.Bool("job-latency", true, "jobs part: measure single evals' latency while a batch runs, after the table")
	// statementsDepth and statementsWorkers: PostgreSQL's top statements are taken
	// during the third job of this row (depth 0: none)
	statementsDepth   = flag.Int("job-statements-depth", 10, "jobs part: print PostgreSQL's top statements during the third job at this depth (0: none)")
	statementsWorkers = flag.Int("job-statements-workers", 1, "jobs part: the number of workers of the row whose statements are printed")
)

// intList parses a comma-separated list of integers.
func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%q: %w", s, err)
		}
		out = append(out, n)
	}
	return out, nil
}

// roundsAt is how many pairs a row at depth runs.
func roundsAt(depth int) int {
	if depth <= 10 {
		return 2*(*jobRounds) + 1
	}
	return max(*jobRounds, 1)
}

// jobRow measures one row of the jobs table: roundsAt(depth) pairs of a raw run and a
// service job on the same positions with as many processes, raw first in every other
// pair. For the row of -job-statements-depth and -job-statements-workers it returns
// PostgreSQL's top statements during its third job, the job's positions last
// (printStatementsPer).
func (b *bench) jobRow(workers, depth int, execs []*executor.Executor, fens []string) ([]postgres.Statement, error) {
	procs := 2 * workers
	var ratios []float64
	var rawTook, svcTook time.Duration
	var rawCount, svcCount engineCount
	var st execStats
	var cpu, rawCPU cpuTime
	var top []postgres.Statement
	for round := range roundsAt(depth) {
		var took time.Duration
		var rc engineCount
		raw := func() (err error) {
			// started outside the reading: loading a network is not a search's CPU
			if err := b.startRawAll(procs); err != nil {
				return err
			}
			cpuBefore := b.cpuNow()
			took, rc, err = b.runRawAll(depth, procs, fens)
			used := b.cpuNow().since(cpuBefore)
			rawCPU = rawCPU.add(used)
			return err
		}
		// the raw run goes first in even rounds, the service's job in odd ones: neither
		// side always follows the other
		if round%2 == 0 {
			if err := raw(); err != nil {
				return nil, err
			}
		}
		// the row that misses its target, on connections the rounds before have warmed
		// (a PL/pgSQL function's first call on a connection compiles it)
		statements := round == 2 && workers == *statementsWorkers && depth == *statementsDepth
		if statements {
			if err := postgres.StartStatements(context.Background(), b.pool); err != nil {
				return nil, err
			}
		}
		before, cpuBefore := statsOf(execs), b.cpuNow()
		jobTook, jobID, err := b.runJob(fens, depth)
		cpuAfter := b.cpuNow()
		if err != nil {
			return nil, err
		}
		if round%2 == 1 {
			if err := raw(); err != nil {
				return nil, err
			}
		}
		if statements {
			if top, err = postgres.TopStatements(context.Background(), b.pool, 12); err != nil {
				return nil, err
			}
			top = append(top, postgres.Statement{Calls: int64(len(fens))})
		}
		sc, err := b.jobEngineCount(jobID)
		if err != nil {
			return nil, err
		}
		d := statsOf(execs).minus(before)
		ratios = append(ratios, took.Seconds()/jobTook.Seconds())
		rawTook, svcTook = rawTook+took, svcTook+jobTook
		rawCount.add(rc)
		svcCount.add(sc)
		st.Positions, st.Searching = st.Positions+d.Positions, st.Searching+d.Searching
		st.Takes, st.EmptyTakes = st.Takes+d.Takes, st.EmptyTakes+d.EmptyTakes
		used := cpuAfter.since(cpuBefore)
		cpu = cpu.add(used)
	}
	n := float64(len(fens) * len(ratios))
	per := func(d time.Duration) float64 { return ms(d) / float64(max(st.Positions, 1)) }
	idle := time.Duration(procs)*svcTook - st.Searching // engine goroutines not in analysis while the jobs ran
	rawIdle := time.Duration(procs)*rawTook - rawCount.busy
	pairs := make([]string, len(ratios))
	for i, r := range ratios {
		pairs[i] = fmt.Sprintf("%.2f", r)
	}
	fmt.Printf("| %d | %d | %d | %.1f | %.1f | **%.2f**%s | %s | %.1f / %.1f | %.1f / %.1f | %d / %d | %.1f / %.1f | %.2f / %.2f | %.1f / %.1f | %.1f / %.1f | %s; %s | %.1f (%.1f) |\n", workers, procs, depth,
		n/rawTook.Seconds(), n/svcTook.Seconds(), medianFloat(ratios), interval(ratios, "%.2f"), strings.Join(pairs, ", "),
		float64(rawCount.timeMS)/n, float64(svcCount.timeMS)/n, ms(rawCPU.engines)/n, ms(cpu.engines)/n, rawCount.nodes/int64(n), svcCount.nodes/int64(n),
		ms(rawCount.busy)/n, per(st.Searching), ms(rawIdle)/n, per(idle), ms(cpu.self)/n, ms(cpu.pg)/n, ms(rawCPU.self)/n, ms(rawCPU.pg)/n, cpu.wakesPer(n), rawCPU.wakesPer(n),
		float64(st.Takes)/float64(len(ratios)), float64(st.EmptyTakes)/float64(len(ratios)))
	return top, nil
}

// secondWorker starts another executor with its own pool of two processes and analysis
// service (cache off) on the bench's database; halt stops it and its engines.
func (b *bench) secondWorker() (*executor.Executor, func(), error) {
	ctx, cancel := context.WithCancel(context.Background())
	cat, err := engine.Open(ctx, engine.Config{PoolSize: 2, Logger: b.logger})
	if err != nil {
		cancel()
		return nil, nil, err
	}
	svc := analysis.NewService(cat, b.pool, b.logger)
	svc.DisableCache()
	x := executor.New(executor.Config{Worker: "bench-2", Parallel: 2}, b.pool, b.cmds, svc, b.logger)
	done := make(chan error, 1)
	go func() { done <- x.Run(ctx) }()
	return x, func() {
		cancel()
		<-done
		cat.Close() //nolint:errcheck // the bench's own processes
	}, nil
}

type execStats executor.Stats

func statsOf(xs []*executor.Executor) execStats {
	var out execStats
	for _, x := range xs {
		s := x.Stats()
		out.Positions += s.Positions
		out.Searching += s.Searching
		out.Takes += s.Takes
		out.EmptyTakes += s.EmptyTakes
	}
	return out
}

func (s execStats) minus(o execStats) execStats {
	return execStats{Positions: s.Positions - o.Positions, Searching: s.Searching - o.Searching,
		Takes: s.Takes - o.Takes, EmptyTakes: s.EmptyTakes - o.EmptyTakes}
}

// runJob submits a batch and returns the time from submission to the commit of its
// JobSucceeded event.
func (b *bench) runJob(fens []string, depth int) (time.Duration, string, error) {
	return b.runJobNotify(fens, depth, nil)
}

// runJobNotify is runJob that sends the job's id on submitted once accepted.
func (b *bench) runJobNotify(fens []string, depth int, submitted chan<- string) (time.Duration, string, error) {
	body, _ := json.Marshal(map[string]any{"fens": fens, "depth": depth})
	var job struct {
		ID    string `json:"job_id"`
		State string `json:"state"`
	}
	start := time.Now()
	if err := b.post(b.url, "/batch", string(body), b.key, &job); err != nil {
		return 0, "", err
	}
	if submitted != nil {
		submitted <- job.ID
	}
	var finished time.Time
	err := b.waitJobRow(job.ID, func(head *projections.JobHead) (bool, error) {
		st, _ := domain.ParseJobState(head.State)
		switch st {
		case domain.StateSucceeded:
			finished = *head.FinishedAt
			return true, nil
		case domain.StateFailed, domain.StateCancelled:
			return false, fmt.Errorf("job %s: %s", job.ID, head.State)
		default:
			return false, nil
		}
	})
	return finished.Sub(start), job.ID, err
}

// waitAnalysed waits until a job has n positions recorded.
func (b *bench) waitAnalysed(jobID string, n int) error {
	return b.waitJobRow(jobID, func(head *projections.JobHead) (bool, error) { return head.PositionsDone >= n, nil })
}

// waitJobRow waits until done says the job's row in the jobs read model is as wanted,
// reading it when the jobs projection announces a change to the job (its NOTIFY), as
// GET /jobs/{id}/events does: nothing is read while nothing happens, so the bench's
// watching costs the measured job next to nothing (polling the job's stream did). It
// reads at most every watchEvery: the job's times come from its events (finished_at),
// not from when the bench saw them, so a read per event (one per position) would only
// take CPU from the job it measures.
func (b *bench) waitJobRow(jobID string, done func(*projections.JobHead) (bool, error)) error {
	const watchEvery = 25 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	changed, unsubscribe := b.wake.Subscribe(projections.JobStreamTopic(jobID))
	defer unsubscribe()
	var read time.Time
	for {
		time.Sleep(watchEvery - time.Since(read)) // the events of a burst: one read
		read = time.Now()
		head, err := projections.ReadJobHead(ctx, b.pool, jobID)
		if err != nil {
			return err
		}
		state := "not projected yet"
		if head != nil {
			state = head.State
			if ok, err := done(head); ok || err != nil {
				return err
			}
		}
		select {
		case <-changed:
		case <-time.After(time.Second): // a notification is never lost, but a bench should not hang on one
		case <-ctx.Done():
			return fmt.Errorf("job %s: still %s after 5 minutes", jobID, state)
		}
	}
}

// engineCount is what engines reported of their searches: nodes and time; busy is the
// searches' wall time on the raw side (go to bestmove).
type engineCount struct {
	nodes, timeMS int64
	busy          time.Duration
}

func (c *engineCount) add(o engineCount) {
	c.nodes, c.timeMS, c.busy = c.nodes+o.nodes, c.timeMS+o.timeMS, c.busy+o.busy
}

// closeRaw stops the jobs part's raw processes.
func (b *bench) closeRaw() {
	for _, e := range b.raw {
		e.close()
	}
	b.raw = nil
}

// runRawAll runs fens on conc raw processes, splitting them, and returns the time
// they took and what the engines reported. The processes live as long as the jobs
// part, as the service's pool does: started and ready (network loaded, startRawAll)
// before their first run, outside its CPU reading, and reset after each search
// (ucinewgame). With four new processes a run (two
// workers' row), a service job that followed a raw run ran at 0.80-0.82 of raw and
// one that followed another job at 0.91-0.94; kept, 0.86 and 0.93 (session 26). The
// likely cause: each new process loads its own copy of the network into fresh memory,
// which the service's processes then found the caches full of.
func (b *bench) runRawAll(depth, conc int, fens []string) (time.Duration, engineCount, error) {
	var count engineCount
	var mu sync.Mutex
	var wg sync.WaitGroup
	var next atomic.Int64
	engines := b.raw[:conc]
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
				busy := eng.search(fens[i], depth)
				mu.Lock()
				count.nodes += eng.last.nodes
				count.timeMS += eng.last.timeMS
				count.busy += busy
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return time.Since(start), count, nil
}

// startRawAll starts raw processes until there are n, each ready (network loaded).
func (b *bench) startRawAll(n int) error {
	for len(b.raw) < n {
		eng, err := startRaw(b.binary)
		if err != nil {
			return err
		}
		fmt.Fprintln(eng.in, "isready")
		eng.until("readyok")
		b.raw = append(b.raw, eng)
	}
	return nil
}

// jobEngineCount sums what the engines reported for a job's positions.
func (b *bench) jobEngineCount(jobID string) (engineCount, error) {
	var count engineCount
	j, err := commands.LoadJob(context.Background(), b.pool, jobID)
	if err != nil {
		return count, err
	}
	for _, p := range j.Positions() {
		r := j.Result(p.Index)
		if r == nil {
			continue
		}
		var res struct {
			Nodes  int64 `json:"nodes"`
			TimeMS int64 `json:"time_ms"`
		}
		if err := json.Unmarshal(r.Result, &res); err != nil {
			return count, err
		}
		count.nodes += res.Nodes
		count.timeMS += res.TimeMS
	}
	return count, nil
}
