package postgres

import (
	"context"
	"fmt"
)

// LockXact takes the advisory lock called name until q's transaction ends, waiting for
// any other holder; shared, it waits only for an exclusive holder. A transaction may
// take a lock it holds again.
func LockXact(ctx context.Context, q Querier, name string, shared bool) error {
	fn := "pg_advisory_xact_lock"
	if shared {
		fn = "pg_advisory_xact_lock_shared"
	}
	if _, err := q.Exec(ctx, `SELECT `+fn+`(hashtextextended($1, 0))`, name); err != nil {
		return fmt.Errorf("lock %s: %w", name, err)
	}
	return nil
}
