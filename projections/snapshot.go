package projections

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"chessd/eventstore"
)

// Snapshot reads every row of p's tables as text, sorted, so that two snapshots are
// equal exactly when the tables are: `chessd replay` compares the live read models
// with the ones rebuilt from the events.
func Snapshot(ctx context.Context, q eventstore.Querier, p Projection) (map[string][]string, error) {
	out := map[string][]string{}
	for _, t := range p.Tables() {
		rows, err := q.Query(ctx, `SELECT x::text FROM `+pgx.Identifier{t}.Sanitize()+` x ORDER BY 1`)
		if err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", t, err)
		}
		if out[t], err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", t, err)
		}
	}
	return out, nil
}
