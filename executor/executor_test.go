package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/analysis"
	"chessd/commands"
	"chessd/domain"
	"chessd/engine"
	"chessd/eventstore"
	"chessd/executor"
	"chessd/ledger"
	"chessd/postgres/pgtest"
	"chessd/projections"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

const (
	fenWhiteMateIn1 = "r1bqkb1r/pppp1ppp/2n2n2/4p2Q/2B1P3/8/PPPP1PPP/RNB1K1NR w KQkq - 4 4"
	fenBlackMateIn1 = "rnbqkbnr/pppp1ppp/8/4p3/6P1/5P2/PPPPP2P/RNBQKBNR b KQkq g3 0 2"
	fenStart        = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
	fenWhiteIsMated = "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3" // the game is over
)

// Two executors with real engines share one database and two jobs: each job starts
// once and is never taken over, both workers analyse positions, each position is
// analysed (the mates found), recorded and charged exactly once, and the hold is given
// back at the end.
func TestExecutorRunsJobs(t *testing.T) {
	e := newEnv(t, 1)
	pool, cmds, ctx := e.pool, e.cmds, context.Background()
	for i := range 2 {
		e.run(t, executor.Config{Worker: fmt.Sprintf("w%d", i), Lease: 5 * time.Second, Scan: 200 * time.Millisecond, Parallel: 1})
	}

	key := signup(t, pool, cmds)
	// Each job opens with a search of some length (depth 16 from the start): the first
	// worker's first take (one to search, one ahead) keeps it busy that long, and the
	// second worker takes its share meanwhile. With the mates first (they take no
	// time), the first worker came back at once for the rest, its pace telling it to
	// hold more, before the second held anything to share with (the CI saw one worker
	// do all six).
	fens := [][]string{{fenStart, fenWhiteMateIn1, fenBlackMateIn1}, {fenStart, fenBlackMateIn1, fenWhiteMateIn1}}
	var jobs []*domain.Job
	for _, fs := range fens {
		jobs = append(jobs, submitAt(t, cmds, key, 16, fs))
	}

	var spent int64
	for n, j := range jobs {
		got := waitDone(t, pool, j.ID())
		if got.State() != domain.StateSucceeded {
			t.Fatalf("job %d ended %s: %+v", n, got.State(), got.Failure())
		}
		if s, r := count(t, pool, j.ID(), "JobStarted"), count(t, pool, j.ID(), "JobResumed"); s != 1 || r != 0 {
			t.Fatalf("job %d started %d times, resumed %d times", n, s, r)
		}
		if a := count(t, pool, j.ID(), "JobPositionAnalysed"); a != len(fens[n]) {
			t.Fatalf("job %d: %d positions recorded, want %d", n, a, len(fens[n]))
		}
		for i, fen := range fens[n] {
			p := got.Result(i)
			if p == nil {
				t.Fatalf("job %d position %d not recorded", n, i)
			}
			var r analysis.Result
			if err := json.Unmarshal(p.Result, &r); err != nil || r.BestMove == nil {
				t.Fatalf("job %d position %d: result %s (%v)", n, i, p.Result, err)
			}
			if want := map[string]string{fenWhiteMateIn1: "h5f7", fenBlackMateIn1: "d8h4"}[fen]; want != "" && *r.BestMove != want {
				t.Fatalf("job %d position %d: bestmove %s, want %s", n, i, *r.BestMove, want)
			}
			spent += p.Units
		}
		var charges int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE stream_id = $1 AND event_type = 'UnitsCharged'
			AND payload->'params'->>'job_id' = $2`, ledger.Stream(key.ID()), j.ID()).Scan(&charges); err != nil {
			t.Fatal(err)
		}
		if charges != len(fens[n]) {
			t.Fatalf("job %d: %d charges for %d positions", n, charges, len(fens[n]))
		}
	}
	bs, err := ledger.KeyBalances(ctx, pool, key.AccountID())
	if err != nil {
		t.Fatal(err)
	}
	if b := bs[key.ID()]; b.HeldUnits != 0 || b.SpentUnits != spent {
		t.Fatalf("balance: held %d, spent %d; want 0 and %d", b.HeldUnits, b.SpentUnits, spent)
	}
	var queued int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM job_queue`).Scan(&queued); err != nil || queued != 0 {
		t.Fatalf("%d positions left on the queue (%v)", queued, err)
	}
	var workers int
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT payload->>'worker') FROM events WHERE event_type = 'JobPositionAnalysed'`).Scan(&workers); err != nil || workers != 2 {
		t.Fatalf("positions analysed by %d workers, want both (%v)", workers, err)
	}
}

// A job stored before the counter rules (an earlier release, or an older server during
// a rolling deploy, accepted its FENs; commands.SubmitJob stores them as it did) runs:
// each position's counters that contradict its en passant square are repaired as the
// double step left them, the job succeeds with every position analysed, and its result
// gives the FEN as analysed. A request's FEN with the same counters is still refused,
// also once the job's reading of it is remembered.
func TestExecutorRunsAJobStoredBeforeTheCounterRules(t *testing.T) {
	e := newEnv(t, 1)
	e.run(t, executor.Config{Worker: "w", Parallel: 1})
	key := signup(t, e.pool, e.cmds)
	stored := []struct{ fen, analysed string }{
		{"rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 1", "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 2"},
		{"rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 5 1", "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 2"},
		{"rnbqkbnr/ppp1pppp/8/8/3pP3/8/PPPP1PPP/RNBQKBNR b KQkq e3 3 3", "rnbqkbnr/ppp1pppp/8/8/3pP3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 3"},
		{fenStart, fenStart}, // accepted by the rules: as it was
	}
	var fens []string
	for _, s := range stored {
		fens = append(fens, s.fen)
	}
	j := submit(t, e.cmds, key, fens)
	got := waitDone(t, e.pool, j.ID())
	if got.State() != domain.StateSucceeded || got.Done() != len(fens) {
		t.Fatalf("job ended %s with %d of %d done: %+v", got.State(), got.Done(), len(fens), got.Failure())
	}
	for i, s := range stored {
		var r analysis.Result
		if err := json.Unmarshal(got.Result(i).Result, &r); err != nil || r.BestMove == nil || r.FEN != s.analysed {
			t.Fatalf("position %d (%s): result %s (%v); want a best move for %s", i, s.fen, got.Result(i).Result, err, s.analysed)
		}
		body, err := json.Marshal(projections.PositionOf(got, i))
		if err != nil {
			t.Fatal(err)
		}
		var shown struct {
			FEN    string `json:"fen"`
			Status string `json:"status"`
		}
		if err := json.Unmarshal(body, &shown); err != nil || shown.FEN != s.analysed || shown.Status != "done" {
			t.Fatalf("position %d in the job's result: %s (%v); want done with fen %s", i, body, err, s.analysed)
		}
	}
	for _, s := range stored[:3] {
		_, err := e.svc.Analyse(context.Background(), analysis.Spec{FEN: s.fen, Depth: 6, MultiPV: 1, Engine: "sf-17.1", Path: engine.PathNative},
			engine.Interactive, true)
		if domain.ErrorCode(err) != domain.CodeInvalid || !strings.Contains(err.Error(), "impossible") {
			t.Fatalf("a request for %s: %v; want it refused for its counters", s.fen, err)
		}
	}
}

// An executor records the positions of a job that finish together in one
// transaction: with RecordEvery far longer than the job, the four positions it took at
// once are recorded and charged in a single transaction as soon as the last is
// analysed (the job's last positions are never held back for RecordEvery).
func TestExecutorRecordsAJobsPositionsTogether(t *testing.T) {
	e := newEnv(t, 2)
	pool, cmds, ctx := e.pool, e.cmds, context.Background()
	e.run(t, executor.Config{Worker: "w", Parallel: 2, RecordEvery: time.Hour})

	key := signup(t, pool, cmds)
	j := submit(t, cmds, key, []string{fenWhiteMateIn1, fenStart, fenBlackMateIn1, fenStart})
	if got := waitDone(t, pool, j.ID()); got.State() != domain.StateSucceeded || got.Done() != 4 {
		t.Fatalf("job ended %s with %d done", got.State(), got.Done())
	}
	var txs, positions, charges int
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT xmin::text), count(*) FILTER (WHERE event_type = 'JobPositionAnalysed'),
			count(*) FILTER (WHERE event_type = 'UnitsCharged')
		  FROM events WHERE (stream_id = $1 AND event_type = 'JobPositionAnalysed')
		     OR (stream_id = $2 AND event_type = 'UnitsCharged' AND payload->'params'->>'job_id' = $3)`,
		domain.JobStream(j.ID()), ledger.Stream(key.ID()), j.ID()).Scan(&txs, &positions, &charges); err != nil {
		t.Fatal(err)
	}
	if txs != 1 || positions != 4 || charges != 4 {
		t.Fatalf("%d positions and %d charges recorded in %d transactions; want 4 and 4 in one", positions, charges, txs)
	}
}

