package projections

import (
	"context"
	"fmt"
	"time"

	"chessd/eventstore"
)

// Behind is how far a projection's checkpoint is behind the log's head: in events of
// every topic, and as the age of the first event past the checkpoint (zero when caught
// up). Statuses counts only the projection's own topic; this is the load driver's
// measure of the whole pipeline. An inline projection is never behind.
func Behind(ctx context.Context, q eventstore.Querier, name string) (events int64, age time.Duration, err error) {
	for _, p := range All() {
		if p.Name() == name && Inline(p) {
			return 0, 0, nil
		}
	}
	var secs float64
	err = q.QueryRow(ctx, `WITH c AS (SELECT coalesce((SELECT position FROM projection_checkpoints WHERE name = $1), 0) AS pos)
		SELECT (SELECT position FROM event_chain) - c.pos,
			coalesce((SELECT extract(epoch FROM clock_timestamp() - recorded_at)::float8 FROM events WHERE position = c.pos + 1), 0)
		FROM c`, name).Scan(&events, &secs)
	if err != nil {
		return 0, 0, fmt.Errorf("lag of %s: %w", name, err)
	}
	return events, time.Duration(secs * float64(time.Second)), nil
}
