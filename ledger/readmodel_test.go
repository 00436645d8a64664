package ledger_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/ledger"
	"chessd/projections"
)

// count runs a counting query.
func count(t *testing.T, pool *pgxpool.Pool, query string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// readModel is every row of the ledger's read model, as text, in order.
func readModel(t *testing.T, pool *pgxpool.Pool) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, table := range (projections.Ledger{}).Tables() {
		rows, err := pool.Query(context.Background(), `SELECT x::text FROM `+pgx.Identifier{table}.Sanitize()+` x ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		if out[table], err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// checkReadModel: every charge in the log, and nothing else, has its row in the read
// model, as the events say (a UnitsCharged its charges row, a ChargesSettled its
// charge_batches row, with the sums of its lines), and its postings in ledger_entries
// (a view of the events), each event's balanced.
func checkReadModel(t *testing.T, pool *pgxpool.Pool, charges int64) {
	t.Helper()
	inLog := count(t, pool, `SELECT coalesce(sum(CASE event_type WHEN 'ChargesSettled' THEN json_array_length(payload->'lines') ELSE 1 END), 0)
		FROM events WHERE stream_type = 'ledger'`)
	if inLog != charges {
		t.Fatalf("%d charges in the log, want %d", inLog, charges)
	}
	if n := count(t, pool, `SELECT count(*) FROM events e JOIN charges c ON c.position = e.position
			AND c.charge_id = e.payload->>'charge_id' AND c.units = (e.payload->>'units')::bigint
			AND c.key_id = e.payload->>'key_id' AND c.request_id = e.payload->>'request_id'
		WHERE e.stream_type = 'ledger'`); n != count(t, pool, `SELECT count(*) FROM events WHERE event_type = 'UnitsCharged'`) ||
		n != count(t, pool, `SELECT count(*) FROM charges`) {
		t.Fatalf("%d UnitsCharged in the read model as the events say (of %d rows)", n, count(t, pool, `SELECT count(*) FROM charges`))
	}
	if n := count(t, pool, `SELECT count(*) FROM events e JOIN charge_batches b ON b.position = e.position
			AND b.units = (e.payload->>'units')::bigint AND b.usd = (e.payload->>'usd')::numeric
			AND b.lines = json_array_length(e.payload->'lines') AND b.key_id = e.payload->>'key_id'
			AND b.account_id = e.payload->>'account_id'
		WHERE e.stream_type = 'ledger'`); n != count(t, pool, `SELECT count(*) FROM events WHERE event_type = 'ChargesSettled'`) ||
		n != count(t, pool, `SELECT count(*) FROM charge_batches`) {
		t.Fatalf("%d ChargesSettled in the read model as the events say (of %d rows)", n, count(t, pool, `SELECT count(*) FROM charge_batches`))
	}
	// each batch's groups, on its row or in charge_batch_hours, are its lines' (the
	// times read back are rounded to the microsecond, a nanosecond before an hour is
	// not one of the tests')
	groups := `SELECT position, hour, endpoint, engine, cached, calls, units, usd FROM charge_batch_groups()`
	fromLines := `SELECT l.position, date_trunc('hour', l.charged_at, 'UTC'), l.endpoint, l.engine, l.cached, count(*), sum(l.units), sum(l.usd)
		FROM charge_lines() l JOIN charge_batches b ON b.position = l.position GROUP BY 1, 2, 3, 4, 5`
	if n := count(t, pool, `SELECT count(*) FROM ((`+groups+` EXCEPT ALL `+fromLines+`) UNION ALL (`+fromLines+` EXCEPT ALL `+groups+`)) d`); n != 0 {
		t.Fatalf("%d batch groups that are not their lines'", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM charge_batches b
		WHERE (b.endpoint IS NULL) <> EXISTS (SELECT 1 FROM charge_batch_hours h WHERE h.position = b.position)`); n != 0 {
		t.Fatalf("%d batches with their group on their row and in charge_batch_hours, or in neither", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM charge_lines()`); n != charges {
		t.Fatalf("charge_lines() has %d charges, want %d", n, charges)
	}
	if n, want := count(t, pool, `SELECT count(*) FROM ledger_entries`),
		count(t, pool, `SELECT coalesce(sum(json_array_length(payload->'postings')), 0) FROM events WHERE stream_type = 'ledger'`); n != want || n == 0 {
		t.Fatalf("%d postings in the read model, %d in the events", n, want)
	}
	if n := count(t, pool, `SELECT count(*) FROM (SELECT position, currency FROM ledger_entries
			GROUP BY 1, 2 HAVING sum(debit) <> sum(credit)) unbalanced`); n != 0 {
		t.Fatalf("%d charges' postings do not balance in a currency", n)
	}
}

// The read model is written by the transactions that charge, with no projection
// running: after a settle (the first through the pipelined path, the next ones
// through the one-round-trip path) and after a job's position (Transact), every charge
// has its rows, health reports no lag, nothing is published on the ledger's bus topic,
// and a rebuild from the events gives the same rows.
func TestChargesAreInTheReadModelOnCommit(t *testing.T) {
	f := newFixture(t, nil)
	m := f.meter(t, ledger.MeterConfig{})
	ctx := context.Background()
	for i := range 4 {
		r, err := m.Reserve(ctx, f.evalCall(i))
		if err != nil {
			t.Fatal(err)
		}
		a := answered()
		a.Cached = i == 2
		if err := r.Settle(a); err != nil {
			t.Fatal(err)
		}
		if err := m.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		checkReadModel(t, f.pool, int64(i+1))
	}
	// three calls behind the chain's head: the first settles alone, the other two as the
	// lines of one ChargesSettled
	var rs []*ledger.Reservation
	for i := 4; i < 7; i++ {
		r, err := m.Reserve(ctx, f.evalCall(i))
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	release := holdChain(t, f.pool)
	for i, r := range rs {
		a := answered()
		a.Cached = i == 2
		if err := r.Settle(a); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			waitForALockWait(t, f.pool)
		}
	}
	release()
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	checkReadModel(t, f.pool, 7)
	if n := count(t, f.pool, `SELECT count(*) FROM charge_batches WHERE lines = 2`); n != 1 {
		t.Fatalf("%d ChargesSettled of two lines, want 1", n)
	}
	day := time.Now().UTC().Format(time.DateOnly)
	_, err := f.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		if err := ledger.HoldJob(ctx, tx, "job_inline", f.key, 1_000_000, day, 20); err != nil {
			return err
		}
		var chs []ledger.Charge // two positions recorded together: one settle
		for i := range 2 {
			ch := ledger.Charge{RequestID: "job:job_inline", Key: f.key, Endpoint: domain.EndpointEval,
				Params: ledger.Params{Depth: 8, MultiPV: 1, Positions: 1, JobID: "job_inline"}, Engine: "sf-17.1", Path: "native",
				Units: 10, USD: ledger.UnitsUSD(10)}
			if i == 1 {
				ch.Params.FEN = "8/8/8/8/8/8/8/K6k w - - 0 1"
			}
			chs = append(chs, ch)
		}
		if _, err := ledger.ChargeHeld(ctx, tx, "job_inline", day, chs, time.Now()); err != nil {
			return err
		}
		return ledger.ReleaseHold(ctx, tx, "job_inline")
	})
	if err != nil {
		t.Fatal(err)
	}
	checkReadModel(t, f.pool, 9)
	if n := count(t, f.pool, `SELECT count(*) FROM watermill_ledger`); n != 0 {
		t.Fatalf("%d messages on the ledger's bus topic, want none", n)
	}

	head, sts, err := projections.Statuses(ctx, f.pool, projections.All())
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range sts {
		if st.Name == (projections.Ledger{}).Name() && (!st.Inline || st.Lag != 0 || st.Position != head || st.SetAside != 0) {
			t.Fatalf("ledger status %+v at head %d, want inline at the head", st, head)
		}
	}
	if n, age, err := projections.Behind(ctx, f.pool, projections.Ledger{}.Name()); err != nil || n != 0 || age != 0 {
		t.Fatalf("ledger behind by %d events, %s (%v)", n, age, err)
	}

	live := readModel(t, f.pool)
	events := count(t, f.pool, `SELECT count(*) FROM events WHERE stream_type = 'ledger'`) // 4 + 2 + the job's 2
	rep, err := projections.Rebuild(ctx, f.pool, projections.Ledger{})
	if err != nil || rep.Applied != events || events != 8 || rep.SetAside != 0 {
		t.Fatalf("rebuild: %+v %v", rep, err)
	}
	if rebuilt := readModel(t, f.pool); !reflect.DeepEqual(live, rebuilt) {
		t.Fatalf("the rebuilt read model differs:\nlive    %v\nrebuilt %v", live, rebuilt)
	}
	if n := count(t, f.pool, `SELECT count(*) FROM projection_checkpoints WHERE name = 'ledger_v1'`); n != 0 {
		t.Fatal("the inline projection has a checkpoint")
	}
}

// A charge the read model refuses (postings that do not balance) fails its settle,
// which commits nothing; the calls of the same group commit are then settled one by
// one: the refused one is forgiven, never charged, the others are charged once, and
// the meter goes on.
func TestUnbalancedChargeIsForgivenNotCharged(t *testing.T) {
	f := newFixture(t, nil)
	m := f.meter(t, ledger.MeterConfig{})
	ctx := context.Background()
	var rs []*ledger.Reservation
	for i := range 4 {
		r, err := m.Reserve(ctx, f.evalCall(i))
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	// Hold the chain's head so that the first call's settle waits, and the next three
	// make up one group commit.
	release := holdChain(t, f.pool)
	if err := rs[0].Settle(answered()); err != nil {
		t.Fatal(err)
	}
	waitForALockWait(t, f.pool)
	restore := ledger.EditSettled(func(e *ledger.ChargesSettled) {
		for _, l := range e.Lines {
			if l.RequestID == "req-2" {
				e.Postings = e.Postings[:1]
			}
		}
	})
	for _, r := range rs[1:] {
		if err := r.Settle(answered()); err != nil {
			t.Fatal(err)
		}
	}
	release()
	m.Flush(ctx) //nolint:errcheck // the refused charge's error; what counts is below
	restore()    // the settler builds the events: only now is the edit done
	if b := f.balance(t); b.charges != 3 || b.spent != 30 || b.dayUnits != 30 {
		t.Fatalf("%d charges for %d units (allowance used %d); want 3 for 30: the refused call is forgiven", b.charges, b.spent, b.dayUnits)
	}
	if n := count(t, f.pool, `SELECT count(*) FROM events WHERE payload::text LIKE '%"req-2"%'`); n != 0 {
		t.Fatal("the unbalanced charge is in the log")
	}
	checkReadModel(t, f.pool, 3)
	r, err := m.Reserve(ctx, f.evalCall(5))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Settle(answered()); err != nil {
		t.Fatal(err)
	}
	if err := m.Flush(ctx); err != nil {
		t.Fatalf("the meter after a refused charge: %v", err)
	}
	checkReadModel(t, f.pool, 4)
}

// waitForALockWait waits until a transaction waits for a lock: the settle of a call
// answered while the test holds the chain's head.
func waitForALockWait(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first settle never waited for the chain's head")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
