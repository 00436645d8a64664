package ledger_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"chessd/eventstore"
	"chessd/ledger"
	"chessd/postgres/pgtest"
)

// jumpClock is the process's clock, moved ahead by the jumps a test arms: the first
// read after jump (the answer's charged_at, when armed just before Settle) is the last
// at the old time, so the settler finds the answer as old as the jump, with no wait.
type jumpClock struct {
	offset, armed atomic.Int64 // nanoseconds
}

func (c *jumpClock) now() time.Time {
	t := time.Now().Add(time.Duration(c.offset.Load()))
	if d := c.armed.Swap(0); d != 0 {
		c.offset.Add(d)
	}
	return t.UTC().Truncate(time.Microsecond)
}

// jump arms a jump of d after the next read.
func (c *jumpClock) jump(d time.Duration) { c.armed.Store(int64(d)) }

// jumpingMeter is a meter on store whose clock the test moves.
func jumpingMeter(t *testing.T, store *eventstore.Store) (*ledger.Meter, *jumpClock) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	m := ledger.NewMeter(ctx, store, nil, ledger.MeterConfig{})
	c := &jumpClock{}
	ledger.SetClock(m, c.now)
	return m, c
}

// deadlineCase is a fixture and a meter for the settle's deadline: charge makes call i
// and waits for its settle, settleAged settles a reserved call as the clock jumps,
// check compares the balance and what the meter holds.
type deadlineCase struct {
	f     *fixture
	m     *ledger.Meter
	clock *jumpClock
}