// A take that finds the queue empty is the last until the queue has news (a
// submission, a release, a lease running out): the searches still running do not
// each send another take as they end. Sixteen searchers share one engine, so that the
// first take holds all eight positions of the job (distinct, a few tens of
// milliseconds each) and the queue is dry from then on; the scan is an hour away.
// Counted from the worker's first take (an empty queue) to the job's end, the takes
// that found nothing are the one after the first search and a few more for news that
// came late (the listener's start, the submission's bus message: at most four in
// all); without the rule, one after nearly every search.
func TestExecutorStopsTakingFromAnEmptyQueue(t *testing.T) {
	e := newEnv(t, 1)
	x := e.run(t, executor.Config{Worker: "w", Scan: time.Hour, Parallel: 16, Ahead: 1})
	key := signup(t, e.pool, e.cmds)
	pgtest.WaitFor(t, "the worker's first look at the queue", func() bool { return x.Stats().Takes > 0 })
	before := x.Stats()
	fens := []string{ // after each of eight first moves
		"rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1",
		"rnbqkbnr/pppppppp/8/8/3P4/8/PPP1PPPP/RNBQKBNR b KQkq - 0 1",
		"rnbqkbnr/pppppppp/8/8/2P5/8/PP1PPPPP/RNBQKBNR b KQkq - 0 1",
		"rnbqkbnr/pppppppp/8/8/8/5N2/PPPPPPPP/RNBQKB1R b KQkq - 1 1",
		"rnbqkbnr/pppppppp/8/8/8/6P1/PPPPPP1P/RNBQKBNR b KQkq - 0 1",
		"rnbqkbnr/pppppppp/8/8/8/1P6/P1PPPPPP/RNBQKBNR b KQkq - 0 1",
		"rnbqkbnr/pppppppp/8/8/5P2/8/PPPPP1PP/RNBQKBNR b KQkq - 0 1",
		"rnbqkbnr/pppppppp/8/8/8/4P3/PPPP1PPP/RNBQKBNR b KQkq - 0 1",
	}
	j := submitAt(t, e.cmds, key, 11, fens)
	if got := waitDone(t, e.pool, j.ID()); got.State() != domain.StateSucceeded || got.Done() != len(fens) {
		t.Fatalf("job ended %s with %d done", got.State(), got.Done())
	}
	after := x.Stats()
	takes, empty := after.Takes-before.Takes, after.EmptyTakes-before.EmptyTakes
	if takes-empty < 1 || empty > 4 {
		t.Fatalf("%d takes during the job, %d of them found nothing; want at most 4 that found nothing", takes, empty)
	}
}

