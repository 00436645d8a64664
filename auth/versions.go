package auth

import (
	"context"
	"fmt"
	"sync"
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
}

type versionAsk struct {
	ids  []string
	out  []int64
	err  error
	done chan struct{}
}

// read returns the versions of ids (0 for a stream that does not exist), in order.
func (v *versionReader) read(ctx context.Context, ids ...string) ([]int64, error) {
	ask := &versionAsk{ids: ids, done: make(chan struct{})}
	v.mu.Lock()
	v.waiting = append(v.waiting, ask)
	if !v.running {
		v.running = true
		go v.run()
	}
	v.mu.Unlock()
	select {
	case <-ask.done:
		return ask.out, ask.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// run answers the waiting asks, one query per batch, until none wait.
func (v *versionReader) run() {
	for {
		v.mu.Lock()
		batch := v.waiting
		v.waiting = nil
		if len(batch) == 0 {
			v.running = false
			v.mu.Unlock()
			return
		}
		v.mu.Unlock()
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
}

func (v *versionReader) query(batch []*versionAsk) (map[string]int64, error) {
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
