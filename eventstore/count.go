package eventstore

import (
	"context"
	"fmt"
)

// CountSince counts the events of streamType after position after, and the
// transactions that committed them (how well appends were grouped: the load driver's
// charges per commit).
func CountSince(ctx context.Context, q Querier, after int64, streamType string) (events, transactions int64, err error) {
	err = q.QueryRow(ctx, `SELECT count(*), count(DISTINCT xmin::text) FROM events
		WHERE position > $1 AND stream_type = $2`, after, streamType).Scan(&events, &transactions)
	if err != nil {
		return 0, 0, fmt.Errorf("count events: %w", err)
	}
	return events, transactions, nil
}
