package projections

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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

// Live is a snapshot of a projection's live tables with where the log stood when it
// was read (in one transaction): what `chessd replay` compares with a rebuild, and
// whether that comparison can hold.
type Live struct {
	Tables map[string][]string
	Head   int64 // the log's last position
	// Behind: the live subscriber had events of its topic up to Head still to apply
	// (never for an inline projection, written by the appends themselves)
	Behind bool
}

// LiveSnapshot reads p's live tables (Snapshot) and the log's head in one snapshot of
// the database, and whether p's subscriber was behind then.
func LiveSnapshot(ctx context.Context, pool *pgxpool.Pool, p Projection) (Live, error) {
	var l Live
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		if l.Head, err = eventstore.Head(ctx, tx); err != nil {
			return err
		}
		if !Inline(p) {
			var at int64
			if err := tx.QueryRow(ctx, `SELECT coalesce((SELECT position FROM projection_checkpoints WHERE name = $1), 0)`, p.Name()).Scan(&at); err != nil {
				return fmt.Errorf("checkpoint of %s: %w", p.Name(), err)
			}
			next, err := readTopic(ctx, tx, p.Topic(), at, 1)
			if err != nil {
				return err
			}
			l.Behind = len(next) > 0 && next[0].Position <= l.Head
		}
		l.Tables, err = Snapshot(ctx, tx, p)
		return err
	})
	return l, err
}

// Appended says whether an event of p's topic was appended after position after, up to
// upto: whether p's read model can have moved between the two.
func Appended(ctx context.Context, q eventstore.Querier, p Projection, after, upto int64) (bool, error) {
	next, err := readTopic(ctx, q, p.Topic(), after, 1)
	if err != nil {
		return false, err
	}
	return len(next) > 0 && next[0].Position <= upto, nil
}