// A job is recorded once its own positions are done, not held back for another job's:
// with RecordEvery far longer than the test, job B's first position (a finished game,
// answered without an engine) waits for B's second (a deep search), while job A's only
// position, done meanwhile, is recorded at once and A succeeds with B still running.
func TestExecutorRecordsAJobWithoutWaitingForAnother(t *testing.T) {
	e := newEnv(t, 2)
	pool, cmds, ctx := e.pool, e.cmds, context.Background()
	key := signup(t, pool, cmds)
	// both on the queue before the executor starts: it takes all three positions at once
	b := submitAt(t, cmds, key, 30, []string{fenWhiteIsMated, fenStart})
	a := submitAt(t, cmds, key, 30, []string{fenWhiteIsMated})
	e.run(t, executor.Config{Worker: "w", Parallel: 2, RecordEvery: time.Hour})
	if got := waitDone(t, pool, a.ID()); got.State() != domain.StateSucceeded {
		t.Fatalf("job A ended %s", got.State())
	}
	// B's start commits beside its searches, so on a busy machine it may follow A's end:
	// wait for it, then B must still be running with its first position unrecorded
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := commands.LoadJob(ctx, pool, b.ID())
		if err != nil {
			t.Fatal(err)
		}
		if got.State() == domain.StateQueued && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if got.State() != domain.StateRunning || got.Done() != 0 {
			t.Fatalf("job B once A succeeded: %v, %d done; want running with its deep position still searching and its first one unrecorded",
				got.State(), got.Done())
		}
		return
	}
}

