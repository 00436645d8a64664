package analysis

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"chessd/domain"
	"chessd/domain/position"
	"chessd/engine"
	"chessd/postgres/pgtest"
)

var catalog *engine.Catalog

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	var err error
	// one process per pool: consecutive searches run on the same process
	catalog, err = engine.Open(ctx, engine.Config{PoolSize: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	cancel()
	if err != nil {
		slog.Error("engines missing: run `make engines`", "err", err)
		os.Exit(1)
	}
	code := pgtest.Main(m)
	catalog.Close()
	os.Exit(code)
}

func spec(t *testing.T, req Request) Spec {
	t.Helper()
	s, err := Validate(req, catalog)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ptr[T any](v T) *T { return &v }

// A request at skill level 0 must leave nothing behind: the next full-strength search
// on the same process is exactly the search a fresh process would make (Stockfish is
// deterministic single-threaded after ucinewgame, so nodes and moves match).
func TestOptionsDoNotLeakBetweenRequests(t *testing.T) {
	svc := NewService(catalog, pgtest.NewDB(t), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx := context.Background()
	fen := "r1bqk2r/pppp1ppp/2n2n2/2b1p3/2B1P3/3P1N2/PPP2PPP/RNBQK2R w KQkq - 1 5"
	full := spec(t, Request{FEN: &fen, Depth: ptr(11)})
	weak := spec(t, Request{FEN: &fen, Depth: ptr(11), Options: &Options{SkillLevel: ptr(0), HashMB: ptr(64), MoveOverheadMS: ptr(500)}})
	if !weak.LimitStrength {
		t.Fatal("skill level 0 must count as limited strength")
	}
	baseline, err := svc.Analyse(ctx, full, engine.Interactive, false)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := svc.Analyse(ctx, weak, engine.Interactive, false); err != nil {
			t.Fatal(err)
		}
		got, err := svc.Analyse(ctx, full, engine.Interactive, false)
		if err != nil {
			t.Fatal(err)
		}
		if got.Nodes != baseline.Nodes || *got.BestMove != *baseline.BestMove || got.Eval != baseline.Eval {
			t.Fatalf("round %d after a skill-0 search: nodes %d move %s eval %+v; a clean process gives nodes %d move %s eval %+v",
				i, got.Nodes, *got.BestMove, got.Eval, baseline.Nodes, *baseline.BestMove, baseline.Eval)
		}
	}
}

func TestWhiteScore(t *testing.T) {
	cases := []struct {
		stm  string
		in   engine.Score
		want Score
	}{
		{"w", engine.Score{Value: 35}, Score{Type: "cp", Value: 35}},
		{"b", engine.Score{Value: 35}, Score{Type: "cp", Value: -35}},
		{"b", engine.Score{Mate: true, Value: 2}, Score{Type: "mate", Value: -2}},
		{"w", engine.Score{Mate: true, Value: -3}, Score{Type: "mate", Value: -3}},
		{"b", engine.Score{Value: 10, Bound: engine.BoundLower}, Score{Type: "cp", Value: -10, Bound: "upper"}},
		{"w", engine.Score{Value: 10, Bound: engine.BoundUpper}, Score{Type: "cp", Value: 10, Bound: "upper"}},
	}
	for _, tc := range cases {
		fen := "4k3/8/8/8/8/8/8/4K3 " + tc.stm + " - - 0 1"
		pos, err := position.Parse(fen, false)
		if err != nil {
			t.Fatal(err)
		}
		if got := whiteScore(pos.SideToMove(), tc.in); got != tc.want {
			t.Errorf("%s %+v: got %+v, want %+v", tc.stm, tc.in, got, tc.want)
		}
	}
}

// convert takes the best move's SAN from the first line when the line opens with it,
// and finds the move itself when it does not (a search stopped mid-iteration reports
// the last exact line, whose first move may differ) or when there is no line; both
// give what notnil writes for the move, also where the move could not be played (it
// would take the fullmove number past 100000). An illegal best move is an error
// either way.
func TestConvertBestMoveSAN(t *testing.T) {
	const start = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
	const castle = "r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1"
	const mate = "6k1/5ppp/8/8/8/8/8/3R2K1 w - - 0 1"
	cases := []struct {
		name, fen, best string
		pv              []string // the first line's moves; nil: no line
		wantSAN         string
		wantErr         bool
	}{
		{"opens the line", start, "g1f3", []string{"g1f3", "d7d5"}, "Nf3", false},
		{"opens the line, mate", mate, "d1d8", []string{"d1d8"}, "Rd8#", false},
		{"opens the line, castling", castle, "e1g1", []string{"e1g1", "e8c8"}, "O-O", false},
		{"not the line's first move", start, "e2e4", []string{"d2d4", "d7d5"}, "e4", false},
		{"no line", mate, "d1d8", nil, "Rd8#", false},
		{"no line, at the counters' limit", "4k3/8/8/8/8/8/8/4K3 b - - 0 100000", "e8d7", nil, "Kd7", false},
		{"illegal, no line", start, "e2e5", nil, "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pos, err := position.Parse(tc.fen, false)
			if err != nil {
				t.Fatal(err)
			}
			raw := &engine.Result{BestMove: tc.best, Engine: "sf-17.1"}
			if tc.pv != nil {
				raw.Lines = []engine.Line{{MultiPV: 1, Depth: 10, PV: tc.pv}}
			}
			res, err := convert(pos, raw, "Stockfish 17.1")
			if tc.wantErr {
				if err == nil {
					t.Fatalf("illegal best move %s accepted: %+v", tc.best, res)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if *res.BestMove != tc.best || *res.BestMoveSAN != tc.wantSAN {
				t.Errorf("best move %s / %s, want %s / %s", *res.BestMove, *res.BestMoveSAN, tc.best, tc.wantSAN)
			}
		})
	}
}

// A request that may use the cache waits for a running search of the same position
// (other move counters) instead of starting its own, and is answered as a cache hit;
// one that asks for more, or whose leader gives up, searches on its own.
func TestRepeatsWaitForTheRunningSearch(t *testing.T) {
	fen := "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"
	again := "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 9" // another fullmove number
	cases := []struct {
		name           string
		depth, multipv int // the repeat's
		moveTimeMS     int
		prio           engine.Priority // the repeat's; the leader is a job's (Batch), or lead's
		lead           engine.Priority
		leaderGivesUp  bool
		wantCached     bool
	}{
		{"same request", 16, 1, 0, engine.Batch, engine.Batch, false, true},
		{"shallower, fewer lines", 12, 1, 0, engine.Batch, engine.Batch, false, true},
		{"deeper", 17, 1, 0, engine.Batch, engine.Batch, false, false},
		{"more lines", 16, 2, 0, engine.Batch, engine.Batch, false, false},
		{"leader gives up", 16, 1, 0, engine.Batch, engine.Batch, true, false},
		{"a time limit of its own", 16, 1, 30000, engine.Batch, engine.Batch, false, false},
		{"interactive behind a job's search", 16, 1, 0, engine.Interactive, engine.Batch, false, false},
		{"a job's behind an interactive search", 16, 1, 0, engine.Batch, engine.Interactive, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			svc := NewService(catalog, pgtest.NewDB(t), slog.New(slog.NewTextHandler(io.Discard, nil)))
			leadCtx, giveUp := context.WithCancel(context.Background())
			defer giveUp()
			led := make(chan error, 1)
			go func() {
				_, err := svc.Analyse(leadCtx, spec(t, Request{FEN: &fen, Depth: ptr(16)}), c.lead, true)
				led <- err
			}()
			for deadline := time.Now().Add(10 * time.Second); svc.running() == 0; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the first search never showed as running")
				}
			}
			repeat := make(chan *Result, 1)
			go func() {
				req := Request{FEN: &again, Depth: ptr(c.depth), MultiPV: ptr(c.multipv)}
				if c.moveTimeMS > 0 {
					req.MoveTimeMS = ptr(c.moveTimeMS)
				}
				res, err := svc.Analyse(context.Background(), spec(t, req), c.prio, true)
				if err != nil {
					t.Error(err)
				}
				repeat <- res
			}()
			if c.leaderGivesUp {
				giveUp()
			}
			// an interactive search may preempt a job's (the test's pool is small)
			preempts := c.prio < c.lead
			if err := <-led; (err != nil) != c.leaderGivesUp && !preempts {
				t.Fatalf("leader: %v", err)
			}
			res := <-repeat
			if res == nil {
				return
			}
			if res.Cached != c.wantCached || res.Depth < c.depth || len(res.PVs) != c.multipv || res.FEN != again {
				t.Fatalf("repeat: cached %v depth %d lines %d fen %s; want cached %v", res.Cached, res.Depth, len(res.PVs), res.FEN, c.wantCached)
			}
			if svc.running() != 0 {
				t.Fatalf("%d searches still listed as running", svc.running())
			}
		})
	}
}

