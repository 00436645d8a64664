package projections_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/ledger"
	"chessd/postgres/pgtest"
	"chessd/projections"
)

// credit credits c (at position pos) in full, from a dispute or not.
func credit(c *ledger.UnitsCharged, pos int64, dispute string) *ledger.UnitsCredited {
	return &ledger.UnitsCredited{CreditID: "crd_" + c.RequestID, ChargeID: c.ChargeID, ChargePosition: pos, AccountID: c.AccountID,
		KeyID: c.KeyID, Env: c.Env, Day: c.Day, CreditedAt: c.ChargedAt.Add(time.Hour), Units: c.Units, USD: c.USD,
		Reason: "test", Actor: "ops@test", DisputeID: dispute,
		Postings: []ledger.Posting{{Book: "units", Account: "revenue", Currency: "units", Debit: decimal.NewFromInt(c.Units)},
			{Book: "units", Account: "key", Currency: "units", Credit: decimal.NewFromInt(c.Units)}}}
}

// shape is how the ledger's tables are defined: columns, constraints and indexes.
func shape(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	return column(t, pool, `
		SELECT c.relname || ' column ' || a.attnum || ' ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull
		  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
		 WHERE c.relname IN ('charges', 'credits') AND a.attnum > 0 AND NOT a.attisdropped
		UNION ALL
		SELECT conrelid::regclass || ' constraint ' || conname || ' ' || pg_get_constraintdef(oid)
		  FROM pg_constraint WHERE conrelid::regclass::text IN ('charges', 'credits')
		UNION ALL
		SELECT 'index ' || indexdef FROM pg_indexes WHERE tablename IN ('charges', 'credits')
		UNION ALL
		SELECT c.relname || ' grant ' || a.privilege_type || ' to ' || pg_get_userbyid(a.grantee) || ' ' || a.is_grantable
		  FROM pg_class c, aclexplode(c.relacl) a
		 WHERE c.relname IN ('charges', 'credits') AND c.relkind = 'r' AND a.grantee <> c.relowner
		UNION ALL
		SELECT c.relname || ' grant ' || a.privilege_type || ' (' || att.attname || ') to ' || pg_get_userbyid(a.grantee)
		  FROM pg_class c JOIN pg_attribute att ON att.attrelid = c.oid, aclexplode(att.attacl) a
		 WHERE c.relname IN ('charges', 'credits') AND c.relkind = 'r' AND a.grantee <> c.relowner
		ORDER BY 1`)
}