// A job's searches begin before its start commits, and its records wait for that
// commit: a job of one finished game, answered at once without an engine, is recorded
// as soon as it is started, never before (its record would be refused, and the
// position searched again once its lease ran out).
func TestExecutorRecordsOnlyAStartedJob(t *testing.T) {
	e := newEnv(t, 1)
	pool, cmds := e.pool, e.cmds
	x := e.run(t, executor.Config{Worker: "w", Parallel: 1, Lease: 3 * time.Second, RecordEvery: time.Hour})
	key := signup(t, pool, cmds)
	for n := range 10 {
		j := submit(t, cmds, key, []string{fenWhiteIsMated})
		if got := waitDone(t, pool, j.ID()); got.State() != domain.StateSucceeded || got.Done() != 1 {
			t.Fatalf("job %d ended %s with %d done", n, got.State(), got.Done())
		}
		if s, r, a := count(t, pool, j.ID(), "JobStarted"), count(t, pool, j.ID(), "JobResumed"),
			count(t, pool, j.ID(), "JobPositionAnalysed"); s != 1 || r != 0 || a != 1 {
			t.Fatalf("job %d: started %d times, resumed %d, %d positions recorded; want 1, 0, 1", n, s, r, a)
		}
		if got := x.Stats().Positions; got != int64(n+1) {
			t.Fatalf("after job %d: %d positions searched, want %d (each once)", n, got, n+1)
		}
	}
}

// An executor stopped at once, while its command subscriber is still starting, stops
// cleanly: Run returns nil (a `chessd worker` told to stop must not exit with an error).
func TestExecutorStoppedWhileStarting(t *testing.T) {
	e := newEnv(t, 1)
	for i := range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		x := executor.New(executor.Config{Worker: fmt.Sprintf("w%d", i)}, e.pool, e.cmds, e.svc, e.logger)
		done := make(chan error, 1)
		go func() { done <- x.Run(ctx) }()
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("run %d: Run returned %v after a stop", i, err)
		}
	}
}

