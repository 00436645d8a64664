package projections_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/postgres/pgtest"
	"chessd/projections"
)

// A subscriber's transaction is opened as Watermill asks (its isolation) and commits
// without waiting for the WAL flush, both set by the BEGIN.
func TestBusTransactionsCommitAsynchronously(t *testing.T) {
	// the test cluster commits asynchronously throughout (pgtest): these sessions do not
	cfg := pgtest.NewDB(t).Config()
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, opts := range []*sql.TxOptions{
		nil,
		{Isolation: sql.LevelRepeatableRead},
		{Isolation: sql.LevelSerializable, ReadOnly: true},
	} {
		tx, err := projections.NewBusBeginner(pool).BeginTx(ctx, opts)
		if err != nil {
			t.Fatalf("%+v: %v", opts, err)
		}
		rows, err := tx.QueryContext(ctx, `SELECT current_setting('synchronous_commit'), current_setting('transaction_isolation'),
			current_setting('transaction_read_only')`)
		if err != nil {
			t.Fatal(err)
		}
		var commit, isolation, readOnly string
		if !rows.Next() {
			t.Fatalf("%+v: no row", opts)
		}
		if err := rows.Scan(&commit, &isolation, &readOnly); err != nil {
			t.Fatal(err)
		}
		rows.Close() //nolint:errcheck // read
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		want := "read committed"
		if opts != nil {
			want = map[sql.IsolationLevel]string{sql.LevelRepeatableRead: "repeatable read", sql.LevelSerializable: "serializable"}[opts.Isolation]
		}
		if commit != "off" || isolation != want || (readOnly == "on") != (opts != nil && opts.ReadOnly) {
			t.Errorf("%+v: synchronous_commit %s, isolation %s, read only %s; want off, %s", opts, commit, isolation, readOnly, want)
		}
		// and the setting ends with the transaction
		var after string
		if err := pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&after); err != nil || after != "on" {
			t.Errorf("after the transaction: synchronous_commit %s (%v)", after, err)
		}
	}
}
