package analysis

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ExpireCache deletes eval_cache entries not written for longer than age (a deeper
// result refreshes an entry; reads do not).
func ExpireCache(ctx context.Context, pool *pgxpool.Pool, age time.Duration) (int64, error) {
	tag, err := pool.Exec(ctx, `DELETE FROM eval_cache WHERE created_at < now() - make_interval(secs => $1)`, age.Seconds())
	if err != nil {
		return 0, fmt.Errorf("analysis: expire eval cache: %w", err)
	}
	return tag.RowsAffected(), nil
}
