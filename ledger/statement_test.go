package ledger_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/ledger"
	"chessd/postgres/pgtest"
)

// A cursor has one spelling: what EncodeCursor gives decodes to its charge, a cursor
// of the service before charges had lines (8 bytes) to its position's line 0, and
// anything else is a 400 naming the field cursor.
func TestDecodeCursor(t *testing.T) {
	for _, p := range []int64{1, 2, 255, 1 << 40, math.MaxInt64} {
		for _, line := range []int{0, 1, 511} {
			want := ledger.Cursor{Position: p, Line: line}
			c := ledger.EncodeCursor(want)
			if got, err := ledger.DecodeCursor(c); err != nil || got != want {
				t.Errorf("DecodeCursor(EncodeCursor(%+v) = %q) = %+v, %v", want, c, got, err)
			}
		}
	}
	if got, err := ledger.DecodeCursor("AAAAAAAAAAE"); err != nil || got != (ledger.Cursor{Position: 1}) { // 8 bytes: position 1
		t.Errorf("an 8-byte cursor decodes to %+v, %v; want position 1, line 0", got, err)
	}
	for _, bad := range []string{
		"", "abc", "1", "AAAAAAAAAAA", // position 0
		"gAAAAAAAAAA",      // the sign bit: a negative position
		"AAAAAAAAAAB",      // the last character's unused bits set: another spelling of 0
		"AAAAAAAAAAE=",     // padded
		"AAAAAAAAAAAE",     // 9 bytes
		"AAAAAAAAA+E",      // standard base64, not URL-safe
		"AAAAAAAAAAEAAAIA", // line 512: no event has it
		"AAAAAAAAAAAAAAAA", // position 0, line 0
		"AAAAAAAA\x00AE", "ÄAAAAAAAAE", strings.Repeat("A", 1000),
	} {
		_, err := ledger.DecodeCursor(bad)
		if !isCursorProblem(err) {
			t.Errorf("DecodeCursor(%q) = %v, want a 400 naming cursor", bad, err)
		}
	}
}

func isCursorProblem(err error) bool {
	e, ok := err.(*domain.Error)
	return ok && e.Code == domain.CodeInvalid && len(e.Fields) == 1 && e.Fields[0].Field == "cursor"
}

// FuzzDecodeCursor: whatever a client sends as a cursor is either refused as a 400
// naming cursor, or is exactly the cursor of a charge (a positive position, a line the
// settler can write), or an 8-byte cursor of a position.
func FuzzDecodeCursor(f *testing.F) {
	for _, s := range []string{ledger.EncodeCursor(ledger.Cursor{Position: 1}), ledger.EncodeCursor(ledger.Cursor{Position: math.MaxInt64, Line: 511}),
		"AAAAAAAAAAA", "AAAAAAAAAAE", "", "AAAAAAAAAAB", "gAAAAAAAAAA", "____________", "________________"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ledger.DecodeCursor(s)
		if err != nil {
			if !isCursorProblem(err) {
				t.Fatalf("DecodeCursor(%q): %v is not a 400 naming cursor", s, err)
			}
			return
		}
		if c.Position <= 0 || c.Line < 0 || c.Line >= 512 {
			t.Fatalf("DecodeCursor(%q) = %+v", s, c)
		}
		if len(s) == 11 {
			if c.Line != 0 || ledger.EncodeCursor(c)[:11] != s { // the same first 8 bytes, line 0
				t.Fatalf("the 8-byte cursor %q decodes to %+v", s, c)
			}
			return
		}
		if ledger.EncodeCursor(c) != s {
			t.Fatalf("DecodeCursor(%q) = %+v, which encodes as %q", s, c, ledger.EncodeCursor(c))
		}
	})
}

