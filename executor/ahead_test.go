package executor

import (
	"fmt"
	"testing"
	"time"

	"chessd/domain"
	"chessd/engine"
)

// A take holds what the engines search in Horizon at their recent pace, within
// [Parallel, Ahead].
func TestAheadFollowsThePace(t *testing.T) {
	for _, c := range []struct {
		name     string
		parallel int
		ahead    int
		pace     time.Duration
		want     int
	}{
		{"no search yet", 2, 16, 0, 2},
		{"depth 10", 2, 16, 15 * time.Millisecond, 13},
		{"fast searches: at most Ahead", 2, 16, time.Millisecond, 16},
		{"depth 14", 2, 16, 100 * time.Millisecond, 2},
		{"deep searches: at least Parallel", 4, 32, 3 * time.Second, 4},
		{"Ahead below Parallel", 4, 1, 10 * time.Millisecond, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			x := &Executor{cfg: Config{Parallel: c.parallel, Ahead: c.ahead, Horizon: 100 * time.Millisecond}}
			x.stats.recent.Store(int64(c.pace))
			if got := x.ahead(); got != c.want {
				t.Fatalf("ahead = %d, want %d", got, c.want)
			}
		})
	}
}

// The pace is a moving average of completed searches: the first sets it, one slow
// search moves it by an eighth of the difference, and a position merely counted (a
// search cut short) leaves it alone.
func TestPaceIsAMovingAverage(t *testing.T) {
	var s stats
	s.learn(16 * time.Millisecond)
	if got := s.pace(); got != 16*time.Millisecond {
		t.Fatalf("after one search: %v", got)
	}
	s.learn(96 * time.Millisecond)
	if got := s.pace(); got != 26*time.Millisecond {
		t.Fatalf("after a slow one: %v, want 26ms", got)
	}
	s.add(time.Microsecond)
	if got := s.pace(); got != 26*time.Millisecond {
		t.Fatalf("after a search cut short: %v, want 26ms", got)
	}
}

// A take asks for the power of two nearer to what is wanted (TakePositions rounds
// down to one), never for more than there is room for.
func TestTakeSizeIsTheNearerPowerOfTwo(t *testing.T) {
	for _, c := range []struct{ want, room, size int }{
		{0, 18, 0},
		{1, 18, 1},
		{2, 18, 2},
		{3, 18, 4},
		{5, 18, 4},
		{6, 18, 8},
		{11, 18, 8},
		{12, 18, 16},
		{6, 7, 7}, // TakePositions then takes 4
		{6, 2, 2},
	} {
		if got := takeSize(c.want, c.room); got != c.size {
			t.Errorf("takeSize(%d, %d) = %d, want %d", c.want, c.room, got, c.size)
		}
	}
}

// A position's search waits out interactive calls however long they keep the engines
// (preempted or saturated: not the position's fault), and gives up only after
// maxEngineFailures failures of its own engine, waiting longer each time; an error
// that is not the engines' ends it at once.
func TestRetryAfter(t *testing.T) {
	saturated := fmt.Errorf("every engine is busy: %w", engine.ErrSaturated)
	failed := domain.Errorf(domain.CodeUnavailable, "the engine failed during the search")
	invalid := domain.Invalid("fen", "bad")
	for _, tc := range []struct {
		name     string
		err      error
		failures int
		wait     time.Duration
		retry    bool
	}{
		{"preempted", engine.ErrPreempted, 0, 0, true},
		{"preempted after many failures", engine.ErrPreempted, maxEngineFailures, 0, true},
		{"saturated", saturated, 0, 200 * time.Millisecond, true},
		{"saturated for a long time", saturated, 1000, 200 * time.Millisecond, true},
		{"engine failed once", failed, 0, 100 * time.Millisecond, true},
		{"engine failed again", failed, 4, 500 * time.Millisecond, true},
		{"engine failed for the last time", failed, maxEngineFailures - 1, 0, false},
		{"not the engines'", invalid, 0, 0, false},
	} {
		wait, retry := retryAfter(tc.err, tc.failures)
		if wait != tc.wait || retry != tc.retry {
			t.Errorf("%s: wait %v retry %v, want %v %v", tc.name, wait, retry, tc.wait, tc.retry)
		}
	}
}
