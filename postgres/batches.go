package postgres

import "context"

// InBatches runs stmt, whose $1 is a batch's size (args the rest), until a run changes
// fewer rows than size, and answers how many rows it changed in all. A sweep of old
// rows goes a batch at a time, each a short transaction, rather than in one that holds
// every row's lock until all are gone (the first sweep meets every row ever written).
func InBatches(ctx context.Context, q Querier, size int, stmt string, args ...any) (int64, error) {
	var n int64
	for {
		tag, err := q.Exec(ctx, stmt, append([]any{size}, args...)...)
		if err != nil {
			return n, err
		}
		n += tag.RowsAffected()
		if tag.RowsAffected() < int64(size) {
			return n, nil
		}
	}
}
