package projections

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PruneBus deletes the messages of topic that every consumer group has acknowledged.
// The bus is only a delivery channel: the events table keeps every event for good, and
// a projection added later is built from it (Rebuild), not from the bus. A topic whose
// consumers have not all subscribed yet keeps everything.
func PruneBus(ctx context.Context, pool *pgxpool.Pool, topic string, groups int) (int64, error) {
	offsets := pgx.Identifier{"watermill_offsets_" + topic}.Sanitize()
	messages := pgx.Identifier{"watermill_" + topic}.Sanitize()
	var n int
	var xid *string
	var offset *int64
	err := pool.QueryRow(ctx, `SELECT count(*) OVER (), last_processed_transaction_id::text, offset_acked FROM `+offsets+`
		ORDER BY last_processed_transaction_id, offset_acked LIMIT 1`).Scan(&n, &xid, &offset)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && (n < groups || xid == nil || offset == nil)) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("prune %s: %w", topic, err)
	}
	tag, err := pool.Exec(ctx, `DELETE FROM `+messages+`
		WHERE transaction_id < $1::xid8 OR (transaction_id = $1::xid8 AND "offset" <= $2)`, *xid, *offset)
	if err != nil {
		return 0, fmt.Errorf("prune %s: %w", topic, err)
	}
	return tag.RowsAffected(), nil
}

// PruneLoop prunes every topic each interval until ctx ends. consumers says how many
// consumer groups read each topic.
func PruneLoop(ctx context.Context, pool *pgxpool.Pool, consumers map[string]int, every time.Duration, logger *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for topic, groups := range consumers {
			if n, err := PruneBus(ctx, pool, topic, groups); err != nil && ctx.Err() == nil {
				logger.Warn("prune bus", "topic", topic, "err", err)
			} else if n > 0 {
				logger.Debug("pruned bus", "topic", topic, "messages", n)
			}
		}
	}
}
