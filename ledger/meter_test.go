package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gojson "github.com/goccy/go-json"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/ledger"
	"chessd/postgres"
	"chessd/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// fixture is one account on a fresh database, with a key of the given budget.
type fixture struct {
	pool    *pgxpool.Pool
	store   *eventstore.Store
	key     *domain.Key
	account *domain.Account
}

func newFixture(t testing.TB, budgetUnits *int64) *fixture {
	t.Helper()
	pool := pgtest.NewDB(t)
	store := eventstore.NewStore(pool, nil)
	h := commands.New(store, []byte("meter-test-pepper-0123456789"))
	ctx := context.Background()
	su, err := h.Signup(ctx, domain.Signup{Email: "meter@example.com"}, "req")
	if err != nil {
		t.Fatal(err)
	}
	admin, err := commands.LoadKey(ctx, pool, su.KeyID)
	if err != nil {
		t.Fatal(err)
	}
	k, _, err := h.CreateKey(ctx, commands.Actor{Key: admin}, domain.KeySettings{Scopes: []domain.Scope{domain.ScopeEval},
		Env: domain.EnvLive, BudgetUnits: budgetUnits})
	if err != nil {
		t.Fatal(err)
	}
	acct, err := commands.LoadAccount(ctx, pool, su.AccountID)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{pool: pool, store: store, key: k, account: acct}
}

func (f *fixture) meter(t testing.TB, cfg ledger.MeterConfig) *ledger.Meter {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	m := ledger.NewMeter(ctx, f.store, nil, cfg)
	t.Cleanup(cancel)
	return m
}

// evalCall costs 10 units (depth ≤ 10, one line).
func (f *fixture) evalCall(i int) ledger.Call {
	return ledger.Call{RequestID: fmt.Sprintf("req-%d", i), Key: f.key, Account: f.account,
		Price: domain.Call{Endpoint: domain.EndpointEval, Depth: 8, MultiPV: 1, Positions: 1}}
}

type balance struct{ spent, held, dayUnits, dayHeld, leases, charges int64 }

func (f *fixture) balance(t *testing.T) balance {
	t.Helper()
	var b balance
	err := f.pool.QueryRow(context.Background(), `SELECT spent_units, held_units,
			(SELECT coalesce(sum(units), 0) FROM account_days WHERE account_id = $2),
			(SELECT coalesce(sum(held_units), 0) FROM account_days WHERE account_id = $2),
			(SELECT coalesce(sum(units), 0) FROM leases WHERE key_id = $1),
			(SELECT count(*) FROM charge_lines() WHERE key_id = $1)
		FROM key_balances WHERE key_id = $1`, f.key.ID(), f.key.AccountID()).
		Scan(&b.spent, &b.held, &b.dayUnits, &b.dayHeld, &b.leases, &b.charges)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func answered() ledger.Answered {
	return ledger.Answered{Endpoint: domain.EndpointEval, Params: ledger.Params{Depth: 8, MultiPV: 1, Positions: 1}, Engine: "sf-17.1", Path: "native"}
}

// Two servers' meters, fifty concurrent calls, a budget for ten: exactly ten are
// answered and charged, the rest refused before any work, and nothing stays held.
func TestMeterBudgetHoldsAcrossServers(t *testing.T) {
	budget := int64(100)
	for round := range 20 {
		f := newFixture(t, &budget)
		meters := []*ledger.Meter{f.meter(t, ledger.MeterConfig{}), f.meter(t, ledger.MeterConfig{})}
		var ok, refused atomic.Int64
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := meters[i%2].Reserve(context.Background(), f.evalCall(i))
				if err != nil {
					if !errors.Is(err, ledger.ErrBudget) {
						t.Errorf("refusal %v, want a budget refusal", err)
					}
					refused.Add(1)
					return
				}
				if err := r.Settle(answered()); err != nil {
					t.Error(err)
				}
				ok.Add(1)
			}()
		}
		wg.Wait()
		for _, m := range meters {
			if err := m.Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		b := f.balance(t)
		if ok.Load() != 10 || b.spent != 100 || b.charges != 10 || b.dayUnits != 100 {
			t.Fatalf("round %d: %d answered, %d refused; spent %d in %d events (allowance used %d); want 10, 100, 10",
				round, ok.Load(), refused.Load(), b.spent, b.charges, b.dayUnits)
		}
		if b.held != b.leases || b.dayHeld != b.leases || b.spent+b.held > budget {
			t.Fatalf("round %d: held %d, day held %d, leases %d, spent %d: the invariants broke", round, b.held, b.dayHeld, b.leases, b.spent)
		}
	}
}

