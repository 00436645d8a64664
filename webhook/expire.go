package webhook

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// expireBatch is how many deliveries one statement of Expire deletes: a backlog (the
// first sweep's, of every delivery ever made) goes a batch at a time, each a short
// transaction, rather than in one that holds its rows' locks until all are gone.
var expireBatch = 10000

// expireSQL deletes a batch ($1) of the deliveries finished more than $2 seconds ago,
// found by migration 0049's index. The ids are read once (ARRAY): joined instead, the
// planner may rescan the subquery, and each rescan takes a batch more.
const expireSQL = `DELETE FROM webhook_deliveries WHERE delivery_id = ANY (ARRAY(
	SELECT delivery_id FROM webhook_deliveries
	 WHERE (delivered_at IS NOT NULL OR failed_at IS NOT NULL)
	   AND coalesce(delivered_at, failed_at) < now() - make_interval(secs => $2)
	 LIMIT $1 FOR UPDATE SKIP LOCKED))`

// Expire deletes the deliveries finished more than age ago: delivered, or failed (out
// of tries, or ended by their endpoint's deletion), by the time they were. Pending
// deliveries are left, however long they wait. It deletes in batches and answers how
// many deliveries it deleted; any number of servers may expire at once, each batch
// skipping the rows another holds.
func Expire(ctx context.Context, pool *pgxpool.Pool, age time.Duration) (int64, error) {
	var n int64
	for {
		tag, err := pool.Exec(ctx, expireSQL, expireBatch, age.Seconds())
		if err != nil {
			return n, fmt.Errorf("webhook: expire deliveries: %w", err)
		}
		n += tag.RowsAffected()
		if tag.RowsAffected() < int64(expireBatch) {
			return n, nil
		}
	}
}
