package projections_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"chessd/eventstore"
	"chessd/ledger"
	"chessd/postgres/pgtest"
	"chessd/projections"
)

// charge is a charge of 10 units on key, its postings balanced or not.
func charge(key, request string, balanced bool) *ledger.UnitsCharged {
	c := &ledger.UnitsCharged{ChargeID: "chg_" + request, RequestID: request, AccountID: "acct_l", KeyID: key, Env: "live",
		Day: "2025-01-02", ChargedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), Endpoint: "eval", Engine: "sf-17.1",
		Path: "native", Units: 10, USD: decimal.RequireFromString("0.001"),
		Postings: []ledger.Posting{{Book: "units", Account: "key", Currency: "units", Debit: decimal.NewFromInt(10)},
			{Book: "units", Account: "revenue", Currency: "units", Credit: decimal.NewFromInt(10)}}}
	if !balanced {
		c.Postings = c.Postings[:1]
	}
	return c
}

func appendCharge(t *testing.T, pool *pgxpool.Pool, c *ledger.UnitsCharged) eventstore.Event {
	t.Helper()
	return appendRaw(t, pool, ledger.Stream(c.KeyID), ledger.StreamLedger, eventstore.AnyVersion, c)[0]
}

// The ledger's read model is written by the append itself: a charge it cannot hold (a
// NUL in a request id, which PostgreSQL refuses in text) or refuses (postings that do
// not balance) fails its append, which leaves the log as it was, and the charges of
// the same transaction with it.
func TestLedgerAppendFailsWhenTheReadModelRefuses(t *testing.T) {
	pool := pgtest.NewDB(t)
	ctx := context.Background()
	good := appendCharge(t, pool, charge("key_a", "a1", true))
	for _, c := range []struct {
		name   string
		charge *ledger.UnitsCharged
		is     func(error) bool
	}{
		{"a NUL in text", charge("key_b", "b\x001", true), func(err error) bool {
			var pgErr *pgconn.PgError
			return errors.As(err, &pgErr) && pgErr.Code == "22021"
		}},
		{"postings that do not balance", charge("key_c", "c1", false), func(err error) bool { return errors.Is(err, eventstore.ErrRefused) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := eventstore.NewStore(pool, quiet).Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
				for _, e := range []*ledger.UnitsCharged{charge("key_a", "a-"+c.name, true), c.charge} {
					if err := tx.Append(ctx, ledger.Stream(e.KeyID), ledger.StreamLedger, eventstore.AnyVersion, eventstore.Metadata{},
						eventstore.New{Type: e.EventType(), Payload: e}); err != nil {
						return err
					}
				}
				return nil
			})
			if !c.is(err) {
				t.Fatalf("append: %v", err)
			}
			if n := count(t, pool, `SELECT count(*) FROM events`); n != 1 {
				t.Fatalf("%d events in the log, want the good one alone", n)
			}
			if n := count(t, pool, `SELECT count(*) FROM charges`); n != 1 ||
				count(t, pool, `SELECT count(*) FROM charges WHERE position = $1`, good.Position) != 1 {
				t.Fatalf("%d charges in the read model, want the good one alone", n)
			}
		})
	}
	if rep, err := eventstore.Verify(ctx, pool); err != nil || rep.Tamper != nil || rep.Events != 1 {
		t.Fatalf("verify: %+v %v", rep, err)
	}
}

