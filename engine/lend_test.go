package engine

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestLend: a lent process is driven over UCI by the borrower, info lines included;
// the pool's next search gets the process lent last (what chessbench's raw side
// relies on), and a process the borrower fails on is replaced.
func TestLend(t *testing.T) {
	t.Parallel()
	pl := newPool(t, "sf-17.1", PathNative, func(c *PoolConfig) { c.Size = 2 })
	ctx := context.Background()
	searchRaw := func(l *Lent) (best string, depths int, err error) {
		if err := l.Send("position fen "+fenWhiteMateIn1, "go depth 6"); err != nil {
			return "", 0, err
		}
		best, err = l.Until(ctx, "bestmove", func(line string) {
			if strings.Contains(line, " depth ") {
				depths++
			}
		})
		if err != nil {
			return "", 0, err
		}
		if err := l.Send("ucinewgame", "isready"); err != nil {
			return "", 0, err
		}
		_, err = l.Until(ctx, "readyok", nil)
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
		if err := l.Send("position startpos", "go depth 30"); err != nil {
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
