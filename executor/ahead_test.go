package executor

import (
	"testing"
	"time"
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