// A busy lease grows and is topped up before it runs dry: 400 calls in a row take far
// fewer round trips than leases of a fixed size would (100 here), some of them while
// calls went on, and every call is charged once.
func TestMeterLeaseGrowsAndTopsUpAhead(t *testing.T) {
	f := newFixture(t, nil)
	m := f.meter(t, ledger.MeterConfig{LeaseCalls: 4})
	ctx := context.Background()
	const calls = 400
	for i := range calls {
		r, err := m.Reserve(ctx, f.evalCall(i))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Settle(answered()); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	dry, ahead := ledger.TopUps(m)
	t.Logf("top-ups: %d for dry calls, %d ahead of need", dry, ahead)
	if dry+ahead > 20 || ahead == 0 {
		t.Errorf("%d top-ups for dry calls and %d ahead of need for %d calls of a 4-call lease; want at most 20 in all, some ahead",
			dry, ahead, calls)
	}
	if b := f.balance(t); b.spent != 10*calls || b.charges != calls || b.held != b.leases || b.dayHeld != b.leases {
		t.Fatalf("balance %+v, want %d units spent in %d events, holds equal to the lease", b, 10*calls, calls)
	}
}

// An idle lease whose last top-up was granted in full is kept for LeaseKeep, so that a
// client calling every few seconds is reserved from memory; one whose grant a budget
// capped goes back after LeaseIdle. Both leases below go idle together: the capped one
// is given back while the full one is still held, and a meter that keeps full leases
// only briefly gives its back too.
func TestMeterKeepsAFullLeaseLongerThanACappedOne(t *testing.T) {
	budget := int64(100) // 10 calls: a grant capped at a quarter of what is left
	full, capped, short := newFixture(t, nil), newFixture(t, &budget), newFixture(t, nil)
	cfg := ledger.MeterConfig{LeaseIdle: 100 * time.Millisecond, LeaseKeep: time.Hour, Housekeeping: 20 * time.Millisecond}
	meters := []*ledger.Meter{full.meter(t, cfg), capped.meter(t, cfg)}
	cfg.LeaseKeep = 200 * time.Millisecond
	meters = append(meters, short.meter(t, cfg))
	ctx := context.Background()
	for i, f := range []*fixture{full, capped, short} {
		r, err := meters[i].Reserve(ctx, f.evalCall(i))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Settle(answered()); err != nil {
			t.Fatal(err)
		}
		if err := meters[i].Flush(ctx); err != nil {
			t.Fatal(err)
		}
		// the capped and the short-kept leases may be given back already (a Flush on a
		// busy machine can outlast LeaseIdle); the full one is kept an hour
		if b := f.balance(t); b.spent != 10 || (f == full && b.leases == 0) {
			t.Fatalf("fixture %d after one call: %+v, want 10 units spent (and the full lease)", i, b)
		}
	}
	given := func(f *fixture) func() bool {
		return func() bool { b := f.balance(t); return b.leases == 0 && b.held == 0 }
	}
	pgtest.WaitFor(t, "the capped lease given back", given(capped))
	if b := full.balance(t); b.leases == 0 || b.held != b.leases {
		t.Fatalf("the full lease, idle as long as the capped one, was given back: %+v", b)
	}
	pgtest.WaitFor(t, "the full lease of a meter that keeps them 200 ms given back", given(short))
}

// Flush waits for every call answered before it, however many batches the backlog
// takes: with the settler held on the event chain's lock, 2,000 answered calls queue
// behind its first batch, and once the lock goes Flush returns only after all of them
// are committed (it returned after one batch of 512 before). The lease is large enough
// for all of them: no top-up waits on the rows the held settle has locked.
func TestMeterFlushWaitsOutTheBacklog(t *testing.T) {
	f := newFixture(t, nil)
	m := f.meter(t, ledger.MeterConfig{MaxBacklog: time.Hour, LeaseCalls: 10_000})
	ctx := context.Background()
	release := holdChain(t, f.pool)
	const calls = 2000
	a := answered()
	a.Cached = true // one unit each: well within the free plan's day
	for i := range calls {
		r, err := m.Reserve(ctx, f.evalCall(i))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Settle(a); err != nil {
			t.Fatal(err)
		}
	}
	flushed := make(chan error, 1)
	go func() { flushed <- m.Flush(ctx) }()
	release()
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	if b := f.balance(t); b.spent != calls || b.charges != calls {
		t.Fatalf("after Flush: %d units spent in %d events, want %d in %d", b.spent, b.charges, calls, calls)
	}
}

// A cached answer is charged the cached price, and the rest of the reservation goes
// back to the lease; a cancelled call is charged nothing.
func TestMeterChargesWhatWasAnswered(t *testing.T) {
	f := newFixture(t, nil)
	m := f.meter(t, ledger.MeterConfig{})
	ctx := context.Background()
	r1, err := m.Reserve(ctx, f.evalCall(1))
	if err != nil {
		t.Fatal(err)
	}
	a := answered()
	a.Cached = true
	if err := r1.Settle(a); err != nil {
		t.Fatal(err)
	}
	r2, err := m.Reserve(ctx, f.evalCall(2))
	if err != nil {
		t.Fatal(err)
	}
	r2.Cancel()
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if b := f.balance(t); b.spent != 1 || b.charges != 1 || b.held != b.leases {
		t.Fatalf("balance %+v, want 1 unit spent in 1 charge", b)
	}
	var units int64
	var cached bool
	if err := f.pool.QueryRow(ctx, `SELECT units, cached FROM charge_lines() WHERE key_id = $1`, f.key.ID()).Scan(&units, &cached); err != nil || units != 1 || !cached {
		t.Fatalf("the charge: %d units, cached %v (%v); want 1, cached", units, cached, err)
	}
}

// A call encodes its own line item (off the settler's loop); what the log stores and
// hashes is the key's ChargesSettled built from those encodings, and it is exactly the
// encoding of the event it decodes to.
func TestMeterStoresTheLineItemsTheCallsEncoded(t *testing.T) {
	f := newFixture(t, nil)
	m := f.meter(t, ledger.MeterConfig{})
	ctx := context.Background()
	release := holdChain(t, f.pool) // the three calls settle in one commit
	for i := range 3 {
		r, err := m.Reserve(ctx, f.evalCall(i))
		if err != nil {
			t.Fatal(err)
		}
		a := answered()
		a.Cached = i == 1
		if err := r.Settle(a); err != nil {
			t.Fatal(err)
		}
	}
	release()
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := f.pool.Query(ctx, `SELECT event_type, payload::text FROM events WHERE stream_id = $1 ORDER BY position`, ledger.Stream(f.key.ID()))
	if err != nil {
		t.Fatal(err)
	}
	type stored struct{ typ, payload string }
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (stored, error) {
		var s stored
		return s, r.Scan(&s.typ, &s.payload)
	})
	if err != nil {
		t.Fatal(err)
	}
	var lines []ledger.SettledCharge
	for _, s := range evs {
		d, err := domain.Decode(s.typ, 1, []byte(s.payload))
		if err != nil {
			t.Fatal(err)
		}
		e, ok := d.(*ledger.ChargesSettled)
		if !ok {
			t.Fatalf("a %s in the key's ledger stream", s.typ)
		}
		again, err := gojson.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		if string(again) != s.payload {
			t.Fatalf("stored\n %s\nis not the encoding of the event it decodes to\n %s", s.payload, again)
		}
		lines = append(lines, e.Lines...)
	}
	if len(lines) != 3 || len(evs) > 2 {
		t.Fatalf("%d lines in %d events, want 3 lines in at most 2 (the first call may commit before the chain is held)", len(lines), len(evs))
	}
	for i, l := range lines {
		if l.RequestID != fmt.Sprintf("req-%d", i) || l.Cached != (i == 1) || l.Units != map[bool]int64{true: 1, false: 10}[i == 1] {
			t.Fatalf("line %d: %+v", i, l)
		}
	}
}

