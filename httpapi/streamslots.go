package httpapi

import (
	"sync"
	"time"

	"chessd/domain"
)

// StreamsPerAccount bounds the job event streams one account holds open on one server
// at once, in each env. Each holds a connection, a goroutine and a subscription for as long as its
// job runs, and the rate limit alone would let one account pile up thousands of them
// on a long queue (Config.StreamsPerAccount replaces it in tests).
const StreamsPerAccount = 100

// streamSlots counts the open job event streams of each holder (an account's env) on
// this server.
type streamSlots struct {
	mu    sync.Mutex
	limit int
	open  map[string]int
}

func newStreamSlots(limit int) *streamSlots {
	return &streamSlots{limit: limit, open: make(map[string]int)}
}

// take holds one of holder's slots; false when it holds them all.
func (s *streamSlots) take(holder string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open[holder] >= s.limit {
		return false
	}
	s.open[holder]++
	return true
}

// give hands back a slot that take gave.
func (s *streamSlots) give(holder string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open[holder] <= 1 {
		delete(s.open, holder) // idle holders leave nothing behind
		return
	}
	s.open[holder]--
}

// streamsFull is the answer to one stream too many: 429, retry when one has closed.
type streamsFull struct{ limit int }

func (e *streamsFull) Error() string { return "too many open streams" }
func (e *streamsFull) Unwrap() error {
	return domain.Errorf(domain.CodeRateLimited,
		"this account already has %d job event streams open on this server; close one (or wait for its job to end) and retry", e.limit)
}
func (e *streamsFull) RetryAfter() time.Duration { return 5 * time.Second }
