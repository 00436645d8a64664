package ledger_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/ledger"
	"chessd/projections"
)

// rollupFixture is an account with three keys (two live, one test) charged at chosen
// instants through the meter, on several endpoints, engines and prices, and credits
// at chosen instants.
type rollupFixture struct {
	*fixture
	admin  *domain.Key
	keys   []*domain.Key
	meters map[string]*ledger.Meter
	clock  atomic.Value
}

func newRollupFixture(t *testing.T) *rollupFixture {
	t.Helper()
	f := &rollupFixture{fixture: newFixture(t, nil), meters: map[string]*ledger.Meter{}}
	ctx := context.Background()
	var adminID string
	if err := f.pool.QueryRow(ctx, `SELECT key_id FROM key_balances WHERE account_id = $1 AND key_id <> $2`,
		f.account.ID(), f.key.ID()).Scan(&adminID); err != nil {
		t.Fatal(err)
	}
	admin, err := commands.LoadKey(ctx, f.pool, adminID)
	if err != nil {
		t.Fatal(err)
	}
	f.admin = admin
	f.keys = []*domain.Key{f.key}
	for _, env := range []domain.Env{domain.EnvLive, domain.EnvTest} {
		f.keys = append(f.keys, f.createKey(t, domain.KeySettings{Scopes: []domain.Scope{domain.ScopeEval}, Env: env}))
	}
	f.clock.Store(time.Time{})
	return f
}