// Reprice prices a recorded charge again with Quote: fresh or cached, one position or
// many, and says when what was charged is not what the table gives.
func TestReprice(t *testing.T) {
	line := func(ep domain.Endpoint, depth, multipv, movetime, positions int, cached bool, units int64) ledger.ChargeLine {
		return ledger.ChargeLine{Endpoint: string(ep), Cached: cached, Units: units, USD: ledger.UnitsUSD(units),
			Params: ledger.Params{Depth: depth, MultiPV: multipv, MoveTimeMS: movetime, Positions: positions}}
	}
	cases := []struct {
		name             string
		c                ledger.ChargeLine
		units, depthUnit int64
		matches          bool
	}{
		{"fresh", line(domain.EndpointEval, 8, 1, 0, 1, false, 10), 10, 10, true},
		{"cached", line(domain.EndpointEval, 8, 1, 0, 1, true, 1), 1, 10, true},
		{"movetime caps", line(domain.EndpointBestMove, 30, 1, 100, 1, false, 5), 5, 320, true},
		{"a job's position", line(domain.EndpointBatch, 14, 3, 0, 1, false, 40), 40, 40, true},
		{"cached positions", line(domain.EndpointAnalyze, 14, 3, 0, 5, true, 20), 20, 40, true},
		{"overcharged", line(domain.EndpointEval, 8, 1, 0, 1, false, 11), 10, 10, false},
		{"charged fresh, was cached", line(domain.EndpointEval, 8, 1, 0, 1, true, 10), 1, 10, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pc := ledger.Reprice(tc.c)
			if pc.Err != nil || pc.Units != tc.units || !pc.USD.Equal(ledger.UnitsUSD(tc.units)) || pc.DepthUnits != tc.depthUnit ||
				pc.Matches() != tc.matches {
				t.Fatalf("Reprice: %d units $%s (depth alone %d), matches %v, err %v; want %d units (%d), matches %v",
					pc.Units, pc.USD, pc.DepthUnits, pc.Matches(), pc.Err, tc.units, tc.depthUnit, tc.matches)
			}
		})
	}
	// USD is compared too: the right units at another USD amount do not match
	c := line(domain.EndpointEval, 8, 1, 0, 1, false, 10)
	c.USD = decimal.RequireFromString("0.000101")
	if ledger.Reprice(c).Matches() {
		t.Fatal("a charge of the right units but the wrong USD matches")
	}
	if pc := ledger.Reprice(line(domain.EndpointEval, 0, 1, 0, 1, false, 10)); pc.Err == nil || pc.Matches() {
		t.Fatalf("inputs outside the table: %+v", pc)
	}
}

// Paging with the cursor while charges keep being committed between the pages returns
// every charge exactly once, in the order they were committed, and the totals of each
// page are those of the whole range at that moment.
func TestStatementPagesEveryChargeOnceWhileChargesArrive(t *testing.T) {
	f := newFixture(t, nil)
	chargeAt := clockedMeter(t, f)
	ctx := context.Background()
	n := 0
	charge := func(cached bool) {
		t.Helper()
		chargeAt(n, time.Now(), cached)
		n++
	}
	for i := range 7 {
		charge(i%3 == 0)
	}
	q := ledger.StatementQuery{AccountID: f.key.AccountID(), Env: "live", Limit: 3}
	seen := map[string]int{}
	var order []ledger.ChargeLine
	for page := 0; ; page++ {
		st, err := ledger.ReadStatement(ctx, f.pool, q)
		if err != nil {
			t.Fatal(err)
		}
		if st.Calls != int64(n) {
			t.Fatalf("page %d: totals count %d charges, %d were made", page, st.Calls, n)
		}
		for _, c := range st.Charges {
			seen[c.ChargeID]++
			order = append(order, c)
		}
		if st.Next == (ledger.Cursor{}) {
			break
		}
		if page < 6 { // two more charges land between this page and the next
			charge(false)
			charge(true)
		}
		q.After = st.Next
	}
	q.After, q.Limit = ledger.Cursor{}, ledger.MaxStatementLimit
	all, err := ledger.ReadStatement(ctx, f.pool, q)
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Charges) != n || all.Next != (ledger.Cursor{}) {
		t.Fatalf("the whole statement has %d charges (next %+v), %d were made", len(all.Charges), all.Next, n)
	}
	units, usd := int64(0), decimal.Zero
	for i, c := range all.Charges {
		if seen[c.ChargeID] != 1 {
			t.Errorf("charge %s (position %d) was paged %d times", c.ChargeID, c.Position, seen[c.ChargeID])
		}
		if i >= len(order) || order[i].ChargeID != c.ChargeID {
			t.Fatalf("paging order differs from the statement's at %d", i)
		}
		units, usd = units+c.Units, usd.Add(c.USD)
	}
	if len(order) != n {
		t.Fatalf("paged %d charges, %d were made", len(order), n)
	}
	var spent int64
	var spentUSD decimal.Decimal
	if err := f.pool.QueryRow(ctx, `SELECT spent_units, spent_usd FROM key_balances WHERE key_id = $1`, f.key.ID()).
		Scan(&spent, &spentUSD); err != nil {
		t.Fatal(err)
	}
	if all.Units != units || !all.USD.Equal(usd) || units != spent || !usd.Equal(spentUSD) {
		t.Fatalf("totals %d units $%s, rows %d $%s, key spent %d $%s", all.Units, all.USD, units, usd, spent, spentUSD)
	}
	// the other book, another account: nothing
	for _, other := range []ledger.StatementQuery{{AccountID: f.key.AccountID(), Env: "test", Limit: 10}, {AccountID: "acct_other", Env: "live", Limit: 10}} {
		st, err := ledger.ReadStatement(ctx, f.pool, other)
		if err != nil || len(st.Charges) != 0 || st.Calls != 0 {
			t.Fatalf("%+v sees %d charges (%v)", other, len(st.Charges), err)
		}
	}
}

