package analysis

import (
	"context"
	"sync"

	"chessd/engine"
)

// flights are the searches running in this process that a request for the same
// position may wait for instead of starting its own: a batch that holds a position twice
// (listed twice, or at the same halfmove clock with another fullmove number) searches
// it once, and the repeat is answered, and priced, as a cache hit, however the
// engines happened to interleave them.
type flights struct {
	mu      sync.Mutex
	running map[string]*flight // by cache key
}

// flight is one running search; done closes once res or err is set.
type flight struct {
	depth, multipv int
	prio           engine.Priority
	done           chan struct{}
	res            *Result
	err            error
}

// join returns the running search for key and false when it answers depth and
// multipv at a priority at least prio's (an interactive request does not wait for a
// job's search, which may still be queued behind other jobs' work); otherwise it
// returns a new flight and true when none runs for key (the caller searches, then
// calls land), or nil and true when one runs that does not answer the request (the
// caller searches on its own).
func (f *flights) join(key string, depth, multipv int, prio engine.Priority) (fl *flight, lead bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cur := f.running[key]; cur != nil {
		if cur.depth >= depth && cur.multipv >= multipv && cur.prio <= prio {
			return cur, false
		}
		return nil, true
	}
	if f.running == nil {
		f.running = map[string]*flight{}
	}
	fl = &flight{depth: depth, multipv: multipv, prio: prio, done: make(chan struct{})}
	f.running[key] = fl
	return fl, true
}

// land ends a flight the caller led with its outcome. The result is in the cache by
// then, so a request that finds no flight afterwards finds the result there.
func (f *flights) land(key string, fl *flight, res *Result, err error) {
	f.mu.Lock()
	delete(f.running, key)
	f.mu.Unlock()
	fl.res, fl.err = res, err
	close(fl.done)
}

// wait returns the flight's result when it produced one that answers depth and
// multipv; false when it failed (its caller gave up, an engine died, it was preempted),
// stopped short (a time limit), or ctx ended first.
func (fl *flight) wait(ctx context.Context, depth, multipv int) (*Result, bool) {
	select {
	case <-ctx.Done():
		return nil, false
	case <-fl.done:
	}
	if fl.err != nil || !satisfies(fl.res, fl.multipv, depth, multipv) {
		return nil, false
	}
	return fl.res, true
}

// count is how many searches others may wait for.
func (f *flights) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.running)
}