// createKey makes a key of the account with its admin key.
func (f *rollupFixture) createKey(t *testing.T, settings domain.KeySettings) *domain.Key {
	t.Helper()
	h := commands.New(f.store, []byte("meter-test-pepper-0123456789"))
	k, _, err := h.CreateKey(context.Background(), commands.Actor{Key: f.admin}, settings)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// charge makes the i-th call, answered and settled at the instant given; the call's
// key, endpoint, engine, price and cache follow from i.
func (f *rollupFixture) charge(t *testing.T, i int, at time.Time) {
	t.Helper()
	f.reserve(t, i, at)()
	f.flush(t)
}

// chargeInGroups charges n calls nine at a time behind the chain's head, call j at(j):
// each key's meter settles its first of the nine, then its others in one
// ChargesSettled of several lines.
func (f *rollupFixture) chargeInGroups(t *testing.T, n int, at func(j int) time.Time) {
	t.Helper()
	for i := 0; i < n; i += 9 {
		var settles []func()
		for j := i; j < min(i+9, n); j++ {
			settles = append(settles, f.reserve(t, j, at(j)))
		}
		release := holdChain(t, f.pool)
		// newest first: the meter's clock goes back with each answer, so it never reads
		// past a batch's oldest line by the settle's deadline (lines 97 minutes apart
		// could never be settled together otherwise)
		for _, settle := range slices.Backward(settles) {
			settle()
		}
		release()
		f.flush(t)
	}
}

// flush waits for every meter's settles.
func (f *rollupFixture) flush(t *testing.T) {
	t.Helper()
	for _, m := range f.meters {
		if err := m.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// reserve reserves charge i at the instant given; settle answers it, without waiting
// for the settle.
func (f *rollupFixture) reserve(t *testing.T, i int, at time.Time) (settle func()) {
	t.Helper()
	ctx := context.Background()
	key := f.keys[i%len(f.keys)]
	m := f.meters[key.ID()]
	if m == nil {
		m = f.meter(t, ledger.MeterConfig{})
		ledger.SetClock(m, func() time.Time { return f.clock.Load().(time.Time) })
		f.meters[key.ID()] = m
	}
	f.clock.Store(at.UTC())
	endpoints := []domain.Endpoint{domain.EndpointEval, domain.EndpointBestMove, domain.EndpointAnalyze}
	depth := []int{8, 14}[i%2]
	call := ledger.Call{RequestID: fmt.Sprintf("req-%d", i), Key: key, Account: f.account,
		Price: domain.Call{Endpoint: endpoints[i%3], Depth: depth, MultiPV: 1, Positions: 1}}
	r, err := m.Reserve(ctx, call)
	if err != nil {
		t.Fatal(err)
	}
	a := ledger.Answered{Endpoint: endpoints[i%3], Params: ledger.Params{Depth: depth, MultiPV: 1, Positions: 1},
		Engine: []string{"sf-17.1", "sf-15.1"}[i/3%2], Path: "native", Cached: i%5 == 0}
	return func() {
		f.clock.Store(at.UTC())
		if err := r.Settle(a); err != nil {
			t.Fatal(err)
		}
	}
}

// credit credits the charge of request id req at the instant given.
func (f *rollupFixture) credit(t *testing.T, req string, at time.Time) {
	t.Helper()
	ctx := context.Background()
	var chargeID string
	if err := f.pool.QueryRow(ctx, `SELECT charge_id FROM charge_lines() WHERE request_id = $1`, req).Scan(&chargeID); err != nil {
		t.Fatal(err)
	}
	_, err := f.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		_, err := ledger.Credit(ctx, tx, ledger.CreditRequest{ChargeID: chargeID, Reason: "test", Actor: "ops"}, at)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// rows are a table's rows as text, in order.
func rows(t *testing.T, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, table string) []string {
	t.Helper()
	rs, err := q.Query(context.Background(), `SELECT x::text FROM `+pgx.Identifier{table}.Sanitize()+` x ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rs, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// refreshed is a rollup table (usage_hours, usage_key_hours) as RefreshRollup
// recomputes it from the charges and credits (rolled back: the table is left as it was).
func refreshed(t *testing.T, pool *pgxpool.Pool, table string) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	if err := ledger.RefreshRollup(ctx, tx); err != nil {
		t.Fatal(err)
	}
	return rows(t, tx, table)
}

// report renders a usage report for comparison: decimals at their value, not scale.
func report(r ledger.UsageReport) string {
	var b strings.Builder
	sums := func(calls, units int64, usd string, c ledger.UsageCredits) string {
		return fmt.Sprintf("%d %d %s %d %d %s", calls, units, usd, c.Credits, c.CreditedUnits, c.CreditedUSD.StringFixed(6))
	}
	for _, g := range r.Groups {
		fmt.Fprintf(&b, "%s: %s\n", strings.Join(g.Values, "|"), sums(g.Calls, g.Units, g.USD.StringFixed(6), g.UsageCredits))
	}
	fmt.Fprintf(&b, "total: %s more=%v", sums(r.Calls, r.Units, r.USD.StringFixed(6), r.UsageCredits), r.More)
	return b.String()
}

// The hourly rollup is the charges and credits summed by hour as the live writers
// leave it, and again after a rebuild; and GET /usage's answer from it (the whole
// hours, the charges at a ragged start or end) is the answer from the charges alone:
// the same groups and totals for every combination of groups, in New York across the
// March daylight-saving change, credits included, paged or not. A zone whose hours
// are not UTC's (Kolkata, +05:30) is answered from the charges when it buckets by time.
func TestUsageRollupAnswersAsTheCharges(t *testing.T) {
	f := newRollupFixture(t)
	ctx := context.Background()
	// 2026-03-08 07:00Z: New York's clock went from 02:00 EST to 03:00 EDT
	start := time.Date(2026, 3, 6, 5, 3, 0, 0, time.UTC)
	// lines of one ChargesSettled fall in different hours
	f.chargeInGroups(t, 60, func(j int) time.Time { return start.Add(time.Duration(j) * 97 * time.Minute) })
	if n := count(t, f.pool, `SELECT count(*) FROM charge_batches WHERE lines > 1 AND date_trunc('hour', first_at) <> date_trunc('hour', last_at)`); n == 0 {
		t.Fatal("no ChargesSettled has lines in two hours")
	}
	for i, at := range []string{"2026-03-07T10:00:00Z", "2026-03-08T06:59:59Z", "2026-03-08T07:00:00Z", "2026-03-09T23:30:00Z", "2026-03-10T02:10:00Z"} {
		ts, err := time.Parse(time.RFC3339, at)
		if err != nil {
			t.Fatal(err)
		}
		f.credit(t, fmt.Sprintf("req-%d", i*7), ts)
	}
	tables := []string{"usage_hours", "usage_key_hours"}
	live := map[string][]string{}
	for _, table := range tables {
		live[table] = rows(t, f.pool, table)
		if len(live[table]) < 30 {
			t.Fatalf("%d rows in %s, want one per charged hour and combination", len(live[table]), table)
		}
		if want := refreshed(t, f.pool, table); !reflect.DeepEqual(live[table], want) {
			t.Fatalf("%s as the writers left it:\n%s\nas the charges and credits give it:\n%s", table,
				strings.Join(live[table], "\n"), strings.Join(want, "\n"))
		}
	}
	if _, err := projections.Rebuild(ctx, f.pool, projections.Ledger{}); err != nil {
		t.Fatal(err)
	}
	for _, table := range tables {
		if rebuilt := rows(t, f.pool, table); !reflect.DeepEqual(live[table], rebuilt) {
			t.Fatalf("%s after a rebuild:\n%s\nlive:\n%s", table, strings.Join(rebuilt, "\n"), strings.Join(live[table], "\n"))
		}
	}

	ny, _ := time.LoadLocation("America/New_York")
	kolkata, _ := time.LoadLocation("Asia/Kolkata")
	ragged := func(s string) time.Time {
		ts, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return ts
	}
	ranges := []struct {
		name     string
		from, to time.Time
		env      string
	}{
		{"whole days", time.Date(2026, 3, 6, 0, 0, 0, 0, ny), time.Date(2026, 3, 11, 0, 0, 0, 0, ny), ""},
		// a charge at 09:54:00 just before the start, one at 21:58:00 at the end
		{"ragged ends", ragged("2026-03-06T09:54:00.5Z"), ragged("2026-03-09T21:58:00Z"), ""},
		{"ragged ends, test book", ragged("2026-03-06T09:54:00.5Z"), ragged("2026-03-09T21:58:00Z"), "test"},
		{"an as_of", time.Date(2026, 3, 1, 0, 0, 0, 0, ny), ragged("2026-03-08T07:36:00Z"), ""},
	}
	check := func(t *testing.T, q ledger.UsageQuery, wantRollup bool) {
		t.Helper()
		got, err := ledger.Usage(ctx, f.pool, q)
		if err != nil {
			t.Fatal(err)
		}
		q.Exact = true
		want, err := ledger.Usage(ctx, f.pool, q)
		if err != nil {
			t.Fatal(err)
		}
		if report(got) != report(want) {
			t.Fatalf("%v %v from %v to %v:\nrollup:\n%s\ncharges:\n%s", q.Zone, q.GroupBy, q.From, q.To, report(got), report(want))
		}
		if got.Rollup != wantRollup || want.Rollup {
			t.Fatalf("%v %v: from the rollup: %v, want %v (exact: %v)", q.Zone, q.GroupBy, got.Rollup, wantRollup, want.Rollup)
		}
	}
	t.Run("statement totals", func(t *testing.T) { statementTotals(t, f) })
	for _, r := range ranges {
		t.Run(r.name, func(t *testing.T) {
			base := ledger.UsageQuery{AccountID: f.account.ID(), Env: r.env, From: r.from, To: r.to, Zone: "America/New_York"}
			if rep, err := ledger.Usage(ctx, f.pool, base); err != nil || rep.Calls == 0 || (r.env == "" && rep.Credits == 0) {
				t.Fatalf("nothing to compare: %+v %v", rep, err)
			}
			// every combination of groups, in the documented order
			for mask := range 1 << len(ledger.UsageGroups) {
				q := base
				for i, g := range ledger.UsageGroups {
					if mask&(1<<i) != 0 {
						q.GroupBy = append(q.GroupBy, g)
					}
				}
				check(t, q, true)
			}
			// pages
			q := base
			q.GroupBy, q.Limit = []string{"day", "key", "cached"}, 4
			for page := 0; ; page++ {
				got, err := ledger.Usage(ctx, f.pool, q)
				if err != nil {
					t.Fatal(err)
				}
				check(t, q, true)
				if !got.More {
					break
				}
				q.After = got.Groups[len(got.Groups)-1].Values
			}
			// other zones: UTC's hours are its own; Kolkata's are not, which matters
			// only when the report buckets by time
			for _, c := range []struct {
				zone   string
				groups []string
			}{
				{"UTC", []string{"hour", "key"}},
				{"Asia/Kolkata", []string{"hour"}},
				{"Asia/Kolkata", []string{"day", "endpoint"}},
				{"Asia/Kolkata", []string{"month"}},
				{"Asia/Kolkata", []string{"key", "engine"}},
				{"Asia/Kolkata", nil},
			} {
				q := base
				q.Zone, q.GroupBy = c.zone, c.groups
				if c.zone == "Asia/Kolkata" && r.name == "whole days" {
					q.From, q.To = time.Date(2026, 3, 6, 0, 0, 0, 0, kolkata), time.Date(2026, 3, 11, 0, 0, 0, 0, kolkata)
				}
				check(t, q, c.zone == "UTC" || !timeBucketed(c.groups))
			}
		})
	}
}

func timeBucketed(groups []string) bool {
	for _, g := range groups {
		if g == "hour" || g == "day" || g == "month" {
			return true
		}
	}
	return false
}

// statementTotals checks the statement's totals (from usage_hours and the charges at
// ragged ends) against the charges themselves, for ranges of days, of instants, open
// on either side or both, within one hour, and filtered by key and endpoint.
func statementTotals(t *testing.T, f *rollupFixture) {
	t.Helper()
	ctx := context.Background()
	at := func(s string) *time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return &v
	}
	day := func(s string) *time.Time {
		v, err := time.Parse(time.DateOnly, s)
		if err != nil {
			t.Fatal(err)
		}
		return &v
	}
	for _, c := range []struct {
		name string
		q    ledger.StatementQuery
		lo   *time.Time // charged_at bounds of the same range, nil: none
		hi   *time.Time
	}{
		{"everything", ledger.StatementQuery{}, nil, nil},
		{"days", ledger.StatementQuery{FromDay: day("2026-03-07"), ToDay: day("2026-03-08")}, at("2026-03-07T00:00:00Z"), at("2026-03-09T00:00:00Z")},
		// charges at 09:54:00 on the 6th, 12:01 on the 8th and 21:58:00 on the 9th
		{"instants", ledger.StatementQuery{Since: at("2026-03-06T09:54:00.5Z"), Until: at("2026-03-09T21:58:00.000001Z")}, at("2026-03-06T09:54:00.5Z"), at("2026-03-09T21:58:00.000001Z")},
		{"since", ledger.StatementQuery{Since: at("2026-03-07T11:31:00Z")}, at("2026-03-07T11:31:00Z"), nil},
		{"until", ledger.StatementQuery{Until: at("2026-03-07T11:31:00.000001Z")}, nil, at("2026-03-07T11:31:00.000001Z")},
		{"a day and an instant", ledger.StatementQuery{FromDay: day("2026-03-07"), Until: at("2026-03-08T12:30:00Z")}, at("2026-03-07T00:00:00Z"), at("2026-03-08T12:30:00Z")},
		{"within an hour", ledger.StatementQuery{Since: at("2026-03-06T09:50:00Z"), Until: at("2026-03-06T09:55:00Z")}, at("2026-03-06T09:50:00Z"), at("2026-03-06T09:55:00Z")},
		{"a key", ledger.StatementQuery{KeyID: f.keys[1].ID(), Since: at("2026-03-06T09:54:00.5Z")}, at("2026-03-06T09:54:00.5Z"), nil},
		{"an endpoint", ledger.StatementQuery{Endpoint: "bestmove", Until: at("2026-03-09T21:58:00Z")}, nil, at("2026-03-09T21:58:00Z")},
		{"the test book", ledger.StatementQuery{Env: "test", FromDay: day("2026-03-08")}, at("2026-03-08T00:00:00Z"), nil},
	} {
		q := c.q
		q.AccountID, q.Limit = f.account.ID(), 5
		if q.Env == "" {
			q.Env = "live"
		}
		st, err := ledger.ReadStatement(ctx, f.pool, q)
		if err != nil {
			t.Fatal(err)
		}
		var calls, units int64
		var usd string
		if err := f.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(units), 0), coalesce(sum(usd), 0)::numeric(20, 6)::text FROM charge_lines()
			WHERE account_id = $1 AND env = $2 AND ($3 = '' OR key_id = $3) AND ($4 = '' OR endpoint = $4)
				AND ($5::timestamptz IS NULL OR charged_at >= $5) AND ($6::timestamptz IS NULL OR charged_at < $6)`,
			q.AccountID, q.Env, q.KeyID, q.Endpoint, c.lo, c.hi).Scan(&calls, &units, &usd); err != nil {
			t.Fatal(err)
		}
		if st.Calls != calls || st.Units != units || st.USD.StringFixed(6) != usd || (c.name != "within an hour" && calls == 0) {
			t.Errorf("%s: totals %d calls, %d units, %s USD; the charges say %d, %d, %s", c.name, st.Calls, st.Units, st.USD.StringFixed(6), calls, units, usd)
		}
		var credits, creditedUnits int64
		if err := f.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(r.units), 0) FROM credits r JOIN charge_lines() c ON c.position = r.charge_position AND c.line = r.charge_line
			WHERE c.account_id = $1 AND c.env = $2 AND ($3 = '' OR c.key_id = $3) AND ($4 = '' OR c.endpoint = $4)
				AND ($5::timestamptz IS NULL OR c.charged_at >= $5) AND ($6::timestamptz IS NULL OR c.charged_at < $6)`,
			q.AccountID, q.Env, q.KeyID, q.Endpoint, c.lo, c.hi).Scan(&credits, &creditedUnits); err != nil {
			t.Fatal(err)
		}
		if st.Credits != credits || st.CreditedUnits != creditedUnits || (c.name == "everything" && credits == 0) {
			t.Errorf("%s: %d credits of %d units; the credits say %d of %d", c.name, st.Credits, st.CreditedUnits, credits, creditedUnits)
		}
	}
}
