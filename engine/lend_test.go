package engine

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestLend: a lent process is driven over UCI by the borrower, info lines included;
// the pool's next search gets the process lent last (what chessbench's raw side
// relies on), and a process the borrower fails on is replaced.
func TestLend(t *testing.T) {
	t.Parallel()
	pl := newPool(t, "sf-17.1", PathNative, func(c *PoolConfig) { c.Size = 2 })
	ctx := context.Background()
	searchRaw := func(l *Lent) (best string, depths int, err error) {
		best, err = l.Exchange(ctx, "bestmove", func(line string) {
			if strings.Contains(line, " depth ") {
				depths++
			}
		}, "position fen "+fenWhiteMateIn1, "go depth 6")
		if err != nil {
			return "", 0, err
		}
		_, err = l.Exchange(ctx, "readyok", nil, "ucinewgame", "isready")
		return best, depths, err
	}

	var lent []int
	for range 2 {
		err := pl.Lend(ctx, func(l *Lent) error {
			best, depths, err := searchRaw(l)
			if err != nil {
				return err
			}
			if best != "bestmove h5f7" || depths < 6 {
				t.Errorf("lent search: %q after %d info lines with a depth, want bestmove h5f7 after at least 6", best, depths)
			}
			lent = append(lent, l.PID)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if lent[0] != lent[1] {
		t.Fatalf("two loans at rest got processes %d and %d, want the same", lent[0], lent[1])
	}
	// the next search takes the process lent last, and puts it back last
	if res, err := pl.Search(ctx, Interactive, Search{FEN: fenWhiteMateIn1, Depth: 6}); err != nil || res.BestMove != "h5f7" {
		t.Fatalf("search after the loans: %+v, %v", res, err)
	}
	pl.mu.Lock()
	last := pl.idle[len(pl.idle)-1].pid
	pl.mu.Unlock()
	if last != lent[1] {
		t.Fatalf("the search after a loan ran on process %d, want the lent %d", last, lent[1])
	}

	// a borrower that fails leaves a process nobody knows the state of: replaced
	boom := errors.New("boom")
	err := pl.Lend(ctx, func(l *Lent) error {
		if _, err := l.Exchange(ctx, "info depth 5", nil, "position startpos", "go depth 30"); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("failed loan: %v, want boom", err)
	}
	waitStats(t, pl, func(s PoolStats) bool { return s.Live == 2 && s.Idle == 2 })
	pl.mu.Lock()
	for p := range pl.all {
		if p.pid == lent[1] {
			t.Errorf("the process a loan failed on (%d) is still in the pool", p.pid)
		}
	}
	pl.mu.Unlock()
	if res, err := pl.Search(ctx, Interactive, Search{FEN: fenWhiteMateIn1, Depth: 6}); err != nil || res.BestMove != "h5f7" {
		t.Fatalf("search after the failed loan: %+v, %v", res, err)
	}
}

// A loan that waits for a process gets it straight from a search, dirty: it is reset,
// and the reset done, before the borrower's function runs. A borrower that panics
// leaves a process that is replaced.
func TestLendAfterASearch(t *testing.T) {
	t.Parallel()
	pl := newPool(t, "sf-17.1", PathNative, nil)
	ctx := context.Background()
	searched := make(chan error, 1)
	go func() {
		_, err := pl.Search(ctx, Interactive, Search{FEN: fenMiddlegame, Depth: 14})
		searched <- err
	}()
	waitBusy(t, pl)
	err := pl.Lend(ctx, func(l *Lent) error {
		if l.p.dirty || l.p.resetting.Load() != 0 {
			t.Errorf("lent dirty (%v) or still resetting (%d)", l.p.dirty, l.p.resetting.Load())
		}
		best, err := l.Exchange(ctx, "bestmove", nil, "position fen "+fenWhiteMateIn1, "go depth 6")
		if err == nil && best != "bestmove h5f7" {
			t.Errorf("lent search: %q", best)
		}
		if err != nil {
			return err
		}
		_, err = l.Exchange(ctx, "readyok", nil, "ucinewgame", "isready")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-searched; err != nil {
		t.Fatal(err)
	}

	before := onlyProcess(t, pl)
	func() {
		defer func() { _ = recover() }()
		pl.Lend(ctx, func(*Lent) error { panic("borrower") }) //nolint:errcheck // it panics
	}()
	waitStats(t, pl, func(s PoolStats) bool { return s.Live == 1 && s.Idle == 1 })
	if after := onlyProcess(t, pl); after == before {
		t.Fatal("the process a borrower panicked on is back in the pool")
	}
}

// Closing the pool while a process is lent ends the borrower's wait with ErrClosed: the
// bestmove an engine gives as it quits is no answer.
func TestCloseWhileLent(t *testing.T) {
	t.Parallel()
	pl := newPool(t, "sf-17.1", PathNative, nil)
	ctx := context.Background()
	lent := make(chan error, 1)
	go func() {
		lent <- pl.Lend(ctx, func(l *Lent) error {
			_, err := l.Exchange(ctx, "bestmove", nil, "position startpos", "go infinite")
			return err
		})
	}()
	waitBusy(t, pl)
	waitSearching(t, onlyBusyProcess(t, pl))
	if err := pl.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-lent:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("loan ended with %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the loan did not end after Close")
	}
}

// onlyBusyProcess is the single process of a size-1 pool while it is in use.
func onlyBusyProcess(t *testing.T, pl *Pool) *process {
	t.Helper()
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for p := range pl.all {
		return p
	}
	t.Fatal("no process")
	return nil
}

// TestExchangeEndsWhenOutputEndsButTheEngineRuns: a lent engine that closes its output
// but keeps running is killed, and Exchange returns at once with ErrEngineFailed; it
// waited for the engine to exit (here 20 s).
func TestExchangeEndsWhenOutputEndsButTheEngineRuns(t *testing.T) {
	t.Parallel()
	path := fakeEngine(t, `while read -r line; do
	case "$line" in
	uci) echo "id name Fake"; echo uciok ;;
	isready) echo readyok ;;
	close) exec >&-; exec sleep 20 ;;
	esac
done
`)
	ctx := context.Background()
	pl, err := NewPool(ctx, PoolConfig{Path: path, Size: 1, Boost: -1, StartTimeout: 10 * time.Second, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	errc := make(chan error, 1)
	go func() {
		errc <- pl.Lend(ctx, func(l *Lent) error {
			_, err := l.Exchange(ctx, "bestmove", nil, "close")
			return err
		})
	}()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrEngineFailed) {
			t.Fatalf("Lend: %v, want ErrEngineFailed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Exchange still waiting 5 s after the engine closed its output")
	}
}