// grantToAReader makes a role (of this database's name: roles belong to the cluster)
// and grants it what a reporting role would have on the ledger's tables.
func grantToAReader(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	var role string
	if err := pool.QueryRow(ctx, `SELECT 'reader_' || current_database()`).Scan(&role); err != nil {
		t.Fatal(err)
	}
	r := pgx.Identifier{role}.Sanitize()
	for _, stmt := range []string{
		`CREATE ROLE ` + r + ` NOLOGIN`,
		`GRANT SELECT ON charges, credits TO ` + r,
		`GRANT SELECT ON credits TO ` + r + ` WITH GRANT OPTION`,
		`GRANT SELECT (account_id, units, usd), UPDATE (reason) ON credits TO ` + r,
		`GRANT SELECT ON charges TO PUBLIC`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	t.Cleanup(func() {
		pool.Exec(ctx, `REVOKE SELECT ON charges FROM PUBLIC`) //nolint:errcheck // the database goes anyway
		pool.Exec(ctx, `DROP OWNED BY `+r+`; DROP ROLE `+r)    //nolint:errcheck // as above
	})
}

// A rebuild of the ledger loads copies of its tables and swaps them in: the rows are
// those the live writer made, the tables keep every column, constraint and index, and
// the charges appended meanwhile (while it loads, and between its loading and its swap)
// are all there, once.
func TestLedgerRebuildKeepsTheTablesAndWhatIsAppendedMeanwhile(t *testing.T) {
	defer projections.SetRebuildChunk(50)()
	pool := pgtest.NewDB(t)
	ctx := context.Background()
	var charges []*ledger.UnitsCharged
	for i := range 400 {
		c := charge(fmt.Sprintf("key_%d", i%7), fmt.Sprintf("r%d", i), true)
		c.USD = decimal.New(int64(i+1), -6)
		charges = append(charges, c)
	}
	for k := range 7 {
		var evs []ledger.UnitsCharged
		for i := k; i < len(charges); i += 7 {
			evs = append(evs, *charges[i])
		}
		for i := 0; i < len(evs); i += 20 {
			var batch []domain.Event
			for j := i; j < min(i+20, len(evs)); j++ {
				batch = append(batch, &evs[j])
			}
			appendRaw(t, pool, ledger.Stream(fmt.Sprintf("key_%d", k)), ledger.StreamLedger, eventstore.AnyVersion, batch...)
		}
	}
	first := count(t, pool, `SELECT min(position) FROM charges WHERE request_id = 'r0'`)
	second := count(t, pool, `SELECT min(position) FROM charges WHERE request_id = 'r1'`)
	appendRaw(t, pool, ledger.Stream("key_0"), ledger.StreamLedger, eventstore.AnyVersion, credit(charges[0], int64(first), ""))
	appendRaw(t, pool, ledger.Stream("key_1"), ledger.StreamLedger, eventstore.AnyVersion, credit(charges[1], int64(second), "dsp_1"))
	tables := projections.Ledger{}.Tables()
	grantToAReader(t, pool)
	live, before := snapshot(t, pool, tables), shape(t, pool)
	if len(live["charges"]) != 400 || len(live["credits"]) != 2 {
		t.Fatalf("live read model: %d charges, %d credits", len(live["charges"]), len(live["credits"]))
	}

	rep, err := projections.Rebuild(ctx, pool, projections.Ledger{})
	if err != nil || rep.Applied != 402 || rep.SetAside != 0 {
		t.Fatalf("rebuild: %+v %v", rep, err)
	}
	if now := snapshot(t, pool, tables); !reflect.DeepEqual(live, now) {
		t.Fatalf("the rebuild's rows differ from the live writer's:\nlive %v\nnow  %v", live, now)
	}
	if after := shape(t, pool); !reflect.DeepEqual(before, after) {
		t.Fatalf("the tables changed:\nbefore %v\nafter  %v", before, after)
	}

	// Charges appended all along, and one between the loading and the swap.
	stop := make(chan struct{})
	var appended atomic.Int64
	done := make(chan error, 1)
	go func() {
		store := eventstore.NewStore(pool, quiet)
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			c := charge("key_live", fmt.Sprintf("live%d", i), true)
			if _, err := store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
				return tx.Append(ctx, ledger.Stream(c.KeyID), ledger.StreamLedger, eventstore.AnyVersion, eventstore.Metadata{RequestID: "test"},
					eventstore.New{Type: c.EventType(), SchemaVersion: 1, Payload: c})
			}); err != nil {
				done <- err
				return
			}
			appended.Add(1)
		}
	}()
	pgtest.WaitFor(t, "an append", func() bool { return appended.Load() > 0 })
	var between eventstore.Event
	restore := projections.BeforeSwap(func() {
		between = appendCharge(t, pool, charge("key_between", "between", true))
	})
	start := appended.Load()
	rep, err = projections.Rebuild(ctx, pool, projections.Ledger{})
	during := appended.Load() - start
	restore()
	close(stop)
	if err := <-done; err != nil {
		t.Fatalf("an append during the rebuild: %v", err)
	}
	if err != nil || rep.SetAside != 0 {
		t.Fatalf("rebuild under appends: %+v %v", rep, err)
	}
	if during == 0 {
		t.Fatal("no charge was appended while the rebuild ran")
	}
	events := count(t, pool, `SELECT count(*) FROM events WHERE event_type = 'UnitsCharged'`)
	if n := count(t, pool, `SELECT count(*) FROM charges`); n != events || n != 401+int(appended.Load()) {
		t.Fatalf("%d charges in the read model, %d in the log, %d appended", n, events, 401+appended.Load())
	}
	if count(t, pool, `SELECT count(*) FROM charges WHERE position = $1`, between.Position) != 1 {
		t.Fatal("the charge appended between the loading and the swap is missing")
	}
	withAppends := snapshot(t, pool, tables)
	if _, err := projections.Rebuild(ctx, pool, projections.Ledger{}); err != nil {
		t.Fatal(err)
	}
	if quiet := snapshot(t, pool, tables); !reflect.DeepEqual(withAppends, quiet) {
		t.Fatalf("the rebuild under appends differs from a quiet one:\nunder appends %v\nquiet         %v", withAppends, quiet)
	}
}

