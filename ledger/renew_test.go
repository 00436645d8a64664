package ledger_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/eventstore"
	"chessd/ledger"
	"chessd/postgres/pgtest"
)

// renewCfg expires what a meter stops renewing within a second, and keeps idle leases,
// so that only renewal decides what stays.
var renewCfg = ledger.MeterConfig{LeaseTTL: time.Second, LeaseIdle: time.Hour, LeaseKeep: time.Hour}

// A meter renews the lease rows it still uses (its leases, and those whose release
// waits for their calls to settle) and no other row of its own: one it lost track of
// expires and is recovered, and a lease retired after a forgiven call is given back.
func TestMeterRenewsOnlyTheLeasesItUses(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		run  func(t *testing.T, f *fixture, m *ledger.Meter)
	}{
		{"a lease in use", func(t *testing.T, f *fixture, m *ledger.Meter) {
			r, err := m.Reserve(ctx, f.evalCall(1))
			if err != nil {
				t.Fatal(err)
			}
			r.Cancel()
			renewedPastExpiry(t, f, leaseOf(t, f))
		}},
		{"the lease of a call forgiven for its claim, with another call in flight", func(t *testing.T, f *fixture, m *ledger.Meter) {
			st := ledger.Stored{Scope: f.key.ID(), Key: "idem-forgiven", RequestHash: []byte("h")}
			if first, err := m.Claim(ctx, st); err != nil || first != nil {
				t.Fatalf("claim: %v %v", first, err)
			}
			forgiven, err := m.Reserve(ctx, f.evalCall(1))
			if err != nil {
				t.Fatal(err)
			}
			inFlight, err := m.Reserve(ctx, f.evalCall(2))
			if err != nil {
				t.Fatal(err)
			}
			id := leaseOf(t, f)
			// a retry at another server took the claim over
			if _, err := f.pool.Exec(ctx, `UPDATE idempotency SET owner = 'srv_retry' WHERE scope = $1 AND idem_key = $2`, st.Scope, st.Key); err != nil {
				t.Fatal(err)
			}
			a, done := answered(), st
			done.Status, done.Response = 200, []byte(`{}`)
			a.Idempotency = &done
			if err := forgiven.Settle(a); err != nil {
				t.Fatal(err)
			}
			if err := m.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			renewedPastExpiry(t, f, id) // the call in flight still holds it
			if err := inFlight.Settle(answered()); err != nil {
				t.Fatal(err)
			}
			if err := m.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if b := f.balance(t); b.spent != 10 || b.charges != 1 {
				t.Fatalf("balance %+v, want the call in flight charged, the forgiven one not", b)
			}
			givenBack(t, f, "the retired lease given back once its last call settled")
		}},
		{"a row of this server it does not track (its release failed)", func(t *testing.T, f *fixture, m *ledger.Meter) {
			var outcome string
			if err := f.pool.QueryRow(ctx, `SELECT outcome FROM meter_lease('lease_lost', $1, $2, $3, 'live', $4, 100, 100, $5, 1000000, '1 second')`,
				m.Owner(), f.key.ID(), f.key.AccountID(), time.Now().UTC().Format(time.DateOnly), ledger.UnitPriceUSD).Scan(&outcome); err != nil || outcome != ledger.OutcomeOK {
				t.Fatalf("lease: %s %v", outcome, err)
			}
			givenBack(t, f, "the untracked row expired and recovered")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, nil)
			c.run(t, f, f.meter(t, renewCfg))
		})
	}
}