func (c *deadlineCase) reserve(t *testing.T, i int) *ledger.Reservation {
	t.Helper()
	r, err := c.m.Reserve(context.Background(), c.f.evalCall(i))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (c *deadlineCase) charge(t *testing.T, i int) {
	t.Helper()
	if err := c.reserve(t, i).Settle(answered()); err != nil {
		t.Fatal(err)
	}
	if err := c.m.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// settleAged settles r with the meter's clock then jumping by age: the settler finds
// the answer age old.
func (c *deadlineCase) settleAged(t *testing.T, r *ledger.Reservation, age time.Duration) {
	t.Helper()
	c.clock.jump(age)
	if err := r.Settle(answered()); err != nil {
		t.Fatal(err)
	}
}

// flush waits (at most 20 s) for the settle. Its error is not the settle's: the
// settle was under way before the Flush, which the settler takes once it is done.
func (c *deadlineCase) flush(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.m.Flush(ctx); err != nil {
		t.Logf("Flush: %v", err)
	}
}

// check says the balance holds calls' worth of charges and that the lease's row holds
// forgiven calls' units more than the meter knows of (reserved until it is released),
// all of it counted once in the key's and the day's holds.
func (c *deadlineCase) check(t *testing.T, what string, calls, forgiven int64) {
	t.Helper()
	b := c.f.balance(t)
	if b.spent != 10*calls || b.charges != calls || b.dayUnits != 10*calls {
		t.Fatalf("%s: %+v, want %d calls charged (%d units)", what, b, calls, 10*calls)
	}
	if b.held != b.leases || b.dayHeld != b.leases {
		t.Fatalf("%s: held %d, day held %d, leases %d: the holds are not the leases'", what, b.held, b.dayHeld, b.leases)
	}
	if held := ledger.Held(c.m, c.f.key.ID()); b.leases-held != 10*forgiven {
		t.Fatalf("%s: the lease's row holds %d units, the meter %d: want %d more in the row (the forgiven calls', until it goes back)",
			what, b.leases, held, 10*forgiven)
	}
}

// stop stops the meter, which gives its lease back: what the forgiven calls held too.
func (c *deadlineCase) stop(t *testing.T, calls int64) {
	t.Helper()
	c.m.Stop(context.Background())
	if b := c.f.balance(t); b.spent != 10*calls || b.charges != calls || b.held != 0 || b.leases != 0 || b.dayHeld != 0 {
		t.Fatalf("after the meter stopped: %+v, want %d calls charged and nothing held", b, calls)
	}
}

func forgivenSoFar(reason string) int64 { return ledger.Counted().Forgiven[reason] }

// lockWaiters counts the database's backends waiting for a lock.
func (c *deadlineCase) lockWaiters(t *testing.T) int64 {
	t.Helper()
	var n int64
	if err := c.f.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A call whose settle cannot commit within 20 s of its answer (the database is away)
// is forgiven then: nothing is charged when the database comes back, its units stay in
// the lease's row until the lease goes back, and it is counted. The settler kept
// trying 20 times, about 20 s, whatever the call's age: it charged this call, answered
// 19 s before, once the database was back 4 s later. A call whose database is back
// within its deadline is charged.
func TestMeterForgivesWhatItCannotSettleInTime(t *testing.T) {
	f := newFixture(t, nil)
	proxy, url := pgtest.NewProxy(t, f.pool.Config().ConnString())
	m, clock := jumpingMeter(t, eventstore.NewStore(pgtest.NewDBAt(t, url), nil))
	c := &deadlineCase{f: f, m: m, clock: clock}
	c.charge(t, 0) // the lease taken, the settler's connection warm

	late := forgivenSoFar(ledger.ForgivenLate)
	r := c.reserve(t, 1)
	proxy.Down()
	back := time.AfterFunc(5*time.Second, proxy.Up)
	defer back.Stop()
	// The settler's connection, idle for a second, is pinged before use: found dead,
	// it sends nothing (a batch sent on it would leave an outcome to learn, for 10 s
	// more), and every attempt fails to connect.
	time.Sleep(1100 * time.Millisecond)
	c.settleAged(t, r, 19*time.Second) // a second left
	c.flush(t)
	proxy.Up()
	// whatever the settler does once the database is back is done by the next Flush
	c.charge(t, 2)
	c.check(t, "the database back after the deadline", 2, 1)
	if n := forgivenSoFar(ledger.ForgivenLate) - late; n != 1 {
		t.Errorf("%d calls counted forgiven late, want 1", n)
	}

	// away for less than the 10 s left: charged
	r = c.reserve(t, 3)
	proxy.Down()
	back = time.AfterFunc(time.Second, proxy.Up)
	c.settleAged(t, r, 10*time.Second)
	c.flush(t)
	c.check(t, "the database back within the deadline", 3, 1)
	c.stop(t, 3)
}

// A settle that waits on a lock past its deadline is cut there, with its whole
// transaction, COMMIT included, sent: its backend is ended before the outcome is read,
// so the call is forgiven and nothing commits once the lock is free. The settler
// waited as long as the lock was held, and then charged the call, some 40 s after its
// answer here. One that waits less than its deadline is charged.
func TestMeterSettleCutAtItsDeadlineCommitsNothingLater(t *testing.T) {
	f := newFixture(t, nil)
	m, clock := jumpingMeter(t, f.store)
	c := &deadlineCase{f: f, m: m, clock: clock}
	c.charge(t, 0) // the settler's cursor knows the chain: one round trip, COMMIT in it
	ctx := context.Background()
	lock := func() (release func()) {
		tx, err := f.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SELECT 1 FROM key_balances WHERE key_id = $1 FOR UPDATE`, f.key.ID()); err != nil {
			t.Fatal(err)
		}
		return func() { tx.Rollback(ctx) } //nolint:errcheck // it only held a lock
	}

	late := forgivenSoFar(ledger.ForgivenLate)
	release := lock()
	c.settleAged(t, c.reserve(t, 1), 19*time.Second)
	c.flush(t)
	if n := c.lockWaiters(t); n != 0 {
		t.Errorf("%d backends still wait for the lock: a settle the meter forgave could commit once it is free", n)
	}
	release()
	time.Sleep(200 * time.Millisecond) // a backend left waiting would have committed by now
	c.charge(t, 2)
	c.check(t, "a settle cut at its deadline", 2, 1)
	if n := forgivenSoFar(ledger.ForgivenLate) - late; n != 1 {
		t.Errorf("%d calls counted forgiven late, want 1", n)
	}

	release = lock()
	time.AfterFunc(time.Second, release)
	c.settleAged(t, c.reserve(t, 3), 10*time.Second)
	c.flush(t)
	c.check(t, "a settle that waited within its deadline", 3, 1)
	c.stop(t, 3)
}

// A settle whose connection fails while it waits on a lock, its COMMIT sent, and whose
// outcome cannot be learnt before its deadline (the database out of reach) is forgiven
// and counted as unknown; its backend, its client gone, ends within seconds, so it
// does not commit once the lock is free either. Without the transaction's own bounds
// the backend waited on, and committed the call when the lock came free, 21 s after
// its answer.
func TestMeterSettleWhoseOutcomeIsUnknownCommitsNothingLater(t *testing.T) {
	f := newFixture(t, nil)
	proxy, url := pgtest.NewProxy(t, f.pool.Config().ConnString())
	m, clock := jumpingMeter(t, eventstore.NewStore(pgtest.NewDBAt(t, url), nil))
	c := &deadlineCase{f: f, m: m, clock: clock}
	c.charge(t, 0)
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // it only holds a lock
	if _, err := tx.Exec(ctx, `SELECT 1 FROM key_balances WHERE key_id = $1 FOR UPDATE`, f.key.ID()); err != nil {
		t.Fatal(err)
	}

	unknown := forgivenSoFar(ledger.ForgivenUnknown)
	c.settleAged(t, c.reserve(t, 1), 19*time.Second)
	pgtest.WaitFor(t, "the settle to wait for the lock", func() bool { return c.lockWaiters(t) == 1 })
	proxy.Down() // the settle's connection fails, and nothing can ask what became of it
	time.Sleep(2 * time.Second)
	if n := c.lockWaiters(t); n != 0 {
		t.Errorf("%d backends still wait for the lock 2 s after their client went: the settle could commit once it is free", n)
	}
	tx.Rollback(ctx) //nolint:errcheck // the lock is free
	c.flush(t)
	proxy.Up()
	c.charge(t, 2)
	c.check(t, "a settle whose outcome could not be learnt", 2, 1)
	if n := forgivenSoFar(ledger.ForgivenUnknown) - unknown; n != 1 {
		t.Errorf("%d calls counted forgiven with their outcome unknown, want 1", n)
	}
	c.stop(t, 2)
}

// A settle's transaction sets client_connection_check_interval where the database takes
// it, and settles without it where the database does not know it or refuses its value
// (an older server, another platform): a refused setting failed every settle and
// forgave every call.
func TestSettleBoundsAsTheDatabaseTakesThem(t *testing.T) {
	for _, tc := range []struct {
		name, setting string
		checked       bool
	}{
		{"known", "client_connection_check_interval", true},
		{"unknown", "no_such_setting", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ledger.NameConnectionCheck(t, tc.setting)
			f := newFixture(t, nil)
			m := f.meter(t, ledger.MeterConfig{})
			settleCall(t, f, m, 0)
			if b := f.balance(t); b.spent != 10 || b.charges != 1 {
				t.Fatalf("balance %+v after one call; want it charged (10 units, one charge)", b)
			}
			if got := strings.Contains(ledger.SettleBounds(m), tc.setting); got != tc.checked {
				t.Errorf("the settle's limits %q name %s: %t, want %t", ledger.SettleBounds(m), tc.setting, got, tc.checked)
			}
		})
	}
}