// The settler waits Gather after a call's line item comes before it commits: calls
// answered within it settle together, in one commit (one ChargesSettled of the key).
// The second and third calls are answered 30 ms after the first (a settler that did not
// wait committed the first alone by then).
func TestMeterGathersCallsAnsweredTogether(t *testing.T) {
	f := newFixture(t, nil)
	m := f.meter(t, ledger.MeterConfig{Gather: 500 * time.Millisecond})
	ctx := context.Background()
	for i := range 3 {
		r, err := m.Reserve(ctx, f.evalCall(i))
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			time.Sleep(30 * time.Millisecond) // the calls' spacing, what is tested
		}
		if err := r.Settle(answered()); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE stream_id = $1 AND event_type = 'ChargesSettled'`,
		ledger.Stream(f.key.ID())).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("three calls answered together settled in %d commits, want one", n)
	}
}

// A server that stops renewing its leases (it died) leaves them to expire; another
// server gives their units back. What the dead server answered and had not settled is
// forgiven, never charged.
func TestMeterExpiredLeasesAreRecovered(t *testing.T) {
	budget := int64(1000)
	f := newFixture(t, &budget)
	cfg := ledger.MeterConfig{LeaseTTL: time.Second, Housekeeping: 100 * time.Millisecond}
	deadCtx, die := context.WithCancel(context.Background())
	dead := ledger.NewMeter(deadCtx, f.store, nil, cfg)
	if _, err := dead.Reserve(context.Background(), f.evalCall(1)); err != nil {
		t.Fatal(err)
	}
	if b := f.balance(t); b.held == 0 || b.held != b.leases {
		t.Fatalf("nothing held by the lease: %+v", b)
	}
	ledger.Crash(dead, die)
	f.meter(t, cfg) // a live server's housekeeping
	deadline := time.Now().Add(10 * time.Second)
	for {
		b := f.balance(t)
		if b.held == 0 && b.leases == 0 && b.dayHeld == 0 {
			if b.spent != 0 {
				t.Fatalf("the dead server's call was charged: %+v", b)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dead server's lease was not recovered: %+v", b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Idempotency-Key: a second claim while the first runs is told to wait, with another
// request refused, and after the answer is stored every claim gets it.
func TestMeterIdempotencyClaims(t *testing.T) {
	f := newFixture(t, nil)
	m1, m2 := f.meter(t, ledger.MeterConfig{}), f.meter(t, ledger.MeterConfig{})
	ctx := context.Background()
	st := ledger.Stored{Scope: f.key.ID(), Key: "idem-1", RequestHash: []byte("hash-a")}
	if first, err := m1.Claim(ctx, st); err != nil || first != nil {
		t.Fatalf("first claim: %v %v", first, err)
	}
	if _, err := m2.Claim(ctx, st); !errors.Is(err, ledger.ErrIdempotencyRunning) {
		t.Fatalf("claim while running: %v", err)
	}
	other := st
	other.RequestHash = []byte("hash-b")
	if _, err := m2.Claim(ctx, other); !errors.Is(err, ledger.ErrIdempotencyMismatch) {
		t.Fatalf("claim with another request: %v", err)
	}
	r, err := m1.Reserve(ctx, f.evalCall(1))
	if err != nil {
		t.Fatal(err)
	}
	a := answered()
	done := st
	done.Status, done.Response = 200, []byte(`{"ok":true}`)
	a.Idempotency = &done
	if err := r.Settle(a); err != nil {
		t.Fatal(err)
	}
	if err := m1.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	first, err := m2.Claim(ctx, st)
	if err != nil || first == nil || first.Status != 200 || string(first.Response) != `{"ok":true}` {
		t.Fatalf("claim after the answer: %+v %v", first, err)
	}
	if b := f.balance(t); b.charges != 1 {
		t.Fatalf("%d charges, want 1", b.charges)
	}
}

// A stopped meter reserves nothing more: the call is refused (503), not left holding a
// lease nobody would give back.
func TestStoppedMeterRefuses(t *testing.T) {
	f := newFixture(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	m := ledger.NewMeter(ctx, f.store, nil, ledger.MeterConfig{})
	cancel()
	<-m.Done()
	if _, err := m.Reserve(context.Background(), f.evalCall(1)); !errors.Is(err, ledger.ErrStopped) {
		t.Fatalf("reserve on a stopped meter: %v", err)
	}
	if b := f.balance(t); b.held != 0 || b.leases != 0 {
		t.Fatalf("a stopped meter holds %+v", b)
	}
}

// meter_settle_all's outcomes, call by call, in one batch over two leases: a call is
// charged unless its lease is gone or its Idempotency-Key claim is another server's;
// the strict form settles nothing then and raises a serialization failure, which the
// settler answers with the checked path.
func TestMeterSettleAllOutcomes(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	key, acct, day := f.key.ID(), f.key.AccountID(), time.Now().UTC().Format(time.DateOnly)
	for _, l := range []string{"lease_a", "lease_b"} {
		var outcome string
		if err := f.pool.QueryRow(ctx, `SELECT outcome FROM meter_lease($1, 'srv_x', $2, $3, 'live', $4, 100, 100, $5, 1000000, '1 minute')`,
			l, key, acct, day, ledger.UnitPriceUSD).Scan(&outcome); err != nil || outcome != ledger.OutcomeOK {
			t.Fatalf("lease %s: %s %v", l, outcome, err)
		}
	}
	for _, c := range []struct{ key, owner string }{{"mine", "srv_x"}, {"theirs", "srv_y"}} {
		if _, err := f.pool.Exec(ctx, `SELECT meter_claim($1, $2, 'h', $3, '1 minute')`, key, c.key, c.owner); err != nil {
			t.Fatal(err)
		}
	}
	mine, theirs, scope := "mine", "theirs", key
	ok := int32(200)
	settle := func(strict bool) ([]bool, error) {
		var kept []bool
		err := f.pool.QueryRow(ctx, `SELECT meter_settle_all('srv_x', $1, $2, $3, $4, $5, $6, $7, now(), $8)`,
			[]string{"lease_b", "lease_a", "lease_gone", "lease_a", "lease_b"}, []int64{10, 20, 30, 40, 50},
			[]*string{nil, &scope, nil, &scope, nil}, []*string{nil, &mine, nil, &theirs, nil},
			[]*int32{nil, &ok, nil, &ok, nil}, [][]byte{nil, []byte("{}"), nil, []byte("{}"), nil},
			ledger.UnitPriceUSD, strict).Scan(&kept)
		return kept, err
	}
	if _, err := settle(true); !postgres.IsRetryable(err) {
		t.Fatalf("strict settle with a lost lease and a claim taken over: %v, want a serialization failure", err)
	}
	if b := f.balance(t); b.spent != 0 || b.leases != 200 || b.held != 200 {
		t.Fatalf("the refused strict settle moved money: %+v", b)
	}
	kept, err := settle(false)
	if err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, true, false, false, true}; !slices.Equal(kept, want) {
		t.Fatalf("kept %v, want %v", kept, want)
	}
	if b := f.balance(t); b.spent != 80 || b.dayUnits != 80 || b.leases != 120 || b.held != 120 || b.dayHeld != 120 {
		t.Fatalf("balance %+v, want 80 spent (10+20+50) and 120 still held by the leases", b)
	}
	var state string
	if err := f.pool.QueryRow(ctx, `SELECT state FROM idempotency WHERE scope = $1 AND idem_key = 'mine'`, key).Scan(&state); err != nil || state != "done" {
		t.Fatalf("our claim is %q (%v), want done", state, err)
	}
}

// A settle reads every row it touches through its key, however few rows the planner
// believes the tables hold: in a fresh database (no statistics yet) a batch of calls
// with Idempotency-Keys made the claims' update scan idempotency and compare each row
// with every key of the batch (migration 0039). The settle and the count of its scans
// share one transaction (pg_stat_xact_user_tables counts the transaction's own).
func TestMeterSettleAllReadsByKey(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	key, acct, day := f.key.ID(), f.key.AccountID(), time.Now().UTC().Format(time.DateOnly)
	var outcome string
	if err := f.pool.QueryRow(ctx, `SELECT outcome FROM meter_lease('lease_a', 'srv_x', $1, $2, 'live', $3, 1000, 1000, $4, 1000000, '1 minute')`,
		key, acct, day, ledger.UnitPriceUSD).Scan(&outcome); err != nil || outcome != ledger.OutcomeOK {
		t.Fatalf("lease: %s %v", outcome, err)
	}
	const n = 64
	leases, units := make([]string, n), make([]int64, n)
	scopes, keys, statuses, responses := make([]*string, n), make([]*string, n), make([]*int32, n), make([][]byte, n)
	ok := int32(200)
	for i := range n {
		k := fmt.Sprintf("idem-%d", i)
		if _, err := f.pool.Exec(ctx, `SELECT meter_claim($1, $2, 'h', 'srv_x', '1 minute')`, key, k); err != nil {
			t.Fatal(err)
		}
		leases[i], units[i], scopes[i], keys[i], statuses[i], responses[i] = "lease_a", 1, &key, &k, &ok, []byte("{}")
	}
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // the settle is undone: only its scans are counted
	var kept []bool
	if err := tx.QueryRow(ctx, `SELECT meter_settle_all('srv_x', $1, $2, $3, $4, $5, $6, $7, now(), true)`,
		leases, units, scopes, keys, statuses, responses, ledger.UnitPriceUSD).Scan(&kept); err != nil {
		t.Fatal(err)
	}
	if len(kept) != n || slices.Contains(kept, false) {
		t.Fatalf("kept %v, want all %d", kept, n)
	}
	rows, err := tx.Query(ctx, `SELECT relname || ' ' || seq_scan FROM pg_stat_xact_user_tables
		 WHERE seq_scan > 0 AND relname IN ('idempotency', 'leases', 'key_balances', 'account_budgets', 'account_days') ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	scanned, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(scanned) > 0 {
		t.Fatalf("the settle scanned tables whole (table, scans): %v; want lookups by key only", scanned)
	}
}