// A meter renews only the Idempotency-Key claims it still means to answer: one it will
// not store nor give back expires and a retry takes it over, while one still being
// answered stays the first request's.
func TestMeterRenewsOnlyTheClaimsItMeansToAnswer(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		// orphan leaves st claimed by m, without an answer; false: m still answers it
		orphan func(t *testing.T, f *fixture, m *ledger.Meter, lost *atomic.Bool, st ledger.Stored) bool
	}{
		{"a claim still being answered", func(t *testing.T, f *fixture, m *ledger.Meter, lost *atomic.Bool, st ledger.Stored) bool {
			claim(t, m, st)
			return false
		}},
		{"its answer not stored (Store failed)", func(t *testing.T, f *fixture, m *ledger.Meter, lost *atomic.Bool, st ledger.Stored) bool {
			claim(t, m, st)
			gone, cancel := context.WithCancel(ctx)
			cancel()
			if err := m.Store(gone, answer(st)); err == nil {
				t.Fatal("Store on a cancelled context stored the answer")
			}
			return true
		}},
		{"its caller saw the claim fail", func(t *testing.T, f *fixture, m *ledger.Meter, lost *atomic.Bool, st ledger.Stored) bool {
			// the claim waits for another insert of the key, and commits once that is
			// rolled back, after the caller gave up
			tx, err := f.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck // rolled back below
			if _, err := tx.Exec(ctx, `INSERT INTO idempotency (scope, idem_key, request_hash, status, response, state, owner, expires_at)
				VALUES ($1, $2, $3, 0, '', 'running', 'srv_other', now() + interval '1 minute')`, st.Scope, st.Key, st.RequestHash); err != nil {
				t.Fatal(err)
			}
			cctx, cancel := context.WithCancel(ctx)
			claimed := make(chan error, 1)
			go func() {
				_, err := m.Claim(cctx, st)
				claimed <- err
			}()
			waitForLockWaitIn(t, f.pool, "meter_claim")
			lost.Store(true)
			cancel()
			if err := <-claimed; err == nil {
				t.Fatal("a claim whose context ended while it waited succeeded")
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			pgtest.WaitFor(t, "the abandoned claim committed", func() bool {
				return count(t, f.pool, `SELECT count(*) FROM idempotency WHERE scope = $1 AND idem_key = $2 AND owner = $3`,
					st.Scope, st.Key, m.Owner()) == 1
			})
			lost.Store(false)
			return true
		}},
		{"its call's charge refused on its own", func(t *testing.T, f *fixture, m *ledger.Meter, lost *atomic.Bool, st ledger.Stored) bool {
			claim(t, m, st)
			r, err := m.Reserve(ctx, f.evalCall(1))
			if err != nil {
				t.Fatal(err)
			}
			restore := ledger.EditSettled(func(e *ledger.ChargesSettled) { e.Postings = e.Postings[:1] })
			a, done := answered(), answer(st)
			a.Idempotency = &done
			if err := r.Settle(a); err != nil {
				t.Fatal(err)
			}
			m.Flush(ctx) //nolint:errcheck // the refused charge's error
			restore()
			if b := f.balance(t); b.spent != 0 || b.charges != 0 {
				t.Fatalf("the refused call was charged: %+v", b)
			}
			return true
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, nil)
			store, lost := lossyStore(t, f)
			m, retry := f.meterOn(t, store, renewCfg), f.meter(t, renewCfg)
			st := ledger.Stored{Scope: f.key.ID(), Key: "idem-1", RequestHash: []byte("h")}
			if !c.orphan(t, f, m, lost, st) {
				claimRenewedPastExpiry(t, f, st)
				if _, err := retry.Claim(ctx, st); !errors.Is(err, ledger.ErrIdempotencyRunning) {
					t.Fatalf("a retry while the first is answered: %v, want it told to wait", err)
				}
				if err := m.Store(ctx, answer(st)); err != nil {
					t.Fatal(err)
				}
				if first, err := retry.Claim(ctx, st); err != nil || first == nil || first.Status != 200 {
					t.Fatalf("a retry after the answer: %+v %v, want the answer", first, err)
				}
				return
			}
			pgtest.WaitFor(t, "a retry to take the orphan claim over", func() bool {
				first, err := retry.Claim(ctx, st)
				if errors.Is(err, ledger.ErrIdempotencyRunning) {
					return false
				}
				if err != nil || first != nil {
					t.Fatalf("retry: %+v %v, want the claim", first, err)
				}
				return true
			})
		})
	}
}

// A claim answered in its caller's own transaction (a job's submission: StoreAnswer) is
// no longer renewed nor remembered once its answer is stored.
func TestMeterForgetsAClaimStoredElsewhere(t *testing.T) {
	f := newFixture(t, nil)
	m := f.meter(t, renewCfg)
	st := ledger.Stored{Scope: f.key.ID(), Key: "idem-job", RequestHash: []byte("h")}
	claim(t, m, st)
	if ledger.Claims(m) != 1 {
		t.Fatalf("%d claims renewed, want the one", ledger.Claims(m))
	}
	st = answer(st)
	st.Owner = m.Owner()
	if kept, err := ledger.StoreAnswer(context.Background(), f.pool, st); err != nil || !kept {
		t.Fatalf("store: %v %v", kept, err)
	}
	pgtest.WaitFor(t, "the answered claim forgotten", func() bool { return ledger.Claims(m) == 0 })
}