func (s *Service) running() int { return s.flights.count() }

// A search its time limit stopped short of its depth is not cached: the depth it
// reports was not completed. One that completes its depth within its limit is.
func TestTimeStoppedSearchesAreNotCached(t *testing.T) {
	svc := NewService(catalog, pgtest.NewDB(t), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx := context.Background()
	fen := "r1bq1rk1/ppp2ppp/2np1n2/2b1p3/2B1P3/2NP1N2/PPP2PPP/R1BQ1RK1 w - - 0 7"
	res, err := svc.Analyse(ctx, spec(t, Request{FEN: &fen, Depth: ptr(30), MoveTimeMS: ptr(100)}), engine.Interactive, true)
	if err != nil || res.Depth >= 30 {
		t.Fatalf("a 100 ms search to depth 30: %v, depth %d", err, res.Depth)
	}
	if _, ok, err := svc.Lookup(ctx, spec(t, Request{FEN: &fen, Depth: ptr(res.Depth)})); ok || err != nil {
		t.Fatalf("depth %d of a search stopped on time was cached (%v)", res.Depth, err)
	}
	if _, err := svc.Analyse(ctx, spec(t, Request{FEN: &fen, Depth: ptr(6), MoveTimeMS: ptr(30000)}), engine.Interactive, true); err != nil {
		t.Fatal(err)
	}
	if hit, ok, err := svc.Lookup(ctx, spec(t, Request{FEN: &fen, Depth: ptr(6)})); !ok || err != nil || hit.Depth < 6 {
		t.Fatalf("a search that completed depth 6 within its limit was not cached: %v %v", ok, err)
	}
}

// The cache answers a position at its own halfmove clock only (Stockfish's answer
// depends on it: a won ending at clock 99 is a draw), whatever its fullmove number.
func TestCacheKeepsTheHalfmoveClock(t *testing.T) {
	svc := NewService(catalog, pgtest.NewDB(t), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx := context.Background()
	fresh, late, later := "8/8/8/4k3/8/8/8/4K2Q w - - 0 80", "8/8/8/4k3/8/8/8/4K2Q w - - 99 80", "8/8/8/4k3/8/8/8/4K2Q w - - 0 93"
	if _, err := svc.Analyse(ctx, spec(t, Request{FEN: &fresh, Depth: ptr(10)}), engine.Interactive, true); err != nil {
		t.Fatal(err)
	}
	if hit, ok, err := svc.Lookup(ctx, spec(t, Request{FEN: &late, Depth: ptr(10)})); ok || err != nil {
		t.Fatalf("the answer at halfmove clock 0 was served at clock 99: %+v (%v)", hit.Eval, err)
	}
	res, err := svc.Analyse(ctx, spec(t, Request{FEN: &late, Depth: ptr(10)}), engine.Interactive, true)
	if err != nil || res.Cached || res.Eval != (Score{Type: "cp"}) {
		t.Fatalf("clock 99, one move from the fifty-move draw: %+v cached %v (%v); want a fresh cp 0", res.Eval, res.Cached, err)
	}
	if hit, ok, err := svc.Lookup(ctx, spec(t, Request{FEN: &later, Depth: ptr(10)})); !ok || err != nil || !strings.HasSuffix(hit.FEN, " 0 93") {
		t.Fatalf("another fullmove number at the same clock missed the cache (%v, %v) or kept the stored FEN", ok, err)
	}
}

// A position with fewer legal moves than the lines asked has a line per move. Its
// result answers the same request again from memory (a lookup whose context has ended
// cannot read PostgreSQL), and a request waiting for its search gets it.
func TestFewerMovesThanLines(t *testing.T) {
	svc := NewService(catalog, pgtest.NewDB(t), slog.New(slog.NewTextHandler(io.Discard, nil)))
	fen := "R6k/8/8/8/8/8/8/7K b - - 0 1" // in check: Kg7 and Kh7 only
	req := Request{FEN: &fen, Depth: ptr(10), MultiPV: ptr(3)}
	res, err := svc.Analyse(context.Background(), spec(t, req), engine.Interactive, true)
	if err != nil || res.Cached || len(res.PVs) != 2 {
		t.Fatalf("the first search: %v, cached %v, %d lines, want a fresh one with 2", err, res != nil && res.Cached, len(res.PVs))
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, multipv := range []int{1, 2, 3} {
		hit, ok, err := svc.Lookup(ended, spec(t, Request{FEN: &fen, Depth: ptr(10), MultiPV: ptr(multipv)}))
		if !ok || err != nil || len(hit.PVs) != min(multipv, 2) {
			t.Errorf("multipv %d from memory: found %v (%v)", multipv, ok, err)
		}
	}
	if _, ok, _ := svc.Lookup(ended, spec(t, Request{FEN: &fen, Depth: ptr(10), MultiPV: ptr(4)})); ok {
		t.Error("a result searched for 3 lines answered a request for 4")
	}

	fl := &flight{depth: 10, multipv: 3, done: make(chan struct{}), res: res}
	close(fl.done)
	if got, ok := fl.wait(context.Background(), 10, 3); !ok || got != res {
		t.Error("a request for 3 lines did not take the running search's result of 2 (all the moves)")
	}
}

// Only a whole search is cached or shared: every line at the depth asked, as many
// lines as asked or as the position has moves, and within its time limit (Stockfish
// stopped on time reports its last, partly searched depth).
func TestWhole(t *testing.T) {
	twoMoves, err := position.Parse("R6k/8/8/8/8/8/8/7K b - - 0 1", false) // Kg7, Kh7
	if err != nil {
		t.Fatal(err)
	}
	many, err := position.Parse("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3", false)
	if err != nil {
		t.Fatal(err)
	}
	lines := func(depths ...int) *Result {
		r := &Result{TimeMS: 99}
		for _, d := range depths {
			r.PVs = append(r.PVs, PV{Depth: d})
		}
		return r
	}
	timed := func(r *Result, ms int64) *Result { r.TimeMS = ms; return r }
	for _, tt := range []struct {
		name    string
		res     *Result
		pos     *position.Position
		multipv int
		want    bool
	}{
		{"every line at the depth", lines(14, 14, 14), many, 3, true},
		{"deeper than asked", lines(15, 15), many, 2, true},
		{"the last line a depth short (stopped during the last depth)", lines(14, 14, 13), many, 3, false},
		{"the first line short (stopped short of the depth)", lines(13), many, 1, false},
		{"a line missing", lines(14, 14), many, 3, false},
		{"fewer lines than asked: all the moves", lines(14, 14), twoMoves, 3, true},
		{"fewer lines than the moves", lines(14), twoMoves, 3, false},
		{"every line at the depth, stopped by its time limit", timed(lines(14, 14), 100), many, 2, false},
		{"every line at the depth, past its time limit", timed(lines(14), 101), many, 1, false},
	} {
		if got := whole(tt.res, tt.pos, Spec{Depth: 14, MultiPV: tt.multipv}, 100*time.Millisecond); got != tt.want {
			t.Errorf("%s: whole = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// The parse memo keeps the modes apart: a standard request's text can never name a
// Chess960 position remembered before it (a "960|"-prefixed FEN was once that very
// key, and went to the engine as a standard search, charged, or failed with a 500).
func TestParseMemoKeepsModesApart(t *testing.T) {
	svc := NewService(catalog, pgtest.NewDB(t), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx := context.Background()
	fen := "rk5r/pppppppp/8/8/8/8/PPPPPPPP/RK5R w HAha - 0 1"
	if _, _, err := svc.Lookup(ctx, spec(t, Request{FEN: &fen, Depth: ptr(6), Options: &Options{Chess960: ptr(true)}})); err != nil {
		t.Fatalf("the Chess960 position: %v", err)
	}
	for _, text := range []string{"960|" + fen, fen} {
		_, _, err := svc.Lookup(ctx, spec(t, Request{FEN: &text, Depth: ptr(6)}))
		var de *domain.Error
		if !errors.As(err, &de) || len(de.Fields) == 0 || de.Fields[0].Field != "fen" {
			t.Errorf("standard chess, %q: %v, want the fen refused", text, err)
		}
	}
}

// A job's stored FEN is read with position.ParseStored, its counters repaired, and a
// request's with Parse: the memo keeps the readings apart, so a request's text never
// names the position remembered for a job's (it would pass counters the rules refuse).
func TestParseMemoKeepsStoredReadingsApart(t *testing.T) {
	svc := NewService(catalog, pgtest.NewDB(t), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx := context.Background()
	fen := "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 5 1"
	stored := spec(t, Request{FEN: ptr("rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 2"), Depth: ptr(6)})
	stored.FEN, stored.Stored = fen, true
	if _, _, err := svc.Lookup(ctx, stored); err != nil {
		t.Fatalf("the stored position: %v", err)
	}
	_, _, err := svc.Lookup(ctx, spec(t, Request{FEN: &fen, Depth: ptr(6)}))
	var de *domain.Error
	if !errors.As(err, &de) || len(de.Fields) == 0 || de.Fields[0].Field != "fen" || !strings.Contains(de.Fields[0].Reason, "halfmove clock 5 is impossible") {
		t.Errorf("a request for %q: %v, want the fen refused for its clock", fen, err)
	}
}