// A rebuild sets aside a charge the read model refuses now (here a constraint added
// after it was charged) and, since the live writers cannot hold a key's later charges
// behind it, holds none either: the rest is as live. Once the constraint goes, a
// retry applies it and the read model is the live one again.
func TestLedgerRebuildSetsAsideWithoutHolding(t *testing.T) {
	pool := pgtest.NewDB(t)
	ctx := context.Background()
	appendCharge(t, pool, charge("key_a", "a1", true))
	refused := appendCharge(t, pool, charge("key_b", "b1", true))
	appendCharge(t, pool, charge("key_a", "a2", true))
	later := appendCharge(t, pool, charge("key_b", "b2", true))
	live := snapshot(t, pool, projections.Ledger{}.Tables())
	if len(live["charges"]) != 4 {
		t.Fatalf("%d charges in the read model, want 4", len(live["charges"]))
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE charges ADD CONSTRAINT no_b1 CHECK (request_id <> 'b1') NOT VALID`); err != nil {
		t.Fatal(err)
	}
	rep, err := projections.Rebuild(ctx, pool, projections.Ledger{})
	if err != nil || rep.Applied != 3 || rep.SetAside != 1 {
		t.Fatalf("rebuild: %+v %v", rep, err)
	}
	list, err := projections.ListSetAside(ctx, pool, false)
	if err != nil || len(list) != 1 {
		t.Fatalf("set aside: %+v %v", list, err)
	}
	if s := setAsideAt(t, list, refused.Position); s.HeldBy != nil || s.Projection != "ledger_v1" {
		t.Fatalf("the refused charge: %+v", s)
	}
	if count(t, pool, `SELECT count(*) FROM charges WHERE position = $1`, later.Position) != 1 ||
		count(t, pool, `SELECT count(*) FROM charges`) != 3 {
		t.Fatal("the rebuild held a later charge of the same key, or lost another")
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE charges DROP CONSTRAINT no_b1`); err != nil {
		t.Fatal(err)
	}
	res, err := projections.RetrySetAside(ctx, pool, projections.All(), list[0].ID, "ops@test", "constraint dropped")
	if err != nil || !reflect.DeepEqual(res.Applied, []int64{refused.Position}) {
		t.Fatalf("retry: %+v %v", res, err)
	}
	if now := snapshot(t, pool, projections.Ledger{}.Tables()); !reflect.DeepEqual(live, now) {
		t.Fatalf("after the retry:\nlive %v\nnow  %v", live, now)
	}
}

// A database of the version before the ledger was inline may hold charges whose bus
// messages its subscriber had not read yet, and so no rows. The first projection
// runner to start applies them (and only them), and leaves the ledger's bus tables and
// checkpoint empty.
func TestLedgerCatchesUpWhatTheBusLeft(t *testing.T) {
	pool := pgtest.NewDB(t)
	ctx := context.Background()
	read := appendCharge(t, pool, charge("key_a", "a1", true))
	unread := []eventstore.Event{appendCharge(t, pool, charge("key_a", "a2", true)), appendCharge(t, pool, charge("key_b", "b1", true))}
	// As the earlier version left it: messages for all three, the first acknowledged
	// (applied), the others not, their rows missing.
	publish := func(evs ...eventstore.Event) (xid string, offset int64) {
		t.Helper()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, e := range evs {
				body, err := json.Marshal(e)
				if err != nil {
					return err
				}
				if err := tx.QueryRow(ctx, `INSERT INTO watermill_ledger (uuid, payload, metadata, transaction_id)
					VALUES (gen_random_uuid()::text, $1, '{}', pg_current_xact_id()) RETURNING transaction_id::text, "offset"`,
					body).Scan(&xid, &offset); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return xid, offset
	}
	xid, offset := publish(read)
	publish(unread...)
	gone := []int64{unread[0].Position, unread[1].Position}
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO watermill_offsets_ledger (consumer_group, offset_acked, last_processed_transaction_id)
		VALUES ('ledger_v1', $1, $2::xid8)`, offset, xid)
	b.Queue(`INSERT INTO projection_checkpoints (name, position) VALUES ('ledger_v1', $1)`, read.Position)
	b.Queue(`DELETE FROM charges WHERE position = ANY($1)`, gone)
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM charges`); n != 1 {
		t.Fatalf("%d charges before the catch-up, want 1", n)
	}

	runProjections(t, pool, projections.All()...)
	if n := count(t, pool, `SELECT count(*) FROM charges`); n != 3 {
		t.Fatalf("%d charges after the catch-up, want 3", n)
	}
	if n := count(t, pool, `SELECT (SELECT count(*) FROM watermill_ledger) + (SELECT count(*) FROM watermill_offsets_ledger)
			+ (SELECT count(*) FROM projection_checkpoints WHERE name = 'ledger_v1')`); n != 0 {
		t.Fatalf("%d rows left in the ledger's bus tables and checkpoint", n)
	}
}