// holdChain takes the event chain's head in a transaction of its own, so that every
// append (a settle) waits, until release commits it (or the test ends).
func holdChain(t *testing.T, pool *pgxpool.Pool) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) }) //nolint:errcheck // committed by release, or the test failed
	if _, err := tx.Exec(ctx, `SELECT 1 FROM event_chain FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A server whose lease another server gave back (it stalled, or lost the database,
// longer than LeaseTTL) hands out nothing more from it: at its next renewal, which
// finds the row gone, or once the row cannot have outlived its last renewal. Here
// another server then spends the whole budget, and the first one's next call is
// refused instead of served from the units it still counted in memory.
func TestMeterLostLeaseHandsOutNothing(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  ledger.MeterConfig
		gone func(t *testing.T, m *ledger.Meter, keyID string)
	}{
		{"its renewal finds the row gone", ledger.MeterConfig{LeaseTTL: 15 * time.Second, Housekeeping: 50 * time.Millisecond},
			func(t *testing.T, m *ledger.Meter, keyID string) {
				pgtest.WaitFor(t, "the lease to be dropped", func() bool { return ledger.Held(m, keyID) == 0 })
			}},
		{"it cannot renew", ledger.MeterConfig{LeaseTTL: time.Second, Housekeeping: time.Hour},
			func(t *testing.T, m *ledger.Meter, keyID string) {
				pgtest.WaitFor(t, "the lease's row to be past its renewal", func() bool { return !ledger.Trusted(m, keyID) })
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			budget := int64(1000)
			f := newFixture(t, &budget)
			stalled := f.meter(t, c.cfg)
			// a call in flight all along: the lease is in use, not one given back when idle
			r, err := stalled.Reserve(context.Background(), f.evalCall(0))
			if err != nil {
				t.Fatal(err)
			}
			defer r.Cancel()
			if ledger.Held(stalled, f.key.ID()) == 0 {
				t.Fatal("the lease holds nothing in memory")
			}
			// another server gives the lease back as if it had expired
			if _, err := f.pool.Exec(context.Background(), `UPDATE leases SET expires_at = now() - interval '1 second';
				SELECT meter_release(lease_id, NULL, 0.00001) FROM leases`); err != nil {
				t.Fatal(err)
			}
			other := f.meter(t, ledger.MeterConfig{})
			for i := 1; ; i++ {
				r, err := other.Reserve(context.Background(), f.evalCall(i))
				if err != nil {
					break // the budget is spent
				}
				if err := r.Settle(answered()); err != nil {
					t.Fatal(err)
				}
			}
			c.gone(t, stalled, f.key.ID())
			if _, err := stalled.Reserve(context.Background(), f.evalCall(1000)); !errors.Is(err, ledger.ErrBudget) {
				t.Fatalf("a call on the server whose lease was given back: %v, want the budget's refusal", err)
			}
		})
	}
}

// A stale lease with a call still to settle is given back only once that call has
// settled, even when another stale lease of the same key and day is being given back
// at once meanwhile (calls signed in before and after a key change interleave): the
// answered call is charged, once. (The give-back's wait used to be found by key and
// day, not by lease: the busy lease's row went at once and its call was never charged.)
func TestMeterGivesBackABusyStaleLeaseAfterItsCalls(t *testing.T) {
	f := newFixture(t, nil)
	m := f.meter(t, ledger.MeterConfig{})
	ctx := context.Background()
	older, newer := f.key, domain.RehydrateKey([]domain.Event{
		&domain.KeyCreated{KeyID: f.key.ID(), AccountID: f.key.AccountID(), Scopes: f.key.Scopes(), Env: "live"},
		&domain.KeyUpdated{Scopes: f.key.Scopes(), Label: "changed"},
	})
	r0, err := m.Reserve(ctx, f.evalCall(0)) // a call on the key as it was: its lease is busy
	if err != nil {
		t.Fatal(err)
	}
	busy, fresh, _ := ledger.LeaseFor(m, newer, f.account) // a call after the change finds it stale...
	if fresh {
		t.Fatal("the lease of the key's older version is fresh for its newer one")
	}
	if _, fresh, _ := ledger.LeaseFor(m, older, f.account); !fresh { // ...one signed in before takes another...
		t.Fatal("no new lease for the older version")
	}
	idle, fresh, _ := ledger.LeaseFor(m, newer, f.account) // ...which a third finds stale and idle
	if fresh {
		t.Fatal("the idle lease is fresh for the newer version")
	}
	if _, _, given := ledger.LeaseFor(m, newer, f.account); given == nil {
		t.Fatal("a call finds nothing to wait for while the idle lease is given back")
	}
	ledger.ReleaseBeforeNext(m, busy)
	if b := f.balance(t); b.leases == 0 {
		t.Fatalf("the busy lease's row went before its call settled: %+v", b)
	}
	if err := r0.Settle(answered()); err != nil {
		t.Fatal(err)
	}
	ledger.ReleaseBeforeNext(m, idle)
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if b := f.balance(t); b.spent != 10 || b.charges != 1 {
		t.Fatalf("balance %+v, want the answered call's 10 units in one charge", b)
	}
}
