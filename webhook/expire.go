package webhook

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/postgres"
)

// expireBatch is how many rows one statement of Expire deletes (postgres.InBatches).
var expireBatch = 10000

// expireSQL deletes a batch ($1) of the deliveries finished more than $2 seconds ago,
// found by migration 0049's index. The ids are read once (ARRAY): joined instead, the
// planner may rescan the subquery, and each rescan takes a batch more.
const expireSQL = `DELETE FROM webhook_deliveries WHERE delivery_id = ANY (ARRAY(
	SELECT delivery_id FROM webhook_deliveries
	 WHERE (delivered_at IS NOT NULL OR failed_at IS NOT NULL)
	   AND coalesce(delivered_at, failed_at) < now() - make_interval(secs => $2)
	 LIMIT $1 FOR UPDATE SKIP LOCKED))`

// expireEndpointsSQL deletes a batch ($1) of the endpoints deleted more than $2 seconds
// ago that have no delivery left (their deliveries reference them). Whether one has
// is a subquery of its own, run for each such endpoint on webhook_deliveries_endpoint:
// NOT EXISTS became an anti-join, free to read the deliveries' whole index. The
// endpoints themselves are scanned: the table holds at most MaxEndpoints live ones an
// account and env, and those deleted lately (at most MaxCreations an hour). No delivery is queued to an endpoint once
// deleted (Enqueue), so none appears meanwhile.
const expireEndpointsSQL = `DELETE FROM webhook_endpoints WHERE endpoint_id = ANY (ARRAY(
	SELECT e.endpoint_id FROM webhook_endpoints e
	 WHERE e.deleted_at < now() - make_interval(secs => $2)
	   AND (SELECT d.delivery_id FROM webhook_deliveries d WHERE d.endpoint_id = e.endpoint_id LIMIT 1) IS NULL
	 LIMIT $1 FOR UPDATE OF e SKIP LOCKED))`

// Expire deletes the deliveries finished more than age ago: delivered, or failed (out
// of tries, or ended by their endpoint's deletion), by the time they were. Pending
// deliveries are left, however long they wait. Then it deletes the endpoints deleted
// more than age ago whose deliveries are all gone, with their URL and sealed secret:
// a deleted endpoint's pending deliveries end as it is deleted, so it goes once they
// have been finished for age too. It deletes in batches and answers how many rows
// (deliveries and endpoints) it deleted; any number of servers may expire at once,
// each batch skipping the rows another holds.
func Expire(ctx context.Context, pool *pgxpool.Pool, age time.Duration) (int64, error) {
	var n int64
	for _, e := range []struct{ what, sql string }{
		{"deliveries", expireSQL},
		{"deleted endpoints", expireEndpointsSQL},
	} {
		changed, err := postgres.InBatches(ctx, pool, expireBatch, e.sql, age.Seconds())
		n += changed
		if err != nil {
			return n, fmt.Errorf("webhook: expire %s: %w", e.what, err)
		}
	}
	return n, nil
}
