package projections

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"chessd/eventstore"
)

// StreamEvent is one event of a job's SSE stream (job_stream), numbered per job.
type StreamEvent struct {
	Seq  int
	Kind string // state, position, progress or end
	Data json.RawMessage
}

// JobStreamAfter reads a job's stream events after seq last, and whether the stream has
// ended: its `end` is among them, or at or before last (a client that saw it, or one
// whose Last-Event-ID is past it, has nothing more to wait for).
func JobStreamAfter(ctx context.Context, q eventstore.Querier, jobID string, last int) (evs []StreamEvent, ended bool, err error) {
	rows, err := q.Query(ctx, `SELECT seq, kind, data FROM job_stream WHERE job_id = $1 AND (seq > $2 OR kind = 'end') ORDER BY seq`, jobID, last)
	if err != nil {
		return nil, false, fmt.Errorf("job stream: %w", err)
	}
	var e StreamEvent
	_, err = pgx.ForEachRow(rows, []any{&e.Seq, &e.Kind, &e.Data}, func() error {
		if e.Kind == "end" {
			ended = true
		}
		if e.Seq > last {
			evs = append(evs, e)
		}
		e = StreamEvent{} // Data is scanned into a fresh slice each row
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("job stream: %w", err)
	}
	return evs, ended, nil
}