// settled is a ChargesSettled of two lines on key_s, as the settler makes it.
func settled(t *testing.T) *ledger.ChargesSettled {
	t.Helper()
	at := time.Date(2025, 1, 2, 3, 59, 59, 0, time.UTC)
	line := func(req string, units int64, at time.Time) ledger.SettledCharge {
		return ledger.SettledCharge{RequestID: req, Day: "2025-01-02", ChargedAt: at, Endpoint: "eval", Engine: "sf-17.1",
			Path: "native", Params: ledger.Params{Depth: 8, MultiPV: 1, Positions: 1}, Units: units, USD: ledger.UnitsUSD(units)}
	}
	e := &ledger.ChargesSettled{AccountID: "acct_l", KeyID: "key_s", Env: "live",
		Lines: []ledger.SettledCharge{line("s1", 10, at), line("s2", 1, at.Add(2*time.Second))}, Units: 11, USD: ledger.UnitsUSD(11)}
	tr, err := ledger.ChargeTransaction(e.AccountID, e.Env, e.KeyID, e.Units, e.USD)
	if err != nil {
		t.Fatal(err)
	}
	e.Postings = tr.Postings()
	return e
}

// A ChargesSettled is in the read model as its lines (charge_lines(), each with its
// derived id, in the rollup under its own hour) only when its postings are the charge
// its lines add up to; anything else is refused with its append, and the log is left
// as it was.
func TestLedgerRefusesASettledEventItsLinesDoNotExplain(t *testing.T) {
	pool := pgtest.NewDB(t)
	ctx := context.Background()
	good := appendRaw(t, pool, ledger.Stream("key_s"), ledger.StreamLedger, eventstore.AnyVersion, settled(t))[0]
	rows, err := pool.Query(ctx, `SELECT charge_id || ' ' || request_id || ' ' || units FROM charge_lines() ORDER BY position, line`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if want := []string{ledger.LineChargeID(good.Position, 0) + " s1 10", ledger.LineChargeID(good.Position, 1) + " s2 1"}; err != nil || !reflect.DeepEqual(ids, want) {
		t.Fatalf("charge lines %v (%v), want %v", ids, err, want)
	}
	if n := count(t, pool, `SELECT count(*) FROM usage_hours WHERE calls = 1`); n != 2 {
		t.Fatalf("%d rollup rows of one call, want the two lines' hours", n)
	}
	for _, c := range []struct {
		name string
		edit func(*ledger.ChargesSettled)
	}{
		{"lines that do not add up", func(e *ledger.ChargesSettled) { e.Lines[1].Units = 2 }},
		{"postings of another amount", func(e *ledger.ChargesSettled) {
			tr, _ := ledger.ChargeTransaction(e.AccountID, e.Env, e.KeyID, 12, ledger.UnitsUSD(12))
			e.Postings = tr.Postings()
		}},
		{"postings that do not balance", func(e *ledger.ChargesSettled) { e.Postings = e.Postings[:1] }},
		{"a day that is not one", func(e *ledger.ChargesSettled) { e.Lines[0].Day = "2025-02-30" }},
		{"no lines", func(e *ledger.ChargesSettled) { e.Lines, e.Units, e.USD = nil, 0, ledger.UnitsUSD(0) }},
		{"a negative line", func(e *ledger.ChargesSettled) {
			e.Lines[0].Units, e.Lines[0].USD, e.Lines[1].Units, e.Lines[1].USD = -1, ledger.UnitsUSD(-1), 12, ledger.UnitsUSD(12)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := settled(t)
			c.edit(e)
			_, err := eventstore.NewStore(pool, quiet).Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
				return tx.Append(ctx, ledger.Stream(e.KeyID), ledger.StreamLedger, eventstore.AnyVersion, eventstore.Metadata{},
					eventstore.New{Type: e.EventType(), Payload: e})
			})
			if !errors.Is(err, eventstore.ErrRefused) {
				t.Fatalf("append: %v", err)
			}
			if n := count(t, pool, `SELECT count(*) FROM events`); n != 1 || count(t, pool, `SELECT count(*) FROM charge_lines()`) != 2 {
				t.Fatalf("%d events in the log, want the good one alone", n)
			}
		})
	}
}