// A reader of the ledger's read model takes its snapshot only once it may read the
// tables: one that waited for a rebuild swapping in new tables (here, a transaction
// holding one of them exclusively while it adds a row) sees the rows the swap brought,
// in the charges and in the rollups alike.
func TestReadOnlySnapshotFollowsASwap(t *testing.T) {
	tests := []struct{ table, insert string }{
		{"charges", `INSERT INTO charges (position, charge_id, request_id, account_id, key_id, env, day, charged_at,
				endpoint, engine, path, cached, units, usd, params)
			VALUES (1, 'chg_1', 'req_1', 'acct_1', 'key_1', 'live', '2026-11-24', now(), 'eval', 'sf-17.1', 'native', false, 1, 0.001, '{}')`},
		{"usage_hours", `INSERT INTO usage_hours (account_id, hour, key_id, env, endpoint, engine, cached,
				calls, units, usd, credits, credited_units, credited_usd)
			VALUES ('acct_1', date_trunc('hour', now()), 'key_1', 'live', 'eval', 'sf-17.1', false, 1, 1, 0.001, 0, 0, 0)`},
	}
	for _, tt := range tests {
		t.Run(tt.table, func(t *testing.T) {
			pool := pgtest.NewDB(t)
			ctx := context.Background()
			swap, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer swap.Rollback(ctx) //nolint:errcheck // committed below
			if _, err := swap.Exec(ctx, `LOCK TABLE `+tt.table+` IN ACCESS EXCLUSIVE MODE`); err != nil {
				t.Fatal(err)
			}
			if _, err := swap.Exec(ctx, tt.insert); err != nil {
				t.Fatal(err)
			}
			seen := make(chan int, 1)
			go func() {
				n := -1
				err := ledger.ReadOnly(ctx, pool, func(tx pgx.Tx) error {
					return tx.QueryRow(ctx, `SELECT count(*) FROM `+tt.table).Scan(&n)
				})
				if err != nil {
					t.Error(err)
				}
				seen <- n
			}()
			deadline := time.Now().Add(20 * time.Second)
			for waiting := 0; waiting == 0; {
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE relation = to_regclass($1) AND NOT granted`, tt.table).Scan(&waiting); err != nil {
					t.Fatal(err)
				}
				if time.Now().After(deadline) {
					t.Fatal("the reader never waited for the swap")
				}
				time.Sleep(5 * time.Millisecond)
			}
			if err := swap.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if n := <-seen; n != 1 {
				t.Fatalf("the reader saw %d rows, want the 1 the swap brought", n)
			}
		})
	}
}

// A statement pages through the lines of ChargesSettled events one by one, a page
// ending in the middle of an event as well as at its end, whatever the filter keeps of
// each event's lines (an endpoint keeps a third of them, so a page reads more events
// than it shows): every page size gives the charges of the range in log order, each
// once, as charge_lines() has them.
func TestStatementPagesThroughTheLinesOfEvents(t *testing.T) {
	f := newRollupFixture(t)
	ctx := context.Background()
	start := time.Date(2026, 3, 6, 5, 3, 0, 0, time.UTC)
	f.chargeInGroups(t, 36, func(j int) time.Time { return start.Add(time.Duration(j) * 7 * time.Minute) })
	if n := count(t, f.pool, `SELECT count(*) FROM charge_batches WHERE lines > 1`); n == 0 {
		t.Fatal("no event has several lines")
	}
	since := start.Add(100 * time.Minute)
	for _, q := range []ledger.StatementQuery{
		{},
		{Endpoint: "bestmove"},
		{KeyID: f.keys[1].ID()},
		{Since: &since},
	} {
		q.AccountID, q.Env = f.account.ID(), "live"
		rows, err := f.pool.Query(ctx, `SELECT charge_id FROM charge_lines() WHERE account_id = $1 AND env = 'live'
			AND ($2 = '' OR endpoint = $2) AND ($3 = '' OR key_id = $3) AND ($4::timestamptz IS NULL OR charged_at >= $4)
			ORDER BY position, line`, q.AccountID, q.Endpoint, q.KeyID, q.Since)
		if err != nil {
			t.Fatal(err)
		}
		want, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(want) < 5 {
			t.Fatalf("%+v: %d charges (%v)", q, len(want), err)
		}
		for _, limit := range []int{1, 2, 7, 1000} {
			q := q
			q.Limit = limit
			var got []string
			for pages := 0; ; pages++ {
				st, err := ledger.ReadStatement(ctx, f.pool, q)
				if err != nil {
					t.Fatal(err)
				}
				if len(st.Charges) > limit || (st.Next != (ledger.Cursor{}) && len(st.Charges) != limit) || pages > len(want) {
					t.Fatalf("%+v: a page of %d charges, next %+v", q, len(st.Charges), st.Next)
				}
				for _, c := range st.Charges {
					got = append(got, c.ChargeID)
				}
				if st.Next == (ledger.Cursor{}) {
					break
				}
				q.After = st.Next
			}
			if !slices.Equal(got, want) {
				t.Fatalf("endpoint %q key %q since %v, pages of %d:\n got %v\nwant %v", q.Endpoint, q.KeyID, q.Since, limit, got, want)
			}
		}
	}
}

// An explanation's sums around a charge are what the charges before it add up to,
// line by line (the oracle below reads every line of charge_lines() up to the charge):
// the key's spend in its budget's period and the account's use on the charge's day,
// through events whose lines cross midnight, counted by their sums where an event is
// wholly in the period or the day, and through the earlier lines of the charge's own.
func TestExplainSumsTheChargesBeforeIt(t *testing.T) {
	f := newRollupFixture(t)
	ctx := context.Background()
	budget := int64(1_000_000_000)
	f.keys = append(f.keys, f.createKey(t, domain.KeySettings{Scopes: []domain.Scope{domain.ScopeEval}, Env: domain.EnvLive,
		BudgetUnits: &budget, Period: domain.PeriodDay}))
	start := time.Date(2026, 3, 6, 5, 3, 0, 0, time.UTC)
	f.chargeInGroups(t, 72, func(j int) time.Time { return start.Add(time.Duration(j) * 97 * time.Minute) })
	if n := count(t, f.pool, `SELECT count(*) FROM charge_batches WHERE key_id = $1 AND first_day < last_day`, f.keys[3].ID()); n == 0 {
		t.Fatal("no event of the daily key has lines on both sides of a midnight")
	}
	rows, err := f.pool.Query(ctx, `SELECT charge_id, position, line, key_id, env, day FROM charge_lines() ORDER BY position, line`)
	if err != nil {
		t.Fatal(err)
	}
	type charge struct {
		id, key, env string
		pos          int64
		line         int
		day          time.Time
	}
	charges, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (charge, error) {
		var c charge
		return c, r.Scan(&c.id, &c.pos, &c.line, &c.key, &c.env, &c.day)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(charges) != 72 {
		t.Fatalf("%d charges, want 72", len(charges))
	}
	periods := 0
	for _, c := range charges {
		x, err := ledger.ExplainCharge(ctx, f.pool, f.account.ID(), c.env, c.id)
		if err != nil {
			t.Fatalf("explain %s: %v", c.id, err)
		}
		if x.PeriodStart != nil {
			periods++
		}
		var want ledger.Explanation
		if err := f.pool.QueryRow(ctx, `SELECT
				coalesce(sum(units) FILTER (WHERE (position, line) < ($3, $5)), 0),
				coalesce(sum(usd) FILTER (WHERE (position, line) < ($3, $5)), 0),
				coalesce(sum(units), 0), coalesce(sum(usd), 0)
			FROM charge_lines() WHERE account_id = $1 AND key_id = $2 AND (position, line) <= ($3, $5)
				AND ($4::timestamptz IS NULL OR charged_at >= $4)`,
			f.account.ID(), c.key, c.pos, x.PeriodStart, c.line).
			Scan(&want.SpentBefore.Units, &want.SpentBefore.USD, &want.SpentAfter.Units, &want.SpentAfter.USD); err != nil {
			t.Fatal(err)
		}
		if err := f.pool.QueryRow(ctx, `SELECT coalesce(sum(units) FILTER (WHERE (position, line) < ($4, $5)), 0), coalesce(sum(units), 0)
			FROM charge_lines() WHERE account_id = $1 AND env = $2 AND day = $3 AND (position, line) <= ($4, $5)`,
			f.account.ID(), c.env, c.day, c.pos, c.line).Scan(&want.DayUnitsBefore, &want.DayUnitsAfter); err != nil {
			t.Fatal(err)
		}
		if x.SpentBefore.Units != want.SpentBefore.Units || !x.SpentBefore.USD.Equal(want.SpentBefore.USD) ||
			x.SpentAfter.Units != want.SpentAfter.Units || !x.SpentAfter.USD.Equal(want.SpentAfter.USD) ||
			x.DayUnitsBefore != want.DayUnitsBefore || x.DayUnitsAfter != want.DayUnitsAfter {
			t.Fatalf("%s (line %d of %d): key %+v -> %+v, day %d -> %d; the lines before it add up to key %+v -> %+v, day %d -> %d",
				c.id, c.line, c.pos, x.SpentBefore, x.SpentAfter, x.DayUnitsBefore, x.DayUnitsAfter,
				want.SpentBefore, want.SpentAfter, want.DayUnitsBefore, want.DayUnitsAfter)
		}
	}
	if periods == 0 {
		t.Fatal("no charge was explained within a budget's period")
	}
}

// An explained charge shows its credit as the statement does (the line item, as in the
// statement): a credited charge its credit's id, time and reason, one of a batch too,
// and an uncredited one none.
func TestExplainShowsTheCreditAsTheStatement(t *testing.T) {
	f := newRollupFixture(t)
	ctx := context.Background()
	start := time.Date(2026, 3, 6, 5, 3, 0, 0, time.UTC)
	f.chargeInGroups(t, 9, func(j int) time.Time { return start.Add(time.Duration(j) * time.Minute) })
	rows, err := f.pool.Query(ctx, `SELECT charge_id FROM charge_lines() WHERE account_id = $1 AND env = 'live' ORDER BY position DESC, line DESC`, f.account.ID())
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(ids) < 4 {
		t.Fatalf("%d charges (%v)", len(ids), err)
	}
	for i, id := range []string{ids[0], ids[3]} {
		_, err := f.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
			_, err := ledger.Credit(ctx, tx, ledger.CreditRequest{ChargeID: id, Reason: fmt.Sprintf("test %d", i), Actor: "ops"},
				start.Add(time.Duration(i+1)*time.Hour))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	st, err := ledger.ReadStatement(ctx, f.pool, ledger.StatementQuery{AccountID: f.account.ID(), Env: "live", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	credited := 0
	for _, c := range st.Charges {
		x, err := ledger.ExplainCharge(ctx, f.pool, f.account.ID(), c.Env, c.ChargeID)
		if err != nil {
			t.Fatalf("explain %s: %v", c.ChargeID, err)
		}
		str := func(s *string) string {
			if s == nil {
				return "<nil>"
			}
			return *s
		}
		if str(x.Charge.CreditID) != str(c.CreditID) || str(x.Charge.CreditReason) != str(c.CreditReason) ||
			(x.Charge.CreditedAt == nil) != (c.CreditedAt == nil) || (c.CreditedAt != nil && !x.Charge.CreditedAt.Equal(*c.CreditedAt)) {
			t.Fatalf("%s: explained with credit %s at %v (%s), the statement has %s at %v (%s)", c.ChargeID,
				str(x.Charge.CreditID), x.Charge.CreditedAt, str(x.Charge.CreditReason), str(c.CreditID), c.CreditedAt, str(c.CreditReason))
		}
		if c.CreditID != nil {
			credited++
		}
	}
	if credited != 2 {
		t.Fatalf("%d charges credited in the statement, want 2", credited)
	}
}