// A row the read model now refuses is found however it is refused: a duplicate that
// only the copy's unique constraint, built after the load, sees makes the rebuild start
// again carefully, with the constraint in place from the start, and the later charge
// is set aside. A projection whose table another's foreign key points at is rebuilt in
// place.
func TestLedgerRebuildFindsWhatTheLoadedCopyRefuses(t *testing.T) {
	pool := pgtest.NewDB(t)
	ctx := context.Background()
	damaged := appendCharge(t, pool, charge("key_a", "dup", true))
	c := charge("key_b", "dup", true)
	c.ChargeID = "chg_other"
	refused := appendCharge(t, pool, c)
	// the read model lost the first row; a constraint came in meanwhile
	if _, err := pool.Exec(ctx, `DELETE FROM charges WHERE position = $1`, damaged.Position); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE charges ADD CONSTRAINT one_request UNIQUE (request_id)`); err != nil {
		t.Fatal(err)
	}
	rep, err := projections.Rebuild(ctx, pool, projections.Ledger{})
	if err != nil || rep.Applied != 1 || rep.SetAside != 1 {
		t.Fatalf("rebuild: %+v %v", rep, err)
	}
	if count(t, pool, `SELECT count(*) FROM charges WHERE position = $1`, damaged.Position) != 1 ||
		count(t, pool, `SELECT count(*) FROM set_aside_events WHERE position = $1 AND projection = 'ledger_v1'`, refused.Position) != 1 {
		t.Fatal("the lost row is not back, or the duplicate was not set aside")
	}
	if count(t, pool, `SELECT count(*) FROM pg_constraint WHERE conname = 'one_request' AND conrelid = 'charges'::regclass`) != 1 {
		t.Fatal("the rebuilt table lost the constraint")
	}

	if _, err := pool.Exec(ctx, `CREATE TABLE charge_notes (position bigint REFERENCES charges (position))`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM charges`); err != nil {
		t.Fatal(err)
	}
	rep, err = projections.Rebuild(ctx, pool, projections.Ledger{})
	if err != nil || rep.Applied != 1 || count(t, pool, `SELECT count(*) FROM charges`) != 1 {
		t.Fatalf("rebuild in place: %+v %v", rep, err)
	}
}

// RebuildAll rebuilds projections side by side and reports each in its place: one that
// fails (its table is gone) leaves the other rebuilt.
func TestRebuildAllReportsEachProjection(t *testing.T) {
	pool := pgtest.NewDB(t)
	ctx := context.Background()
	appendCharge(t, pool, charge("key_a", "a1", true))
	appendRaw(t, pool, domain.AccountStream("acct_all"), domain.StreamAccount, 0,
		&domain.AccountCreated{AccountID: "acct_all", Email: "all@example.com", Name: "All", Plan: "free", CreatedAt: time.Now().UTC()})
	if _, err := pool.Exec(ctx, `DROP TABLE credits`); err != nil {
		t.Fatal(err)
	}
	reps, errs := projections.RebuildAll(ctx, pool, projections.Accounts{}, projections.Ledger{})
	if errs[0] != nil || reps[0].Applied != 1 || errs[1] == nil {
		t.Fatalf("reports %+v, errors %v: want the accounts rebuilt and the ledger failed", reps, errs)
	}
	if count(t, pool, `SELECT count(*) FROM accounts WHERE account_id = 'acct_all'`) != 1 ||
		count(t, pool, `SELECT count(*) FROM charges`) != 1 {
		t.Fatal("the accounts were not rebuilt, or the failed ledger rebuild changed its tables")
	}
}

// A rebuild writes its projection's bus offset row, which the live subscriber locks
// first in each of its REPEATABLE READ transactions: one whose snapshot is older than the
// rebuild fails there (and starts again) instead of applying events to the read model as
// it stood before the rebuild, which set aside events the rebuild had applied.
func TestRebuildFailsASubscriberSnapshotTakenBefore(t *testing.T) {
	pool := pgtest.NewDB(t)
	ctx := context.Background()
	appendRaw(t, pool, domain.AccountStream("acct_old"), domain.StreamAccount, 0,
		&domain.AccountCreated{AccountID: "acct_old", Email: "old@example.com", Name: "Old", Plan: "free", CreatedAt: time.Now().UTC()})
	// the subscriber has acknowledged messages before
	if _, err := pool.Exec(ctx, `INSERT INTO watermill_offsets_accounts (consumer_group, offset_acked, last_processed_transaction_id)
		VALUES ('accounts_v1', 0, '0')`); err != nil {
		t.Fatal(err)
	}
	sub, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Rollback(ctx)                              //nolint:errcheck // failed below
	if _, err := sub.Exec(ctx, `SELECT 1`); err != nil { // its snapshot
		t.Fatal(err)
	}
	if _, err := projections.Rebuild(ctx, pool, projections.Accounts{}); err != nil {
		t.Fatal(err)
	}
	_, err = sub.Exec(ctx, `SELECT offset_acked FROM watermill_offsets_accounts WHERE consumer_group = 'accounts_v1' FOR UPDATE`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
		t.Fatalf("a subscriber with a snapshot from before the rebuild locked its offset: %v, want a serialization failure", err)
	}
}