// A top-up whose outcome is unknown (cut off while it waited on the key's balance row,
// which it may still commit) must not leave the database holding units the meter does
// not know of: either it runs to its end though the caller went, or the meter stops
// using the lease and its row is given back. Later calls take a new lease.
func TestMeterTopUpWhoseOutcomeIsUnknown(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		ttl  time.Duration // a top-up's own bound is a third of it
		// the balance row stays locked until the top-up has failed
		pastItsBound bool
	}{
		{"the caller goes while the top-up waits", 15 * time.Second, false},
		{"the top-up runs out of time while it waits", 1500 * time.Millisecond, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, nil)
			cfg := renewCfg
			cfg.LeaseTTL = c.ttl
			store, lost := lossyStore(t, f)
			m := f.meterOn(t, store, cfg)
			lock, err := f.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer lock.Rollback(ctx) //nolint:errcheck // committed below
			if _, err := lock.Exec(ctx, `SELECT 1 FROM key_balances WHERE key_id = $1 FOR UPDATE`, f.key.ID()); err != nil {
				t.Fatal(err)
			}
			cctx, cancel := context.WithCancel(ctx)
			type reserved struct {
				r   *ledger.Reservation
				err error
			}
			done := make(chan reserved, 1)
			go func() {
				r, err := m.Reserve(cctx, f.evalCall(1))
				done <- reserved{r, err}
			}()
			waitForLockWaitIn(t, f.pool, "meter_lease")
			lost.Store(true)
			cancel()
			var got reserved
			if c.pastItsBound {
				got = <-done
			}
			if err := lock.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if !c.pastItsBound {
				got = <-done
			}
			t.Logf("reserve: %v", got.err)
			if got.err == nil {
				got.r.Cancel()
			}
			pgtest.WaitFor(t, "the top-up's statement done", func() bool {
				return count(t, f.pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
					AND pid <> pg_backend_pid() AND state = 'active' AND query LIKE '%meter_lease%'`) == 0
			})
			lost.Store(false)
			sameHeld := func() bool { return f.balance(t).held == ledger.Held(m, f.key.ID()) }
			pgtest.WaitFor(t, "the database to hold what the meter holds", sameHeld)
			settleCall(t, f, m, 2)
			if b := f.balance(t); b.spent != 10 || b.charges != 1 || b.held != b.leases || b.dayHeld != b.leases {
				t.Fatalf("balance %+v, want the later call charged once and the holds its leases'", b)
			}
			pgtest.WaitFor(t, "the database to hold what the meter holds after a later call", sameHeld)
		})
	}
}

// lossyStore is a store on a pool of its own whose cancel requests (and any new
// connection) are lost while lost is set, as across a network partition: a statement
// cut off by its context then runs on, and may commit, while its caller sees an error.
func lossyStore(t *testing.T, f *fixture) (*eventstore.Store, *atomic.Bool) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(f.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	lost := new(atomic.Bool)
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if lost.Load() {
			return nil, errors.New("lossyStore: lost")
		}
		return dial(ctx, network, addr)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return eventstore.NewStore(pool, nil), lost
}

// meterOn is a meter on store, stopped when the test ends.
func (f *fixture) meterOn(t *testing.T, store *eventstore.Store, cfg ledger.MeterConfig) *ledger.Meter {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	m := ledger.NewMeter(ctx, store, nil, cfg)
	t.Cleanup(func() {
		cancel()
		<-m.Done() // before its pool closes
	})
	return m
}

func claim(t *testing.T, m *ledger.Meter, st ledger.Stored) {
	t.Helper()
	if first, err := m.Claim(context.Background(), st); err != nil || first != nil {
		t.Fatalf("claim: %+v %v", first, err)
	}
}

func answer(st ledger.Stored) ledger.Stored {
	st.Status, st.Response = 200, []byte(`{"ok":true}`)
	return st
}

// leaseOf is the key's one lease row.
func leaseOf(t *testing.T, f *fixture) string {
	t.Helper()
	var id string
	if err := f.pool.QueryRow(context.Background(), `SELECT lease_id FROM leases WHERE key_id = $1`, f.key.ID()).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// renewedPastExpiry waits until lease id is renewed after it would have expired
// without renewal, and fails if it is recovered meanwhile.
func renewedPastExpiry(t *testing.T, f *fixture, id string) {
	t.Helper()
	renewedPast(t, f.pool, `SELECT expires_at FROM leases WHERE lease_id = $1`, id)
}

// claimRenewedPastExpiry is renewedPastExpiry for st's claim, which must stay running.
func claimRenewedPastExpiry(t *testing.T, f *fixture, st ledger.Stored) {
	t.Helper()
	renewedPast(t, f.pool, `SELECT expires_at FROM idempotency WHERE scope = $1 AND idem_key = $2 AND state = 'running'`, st.Scope, st.Key)
}

func renewedPast(t *testing.T, pool *pgxpool.Pool, query string, args ...any) {
	t.Helper()
	expiresAt := func() time.Time {
		var at time.Time
		err := pool.QueryRow(context.Background(), query, args...).Scan(&at)
		if errors.Is(err, pgx.ErrNoRows) {
			t.Fatalf("%v was recovered or taken over while in use", args)
		}
		if err != nil {
			t.Fatal(err)
		}
		return at
	}
	first := expiresAt()
	// renewed at a time after first: it outlived its expiry
	pgtest.WaitFor(t, "a renewal past the expiry", func() bool { return expiresAt().After(first.Add(renewCfg.LeaseTTL)) })
}

// givenBack waits until nothing is held for the key.
func givenBack(t *testing.T, f *fixture, what string) {
	t.Helper()
	pgtest.WaitFor(t, what, func() bool {
		b := f.balance(t)
		return b.leases == 0 && b.held == 0 && b.dayHeld == 0
	})
}

// waitForLockWaitIn waits until a statement calling fn waits for a lock.
func waitForLockWaitIn(t *testing.T, pool *pgxpool.Pool, fn string) {
	t.Helper()
	pgtest.WaitFor(t, fn+" waiting for a lock", func() bool {
		return count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%' AND pid <> pg_backend_pid()`, fn) > 0
	})
}
