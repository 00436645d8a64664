package engine

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The stats /metrics reads: searches and their nodes, waits for a process by priority
// (a histogram of those that got one, a count of those that gave up), and the catalog
// naming every started pool.
func TestPoolStatsForMetrics(t *testing.T) {
	t.Parallel()
	pl := newPool(t, "sf-17.1", PathNative, func(c *PoolConfig) { c.QueueWait = 300 * time.Millisecond })
	res, err := pl.Search(context.Background(), Batch, Search{FEN: fenBlackMateIn1, Depth: 5})
	if err != nil {
		t.Fatal(err)
	}
	st := pl.Stats()
	if st.Searches != 1 || st.Nodes != res.Nodes || st.Nodes <= 0 {
		t.Errorf("after one search: %d searches, %d nodes (the result says %d)", st.Searches, st.Nodes, res.Nodes)
	}
	if w := st.QueueWait[Batch]; sum(w.Buckets[:]) != 1 || w.Saturated != 0 || st.QueueWait[Interactive] != (WaitStats{}) {
		t.Errorf("after one batch search: waits %+v", st.QueueWait)
	}

	// the first search's process back in the pool first: else it may read as busy
	// before the long search has it, and the next search would get it
	waitStats(t, pl, func(s PoolStats) bool { return s.Idle == s.Size })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := pl.Search(ctx, Interactive, longSearch)
		done <- err
	}()
	waitBusy(t, pl)
	if _, err := pl.Search(context.Background(), Interactive, Search{Depth: 1}); !errors.Is(err, ErrSaturated) {
		t.Fatalf("err = %v, want ErrSaturated", err)
	}
	cancel()
	<-done
	w := pl.Stats().QueueWait[Interactive]
	if w.Saturated != 1 || sum(w.Buckets[:]) != 1 {
		t.Errorf("after a saturated wait: %+v, want 1 saturated and the long search's wait", w)
	}
}

func TestCatalogStats(t *testing.T) {
	t.Parallel()
	cat := catalog(t)
	if _, err := cat.Search(context.Background(), "sf-17.1", PathNative, Interactive, Search{FEN: fenBlackMateIn1, Depth: 3}); err != nil {
		t.Fatal(err)
	}
	for _, p := range cat.Stats() {
		if p.Engine == "sf-17.1" && p.Path == PathNative {
			if p.Size < 1 || p.Searches < 1 {
				t.Errorf("sf-17.1/native: %+v", p.PoolStats)
			}
			return
		}
	}
	t.Errorf("no sf-17.1/native among %+v", cat.Stats())
}

func sum(xs []int64) int64 {
	var n int64
	for _, x := range xs {
		n += x
	}
	return n
}