// An executor whose take was sized by fast searches gives back what a deep job's
// searches will not reach soon: after depth-4 positions it takes all eight of a
// depth-18 job (its pace says they are quick), and once the first of them shows
// otherwise it puts the ones last taken back on the queue. Another account's job
// submitted meanwhile then runs before the deep job ends instead of after all eight;
// every position is still recorded once, none taken over.
func TestExecutorGivesBackWhatItWillNotReachSoon(t *testing.T) {
	e := newEnv(t, 1)
	pool := e.pool
	e.run(t, executor.Config{Worker: "w", Lease: 5 * time.Second, Scan: 200 * time.Millisecond, Parallel: 1, Ahead: 8})
	key, other := signup(t, pool, e.cmds), signup(t, pool, e.cmds)

	// One search, then the cache's answers: the pace falls to a fraction of a search at
	// depth 4, so that the next take holds Ahead (eight) however slow this machine's
	// searches are (under -race beside other packages' tests, four left it above the
	// 12.5 ms a search that eight in Horizon needs)
	warm := submitAt(t, e.cmds, key, 4, slices.Repeat([]string{fenStart}, 16))
	waitDone(t, pool, warm.ID())
	// eight distinct positions (the cache would answer a repeated one at once)
	deep := submitAt(t, e.cmds, key, 18, []string{
		"rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1", "rnbqkbnr/pppppppp/8/8/3P4/8/PPP1PPPP/RNBQKBNR b KQkq - 0 1",
		"rnbqkbnr/pppppppp/8/8/2P5/8/PP1PPPPP/RNBQKBNR b KQkq - 0 1", "rnbqkbnr/pppppppp/8/8/8/5N2/PPPPPPPP/RNBQKB1R b KQkq - 1 1",
		"rnbqkbnr/pppppppp/8/8/8/6P1/PPPPPP1P/RNBQKBNR b KQkq - 0 1", "rnbqkbnr/pppppppp/8/8/8/1P6/P1PPPPPP/RNBQKBNR b KQkq - 0 1",
		"rnbqkbnr/pppppppp/8/8/5P2/8/PPPPP1PP/RNBQKBNR b KQkq - 0 1", "rnbqkbnr/pppppppp/8/8/8/2N5/PPPPPPPP/R1BQKBNR b KQkq - 1 1"})
	pgtest.WaitFor(t, "the deep job's eight positions taken", func() bool {
		var n int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM job_queue WHERE job_id = $1 AND worker IS NOT NULL`, deep.ID()).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n == 8
	})
	quick := submitAt(t, e.cmds, other, 4, []string{fenStart})

	if got := waitDone(t, pool, quick.ID()); got.State() != domain.StateSucceeded {
		t.Fatalf("the other account's job ended %s", got.State())
	}
	j, err := commands.LoadJob(context.Background(), pool, deep.ID())
	if err != nil {
		t.Fatal(err)
	}
	if j.State().Terminal() {
		t.Fatalf("the deep job ended (%s) before the other account's job of one quick position: nothing was given back", j.State())
	}
	if got := waitDone(t, pool, deep.ID()); got.State() != domain.StateSucceeded {
		t.Fatalf("the deep job ended %s", got.State())
	}
	if a, r := count(t, pool, deep.ID(), "JobPositionAnalysed"), count(t, pool, deep.ID(), "JobResumed"); a != 8 || r != 0 {
		t.Fatalf("the deep job: %d positions recorded, resumed %d times; want 8 and 0", a, r)
	}
}

// A running executor says it is alive, so that other workers' takes leave it its share
// before it holds anything (commands.TakePositions): at its start, again three times a
// lease, and no more once it stopped.
func TestExecutorSaysItIsAlive(t *testing.T) {
	e := newEnv(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	x := executor.New(executor.Config{Worker: "alive", Lease: 3 * time.Second}, e.pool, e.cmds, e.svc, e.logger)
	done := make(chan error, 1)
	go func() { done <- x.Run(ctx) }()
	aliveUntil := func() (until time.Time, ok bool) {
		err := e.pool.QueryRow(context.Background(), `SELECT alive_until FROM job_workers WHERE worker = 'alive'`).Scan(&until)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		return until, err == nil
	}
	pgtest.WaitFor(t, "the worker's first word", func() bool { _, ok := aliveUntil(); return ok })
	first, _ := aliveUntil()
	pgtest.WaitFor(t, "a renewal", func() bool { until, _ := aliveUntil(); return until.After(first) })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if until, ok := aliveUntil(); ok {
		t.Fatalf("a stopped worker still alive until %v", until)
	}
}

// env is a test's database, command handler and engines (a pool of its own size).
type env struct {
	pool   *pgxpool.Pool
	cmds   *commands.Handler
	svc    *analysis.Service
	logger *slog.Logger
}

func newEnv(t *testing.T, engines int) *env {
	t.Helper()
	pool := pgtest.NewDB(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	openCtx, cancelOpen := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancelOpen()
	catalog, err := engine.Open(openCtx, engine.Config{PoolSize: engines, QueueWait: 20 * time.Second, Logger: logger})
	if err != nil {
		t.Fatalf("engines: %v (run `make engines`)", err)
	}
	t.Cleanup(func() { catalog.Close() }) //nolint:errcheck // closing
	return &env{pool: pool, cmds: commands.New(eventstore.NewStore(pool, logger), []byte("pepper-for-the-executor-test")),
		svc: analysis.NewService(catalog, pool, logger), logger: logger}
}

// run starts an executor that runs until the test ends.
func (e *env) run(t *testing.T, cfg executor.Config) *executor.Executor {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	x := executor.New(cfg, e.pool, e.cmds, e.svc, e.logger)
	go func() { done <- x.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("executor %s: %v", cfg.Worker, err)
		}
	})
	return x
}

// signup makes an account and returns its first key.
func signup(t *testing.T, pool *pgxpool.Pool, cmds *commands.Handler) *domain.Key {
	t.Helper()
	ctx := context.Background()
	res, err := cmds.Signup(ctx, domain.Signup{Email: commands.NewID("jobs") + "@example.com"}, "r")
	if err != nil {
		t.Fatal(err)
	}
	key, err := commands.LoadKey(ctx, pool, res.KeyID)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// submit queues a depth-6 batch of fens for key.
func submit(t *testing.T, cmds *commands.Handler, key *domain.Key, fens []string) *domain.Job {
	t.Helper()
	return submitAt(t, cmds, key, 6, fens)
}

// submitAt queues a batch of fens at depth for key.
func submitAt(t *testing.T, cmds *commands.Handler, key *domain.Key, depth int, fens []string) *domain.Job {
	t.Helper()
	var ps []domain.JobPosition
	for i, fen := range fens {
		ps = append(ps, domain.JobPosition{Index: i, FEN: fen})
	}
	price, err := ledger.Quote(domain.Call{Endpoint: domain.EndpointBatch, Depth: depth, MultiPV: 1, Positions: len(ps)})
	if err != nil {
		t.Fatal(err)
	}
	j, err := cmds.SubmitJob(context.Background(), commands.Actor{Key: key, RequestID: "r"}, domain.PlanFree.Limits().UnitsPerDay, domain.JobSubmitted{
		Kind: "batch", Spec: domain.JobSpec{Depth: depth, MultiPV: 1, Engine: "sf-17.1", Path: string(engine.PathNative)},
		Positions: ps, HoldUnits: price.Units, HoldUSD: price.USD}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// waitDone waits for the job to reach a final state.
func waitDone(t *testing.T, pool *pgxpool.Pool, jobID string) *domain.Job {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		j, err := commands.LoadJob(context.Background(), pool, jobID)
		if err != nil {
			t.Fatal(err)
		}
		if j.State().Terminal() {
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s still %s with %d done", jobID, j.State(), j.Done())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func count(t *testing.T, pool *pgxpool.Pool, jobID, eventType string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM events WHERE stream_id = $1 AND event_type = $2`,
		domain.JobStream(jobID), eventType).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A position this worker held whose lease ran out (a pause longer than the lease: its
// renewals failed) and that it then took again itself is one task, not two: once the
// job ends the worker runs nothing of it (Running), and the position is recorded and
// charged once.
func TestExecutorRetakingItsOwnPositionForgetsTheJobAtItsEnd(t *testing.T) {
	e := newEnv(t, 1)
	pool, ctx := e.pool, context.Background()
	// renewals every 20 s: the only new lease within the search is a take's
	x := e.run(t, executor.Config{Worker: "w", Lease: time.Minute, Scan: 50 * time.Millisecond, Parallel: 1})
	key := signup(t, pool, e.cmds)
	j := submitAt(t, e.cmds, key, 22, []string{fenStart})
	leased := func() (until time.Time) {
		err := pool.QueryRow(ctx, `SELECT COALESCE(lease_until, 'epoch') FROM job_queue WHERE job_id = $1 AND worker = 'w'`, j.ID()).Scan(&until)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		return until
	}
	pgtest.WaitFor(t, "the position taken", func() bool { return leased().After(time.Now()) })
	if _, err := pool.Exec(ctx, `UPDATE job_queue SET lease_until = now() - interval '1 second' WHERE job_id = $1`, j.ID()); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, "the position taken again by its worker", func() bool { return leased().After(time.Now()) })
	if got := waitDone(t, pool, j.ID()); got.State() != domain.StateSucceeded {
		t.Fatalf("the job ended %s", got.State())
	}
	var charges int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE stream_id = $1 AND event_type = 'UnitsCharged'`,
		ledger.Stream(key.ID())).Scan(&charges); err != nil {
		t.Fatal(err)
	}
	if a := count(t, pool, j.ID(), "JobPositionAnalysed"); a != 1 || charges != 1 {
		t.Fatalf("%d positions recorded, %d charges; want 1 and 1", a, charges)
	}
	pgtest.WaitFor(t, "the ended job forgotten", func() bool { return len(x.Running()) == 0 })
}
