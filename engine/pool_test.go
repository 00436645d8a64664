package engine

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestPreemptAgainAfterAnAgedBatchWaiter: an interactive search's preemption frees a
// process that a batch waiter past BatchMaxWait takes first (as it may); another running
// batch search is then preempted for the interactive one, which is served well within
// QueueWait instead of waiting for a batch search to end (review).
func TestPreemptAgainAfterAnAgedBatchWaiter(t *testing.T) {
	t.Parallel()
	pl := newPool(t, "sf-17.1", PathNative, func(c *PoolConfig) {
		c.Size = 2
		c.BatchMaxWait = 100 * time.Millisecond
		c.QueueWait = 3 * time.Second
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	batch := make(chan error, 3)
	for range 2 {
		go func() {
			_, err := pl.Search(ctx, Batch, longSearch)
			batch <- err
		}()
	}
	waitBusy(t, pl)
	go func() {
		_, err := pl.Search(ctx, Batch, longSearch)
		batch <- err
	}()
	waitStats(t, pl, func(s PoolStats) bool { return s.Waiting == [numPriorities]int{0, 1} })
	time.Sleep(300 * time.Millisecond) // the batch waiter is now past BatchMaxWait
	start := time.Now()
	res, err := pl.Search(context.Background(), Interactive, Search{FEN: fenBlackMateIn1, Depth: 5})
	if err != nil || res.BestMove != "d8h4" {
		t.Fatalf("interactive search behind an aged batch waiter: %+v, %v (after %v)", res, err, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("interactive search served after %v", time.Since(start).Round(time.Millisecond))
	// both running batch searches were stopped: one for the aged waiter, one for us
	for range 2 {
		if err := <-batch; !errors.Is(err, ErrPreempted) {
			t.Errorf("a running batch search ended with %v, want ErrPreempted", err)
		}
	}
	if st := pl.Stats(); st.Preempted != 2 {
		t.Errorf("preempted = %d, want 2", st.Preempted)
	}
	cancel() // the aged batch search, which is not preemptible
	if err := <-batch; !errors.Is(err, context.Canceled) {
		t.Errorf("the aged batch search ended with %v, want context.Canceled", err)
	}
}

// TestPreemptABatchSearchAcquiredAsAnInteractiveOneCame: an interactive search that
// queues while a batch search has its process but is not yet registered as preemptible
// (between acquire and the search) finds nothing to preempt as it joins the queue; the
// batch search, as it registers, sees the interactive waiter and is preempted at once
// (before the engine is sent anything), and the interactive search is served well
// within QueueWait instead of waiting for the batch search to end (review).
func TestPreemptABatchSearchAcquiredAsAnInteractiveOneCame(t *testing.T) {
	t.Parallel()
	pl := newPool(t, "sf-17.1", PathNative, func(c *PoolConfig) {
		c.BatchMaxWait = time.Hour
		c.QueueWait = 3 * time.Second
	})
	p := onlyProcess(t, pl)
	acquired, resume := make(chan struct{}), make(chan struct{})
	pl.testHookAcquired = func(prio Priority) {
		if prio == Batch {
			close(acquired)
			<-resume
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	batch := make(chan error, 1)
	go func() {
		_, err := pl.Search(ctx, Batch, longSearch)
		batch <- err
	}()
	<-acquired // the batch search has the process, and is not preemptible yet
	interactive := make(chan error, 1)
	start := time.Now()
	go func() {
		res, err := pl.Search(context.Background(), Interactive, Search{FEN: fenBlackMateIn1, Depth: 5})
		if err == nil && res.BestMove != "d8h4" {
			err = errors.New("best move " + res.BestMove)
		}
		interactive <- err
	}()
	waitStats(t, pl, func(s PoolStats) bool { return s.Waiting == [numPriorities]int{1, 0} })
	close(resume)
	if err := <-interactive; err != nil {
		t.Fatalf("interactive search that came as a batch search took the process: %v (after %v)", err, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("interactive search served after %v", time.Since(start).Round(time.Millisecond))
	if err := <-batch; !errors.Is(err, ErrPreempted) {
		t.Errorf("the batch search ended with %v, want ErrPreempted", err)
	}
	if st := pl.Stats(); st.Preempted != 1 {
		t.Errorf("preempted = %d, want 1", st.Preempted)
	}
	if np := onlyProcess(t, pl); np != p {
		t.Errorf("process replaced (pid %d -> %d)", p.pid, np.pid)
	}
}
