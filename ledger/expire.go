package ledger

import (
	"context"
	"fmt"

	"chessd/eventstore"
)

// Expire deletes what the ledger keeps only for a while: Idempotency-Key answers past
// the 24-hour window, and keyless allowances of days before yesterday (UTC). It
// returns how many rows went.
func Expire(ctx context.Context, q eventstore.Querier) (int64, error) {
	var n int64
	for _, stmt := range []string{
		`DELETE FROM idempotency WHERE created_at < now() - interval '24 hours'`,
		`DELETE FROM keyless_usage WHERE day < (now() AT TIME ZONE 'UTC')::date - 1`,
	} {
		tag, err := q.Exec(ctx, stmt)
		if err != nil {
			return n, fmt.Errorf("ledger: expire: %w", err)
		}
		n += tag.RowsAffected()
	}
	return n, nil
}