// The swap waits for no one who waits for it. A transaction that holds one of the old
// tables and then asks for something the rebuild holds already (the chain's head, as a
// credit does after reading its charge; another table, as authentication reads
// key_secrets, then api_keys) gets it once the rebuild's short lock wait ends and it lets
// go, and both go through, where PostgreSQL would otherwise abort one as a deadlock.
func TestRebuildSwapsPastAReaderThatWaitsForIt(t *testing.T) {
	tests := []struct {
		name        string
		p           projections.Projection
		log         func(t *testing.T, pool *pgxpool.Pool)
		held, asked string // what the reader reads first, and then
		waitsOn     string // the table the rebuild then waits for
		rebuilt     string // a count of the rebuilt rows: 1
	}{
		{"ledger, a credit", projections.Ledger{},
			func(t *testing.T, pool *pgxpool.Pool) { appendCharge(t, pool, charge("key_a", "a1", true)) },
			`SELECT count(*) FROM charges`, `SELECT 1 FROM event_chain FOR UPDATE`, "charges", `SELECT count(*) FROM charges`},
		{"accounts, authentication", projections.Accounts{},
			func(t *testing.T, pool *pgxpool.Pool) {
				appendRaw(t, pool, domain.AccountStream("acct_r"), domain.StreamAccount, 0,
					&domain.AccountCreated{AccountID: "acct_r", Email: "r@example.com", Name: "R", Plan: "free", CreatedAt: time.Now().UTC()})
			},
			`SELECT count(*) FROM key_secrets`, `SELECT count(*) FROM api_keys`, "key_secrets", `SELECT count(*) FROM accounts`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := pgtest.NewDB(t)
			ctx := context.Background()
			tt.log(t, pool)
			reader, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer reader.Rollback(ctx) //nolint:errcheck // committed below
			if _, err := reader.Exec(ctx, tt.held); err != nil {
				t.Fatal(err)
			}
			rebuilt := make(chan error, 1)
			go func() {
				_, err := projections.Rebuild(ctx, pool, tt.p)
				rebuilt <- err
			}()
			pgtest.WaitFor(t, "the rebuild asking for "+tt.waitsOn, func() bool {
				return count(t, pool, `SELECT count(*) FROM pg_locks WHERE relation = to_regclass($1) AND mode = 'AccessExclusiveLock' AND NOT granted`, tt.waitsOn) > 0
			})
			if _, err := reader.Exec(ctx, tt.asked); err != nil {
				t.Fatalf("the reader's second read: %v", err)
			}
			if err := reader.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-rebuilt; err != nil {
				t.Fatalf("rebuild: %v", err)
			}
			if count(t, pool, tt.rebuilt) != 1 {
				t.Fatal("the rebuilt rows are not there")
			}
		})
	}
}

// A migration that alters a table while its rebuild runs waits for the rebuild (which
// holds the table from the start) and then alters the table swapped in: nothing it
// adds is lost with the old table.
func TestMigrationDuringARebuildAltersTheRebuiltTable(t *testing.T) {
	pool := pgtest.NewDB(t)
	ctx := context.Background()
	appendCharge(t, pool, charge("key_a", "a1", true))
	altered := make(chan error, 1)
	restore := projections.BeforeSwap(func() {
		go func() {
			_, err := pool.Exec(ctx, `ALTER TABLE charges ADD COLUMN note text`)
			altered <- err
		}()
		pgtest.WaitFor(t, "the migration waiting for the rebuild", func() bool {
			return count(t, pool, `SELECT count(*) FROM pg_locks WHERE relation = 'public.charges'::regclass AND mode = 'AccessExclusiveLock' AND NOT granted`) > 0
		})
	})
	defer restore()
	if _, err := projections.Rebuild(ctx, pool, projections.Ledger{}); err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	if err := <-altered; err != nil {
		t.Fatalf("the migration: %v", err)
	}
	if count(t, pool, `SELECT count(*) FROM information_schema.columns WHERE table_name = 'charges' AND column_name = 'note'`) != 1 ||
		count(t, pool, `SELECT count(*) FROM charges`) != 1 {
		t.Fatal("the rebuilt charges lost the migration's column, or their row")
	}
}
