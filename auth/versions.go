package auth

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// versionReader reads streams' current versions for Remembered, sharing one query among
// the calls that ask while another query is in flight: under load one round trip
// serves many requests, and none waits longer than one query more. Every answer comes
// from a query that started after its caller asked, so it sees every change committed
// before the call (a revocation, a plan change, on any server).
type versionReader struct {
	pool    *pgxpool.Pool
	mu      sync.Mutex
	waiting []*versionAsk
	running bool
	queries atomic.Int64 // round trips made, for tests
}

type versionAsk struct {
	ids  []string
	out  []int64
	err  error
	done chan struct{}
}

// read returns the versions of ids (0 for a stream that does not exist), in order.
// With no query in flight, the caller runs one itself, for every ask waiting: the
// common case at low load costs one round trip and no hand-over between goroutines.
func (v *versionReader) read(ctx context.Context, ids ...string) ([]int64, error) {
	ask := &versionAsk{ids: ids, done: make(chan struct{})}
	v.mu.Lock()
	v.waiting = append(v.waiting, ask)
	if !v.running {
		v.running = true
		v.mu.Unlock()
		v.answer(v.take())
		v.mu.Lock()
		if len(v.waiting) > 0 { // asked meanwhile: answered by a runner of their own
			go v.run()
		} else {
			v.running = false
		}
		v.mu.Unlock()
		return ask.out, ask.err
	}
	v.mu.Unlock()
	select {
	case <-ask.done:
		return ask.out, ask.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// take returns the asks waiting; with none, it marks the reader idle and returns nil.
func (v *versionReader) take() []*versionAsk {
	v.mu.Lock()
	defer v.mu.Unlock()
	batch := v.waiting
	v.waiting = nil
	if len(batch) == 0 {
		v.running = false
	}
	return batch
}

// run answers the waiting asks, one query per batch, until none wait.
func (v *versionReader) run() {
	for batch := v.take(); batch != nil; batch = v.take() {
		v.answer(batch)
	}
}

// answer runs one query for batch and hands each ask its versions.
func (v *versionReader) answer(batch []*versionAsk) {
	versions, err := v.query(batch)
	for _, a := range batch {
		if err != nil {
			a.err = err
		} else {
			a.out = make([]int64, len(a.ids))
			for i, id := range a.ids {
				a.out[i] = versions[id]
			}
		}
		close(a.done)
	}
}

func (v *versionReader) query(batch []*versionAsk) (map[string]int64, error) {
	v.queries.Add(1)
	// shared by many requests: none of their contexts may cancel it
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	seen := map[string]bool{}
	var ids []string
	for _, a := range batch {
		for _, id := range a.ids {
			if !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	if len(ids) == 2 { // one call's key and account: two scalar lookups cost less than = ANY(array)
		var a, b *int64
		err := v.pool.QueryRow(ctx, `SELECT (SELECT version FROM streams WHERE stream_id = $1),
			(SELECT version FROM streams WHERE stream_id = $2)`, ids[0], ids[1]).Scan(&a, &b)
		if err != nil {
			return nil, fmt.Errorf("stream versions: %w", err)
		}
		out := make(map[string]int64, 2)
		if a != nil {
			out[ids[0]] = *a
		}
		if b != nil {
			out[ids[1]] = *b
		}
		return out, nil
	}
	rows, err := v.pool.Query(ctx, `SELECT stream_id, version FROM streams WHERE stream_id = ANY($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("stream versions: %w", err)
	}
	defer rows.Close()
	out := make(map[string]int64, len(ids))
	for rows.Next() {
		var id string
		var ver int64
		if err := rows.Scan(&id, &ver); err != nil {
			return nil, fmt.Errorf("stream versions: %w", err)
		}
		out[id] = ver
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("stream versions: %w", err)
	}
	return out, nil
}
