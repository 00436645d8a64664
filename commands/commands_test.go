package commands_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/ledger"
	"chessd/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

var pepper = []byte("pepper-for-the-commands-tests")

type fixture struct {
	t    *testing.T
	ctx  context.Context
	pool *pgxpool.Pool
	h    *commands.Handler
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool := pgtest.NewDB(t)
	return &fixture{t: t, ctx: context.Background(), pool: pool, h: commands.New(eventstore.NewStore(pool, nil), pepper)}
}

func (f *fixture) count(query string, args ...any) int {
	f.t.Helper()
	var n int
	if err := f.pool.QueryRow(f.ctx, query, args...).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

func (f *fixture) key(id string) *domain.Key {
	f.t.Helper()
	k, err := commands.LoadKey(f.ctx, f.pool, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return k
}

// opens reports whether secret opens key id as its events now stand.
func (f *fixture) opens(id, secret string) error {
	f.t.Helper()
	return f.key(id).Authenticate(domain.HashSecret(pepper, secret), time.Now())
}

func wantCode(t *testing.T, what string, err error, code domain.Code) {
	t.Helper()
	if domain.ErrorCode(err) != code {
		t.Fatalf("%s: %v, want %s", what, err, code)
	}
}

// Signup writes the account, its first key, the key's balance row and the mail in one
// transaction; the secret opens the key; a second signup with the address is refused
// and writes nothing.
func TestSignup(t *testing.T) {
	f := newFixture(t)
	res, err := f.h.Signup(f.ctx, domain.Signup{Email: "Ann@Example.com"}, "req-1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.AccountID, "acct_") || !strings.HasPrefix(res.KeyID, "key_") || res.Plan != domain.PlanFree {
		t.Fatalf("signup result %+v", res)
	}
	if err := f.opens(res.KeyID, res.Secret); err != nil {
		t.Fatalf("the signup secret does not open its key: %v", err)
	}
	acct, err := commands.LoadAccount(f.ctx, f.pool, res.AccountID)
	if err != nil || acct.Version() != 1 || acct.Plan() != domain.PlanFree {
		t.Fatalf("account: %+v %v", acct, err)
	}
	if k := f.key(res.KeyID); k.AccountID() != res.AccountID || len(k.Scopes()) != len(domain.AllScopes) || k.Env() != domain.EnvLive {
		t.Fatalf("signup key: account %s scopes %v env %s", k.AccountID(), k.Scopes(), k.Env())
	}
	if n := f.count(`SELECT count(*) FROM key_balances WHERE key_id = $1`, res.KeyID); n != 1 {
		t.Fatalf("%d balance rows", n)
	}
	// queued sealed: a copy of the database holds no usable token
	if n := f.count(`SELECT count(*) FROM mail_outbox WHERE account_id = $1 AND body LIKE 'sealed1:%' AND position('ev_' IN body) = 0`, res.AccountID); n != 1 {
		t.Fatalf("%d mails queued sealed, want 1", n)
	}
	events := f.count(`SELECT count(*) FROM events`)

	_, err = f.h.Signup(f.ctx, domain.Signup{Email: "ann@example.com"}, "req-2")
	wantCode(t, "second signup with the address", err, domain.CodeConflict)
	if n := f.count(`SELECT count(*) FROM events`); n != events {
		t.Fatalf("the refused signup wrote %d events", n-events)
	}
}

// A key's life: created with a budget, updated, rotated (the old secret stops at once
// with no grace), revoked (no secret opens it, a second revocation records nothing),
// and never visible to another account.
func TestKeyLifecycle(t *testing.T) {
	f := newFixture(t)
	owner, err := f.h.Signup(f.ctx, domain.Signup{Email: "owner@example.com"}, "r")
	if err != nil {
		t.Fatal(err)
	}
	other, err := f.h.Signup(f.ctx, domain.Signup{Email: "other@example.com"}, "r")
	if err != nil {
		t.Fatal(err)
	}
	actor := commands.Actor{Key: f.key(owner.KeyID), RequestID: "r"}
	budget := int64(500)
	k, secret, err := f.h.CreateKey(f.ctx, actor, domain.KeySettings{Label: "ci", Scopes: []domain.Scope{domain.ScopeEval}, Env: domain.EnvLive, BudgetUnits: &budget})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.opens(k.ID(), secret); err != nil {
		t.Fatalf("new secret: %v", err)
	}
	var units *int64
	if err := f.pool.QueryRow(f.ctx, `SELECT budget_units FROM key_balances WHERE key_id = $1`, k.ID()).Scan(&units); err != nil || units == nil || *units != 500 {
		t.Fatalf("balance row budget %v (%v)", units, err)
	}

	label := "ci-2"
	more := int64(900)
	if _, err := f.h.UpdateKey(f.ctx, actor, k.ID(), domain.KeyChange{Label: &label, Budget: domain.BudgetChange{Units: &more}}); err != nil {
		t.Fatal(err)
	}
	if got := f.key(k.ID()); got.Label() != "ci-2" || got.Version() != 2 {
		t.Fatalf("after update: label %q version %d", got.Label(), got.Version())
	}
	if err := f.pool.QueryRow(f.ctx, `SELECT budget_units FROM key_balances WHERE key_id = $1`, k.ID()).Scan(&units); err != nil || *units != 900 {
		t.Fatalf("the balance row did not move with the key: %v (%v)", *units, err)
	}

	_, rotated, err := f.h.RotateKey(f.ctx, actor, k.ID(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.opens(k.ID(), rotated); err != nil {
		t.Fatalf("rotated secret: %v", err)
	}
	wantCode(t, "old secret after a rotation without grace", f.opens(k.ID(), secret), domain.CodeBadCredential)

	stranger := commands.Actor{Key: f.key(other.KeyID)}
	_, err = f.h.RevokeKey(f.ctx, stranger, k.ID())
	wantCode(t, "another account revokes the key", err, domain.CodeNotFound)

	if _, err := f.h.RevokeKey(f.ctx, actor, k.ID()); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "secret of a revoked key", f.opens(k.ID(), rotated), domain.CodeBadCredential)
	version := f.key(k.ID()).Version()
	if _, err := f.h.RevokeKey(f.ctx, actor, k.ID()); err != nil {
		t.Fatalf("second revocation: %v", err)
	}
	if v := f.key(k.ID()).Version(); v != version {
		t.Fatalf("a second revocation recorded an event (version %d -> %d)", version, v)
	}

	// a revoked actor is refused even though the caller still holds its *domain.Key
	if _, err := f.h.RevokeKey(f.ctx, actor, owner.KeyID); err != nil {
		t.Fatal(err)
	}
	_, _, err = f.h.CreateKey(f.ctx, actor, domain.KeySettings{Label: "late", Scopes: []domain.Scope{domain.ScopeEval}, Env: domain.EnvLive})
	wantCode(t, "create with a revoked key", err, domain.CodeBadCredential)
}

func TestClaimPepper(t *testing.T) {
	f := newFixture(t)
	if err := commands.ClaimPepper(f.ctx, f.pool, pepper); err != nil {
		t.Fatal(err)
	}
	if err := commands.ClaimPepper(f.ctx, f.pool, pepper); err != nil {
		t.Fatalf("the same pepper again: %v", err)
	}
	if err := commands.ClaimPepper(f.ctx, f.pool, []byte("another-pepper-entirely")); !errors.Is(err, commands.ErrPepperMismatch) {
		t.Fatalf("another pepper: %v, want ErrPepperMismatch", err)
	}
}

// job submits a job of n positions for a fresh pro account and returns it with its key.
func (f *fixture) job(n int) (*domain.Job, *domain.Key) {
	f.t.Helper()
	res, err := f.h.Signup(f.ctx, domain.Signup{Email: commands.NewID("jobs") + "@example.com"}, "r")
	if err != nil {
		f.t.Fatal(err)
	}
	if err := f.h.ChangePlan(f.ctx, res.AccountID, domain.PlanPro, "test"); err != nil {
		f.t.Fatal(err)
	}
	key := f.key(res.KeyID)
	price, err := ledger.Quote(domain.Call{Endpoint: domain.EndpointBatch, Depth: 8, MultiPV: 1, Positions: n})
	if err != nil {
		f.t.Fatal(err)
	}
	var ps []domain.JobPosition
	for i := range n {
		ps = append(ps, domain.JobPosition{Index: i, FEN: "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"})
	}
	j, err := f.h.SubmitJob(f.ctx, commands.Actor{Key: key, RequestID: "r"}, domain.PlanPro.Limits().UnitsPerDay, domain.JobSubmitted{
		Kind: "batch", Spec: domain.JobSpec{Depth: 8, MultiPV: 1, Engine: "sf-17.1", Path: "native"}, Positions: ps,
		HoldUnits: price.Units, HoldUSD: price.USD}, nil, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	return j, key
}

// position is what an executor reports for index i at the fresh price.
func position(t *testing.T, j *domain.Job, i int) commands.Position {
	t.Helper()
	price, err := ledger.Quote(domain.Call{Endpoint: domain.EndpointBatch, Depth: 8, MultiPV: 1, Positions: 1})
	if err != nil {
		t.Fatal(err)
	}
	return commands.Position{Index: i, Result: json.RawMessage(`{"bestmove":"e2e4"}`), Units: price.PerPosition,
		USD: ledger.UnitsUSD(price.PerPosition), Engine: "sf-17.1", Path: "native",
		Params: ledger.Params{Depth: 8, MultiPV: 1, Positions: 1, JobID: j.ID()}}
}

func (f *fixture) events(jobID, typ string) int {
	f.t.Helper()
	return f.count(`SELECT count(*) FROM events WHERE stream_id = $1 AND event_type = $2`, domain.JobStream(jobID), typ)
}

func (f *fixture) balance(key *domain.Key) ledger.Balance {
	f.t.Helper()
	bs, err := ledger.KeyBalances(f.ctx, f.pool, key.AccountID())
	if err != nil {
		f.t.Fatal(err)
	}
	return bs[key.ID()]
}

// A job from submission to its end: the submission holds the price, puts one command
// on the bus and every position on the queue; two workers take positions, never the
// same; the first to take one starts the job; a position is recorded and charged only
// by the worker that holds it, once whatever is sent again, also concurrently; the
// record of the last position ends the job and releases the rest of the hold.
func TestJobQueueTakeRecordFinish(t *testing.T) {
	f := newFixture(t)
	j, key := f.job(4)
	if j.State() != domain.StateQueued {
		t.Fatalf("submitted job is %s", j.State())
	}
	if n := f.count(`SELECT count(*) FROM watermill_` + commands.TopicJobCommands); n != 1 {
		t.Fatalf("%d commands on the bus, want 1", n)
	}
	if n := f.count(`SELECT count(*) FROM job_queue WHERE job_id = $1 AND worker IS NULL`, j.ID()); n != 4 {
		t.Fatalf("%d free positions on the queue, want 4", n)
	}
	if b := f.balance(key); b.HeldUnits != j.HoldUnits() {
		t.Fatalf("held %d, want the job's price %d", b.HeldUnits, j.HoldUnits())
	}

	lease := time.Minute
	w1, w2 := f.take("w1", 2, lease), f.take("w2", 5, lease)
	if len(w1) != 2 || len(w2) != 2 || w1[0].Index != 0 || w1[1].Index != 1 || w2[0].Index != 2 || w2[1].Index != 3 {
		t.Fatalf("taken: w1 %v, w2 %v; want 0, 1 and 2, 3", w1, w2)
	}
	if more := f.take("w3", 5, lease); len(more) != 0 {
		t.Fatalf("w3 took %v while every lease runs", more)
	}
	for _, w := range []string{"w1", "w2"} {
		if _, _, err := f.h.StartJob(f.ctx, j.ID(), w, false); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.events(j.ID(), "JobStarted"); n != 1 {
		t.Fatalf("started %d times", n)
	}
	record := func(w string, idx ...int) (*domain.Job, error) {
		var ps []commands.Position
		for _, i := range idx {
			ps = append(ps, position(t, j, i))
		}
		return f.h.RecordPositions(f.ctx, key, j.ID(), w, ps)
	}
	if got, err := record("w2", 0); err != nil || got.Done() != 0 {
		t.Fatalf("w2 recorded w1's position: %v, done %d", err, got.Done())
	}
	if _, err := record("w1", 0); err != nil {
		t.Fatal(err)
	}
	// sent again with a new one (a retry after a commit of unknown outcome): 0 is skipped
	got, err := record("w1", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got.Done() != 2 || got.State() != domain.StateRunning {
		t.Fatalf("done %d (%s), want 2 and running", got.Done(), got.State())
	}
	// the last positions from several goroutines at once: each recorded once, and the
	// job ends with them
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			record("w2", 2, 3) //nolint:errcheck // the losers find the job ended: counted below
		}()
	}
	wg.Wait()
	if n := f.events(j.ID(), "JobPositionAnalysed"); n != 4 {
		t.Fatalf("%d positions recorded, want 4", n)
	}
	per := position(t, j, 0).Units
	charges := f.count(`SELECT count(*) FROM events WHERE stream_id = $1 AND event_type = 'UnitsCharged' AND payload->'params'->>'job_id' = $2`,
		ledger.Stream(key.ID()), j.ID())
	if charges != 4 {
		t.Fatalf("%d charges, want 4", charges)
	}
	if n := f.events(j.ID(), "JobSucceeded"); n != 1 {
		t.Fatalf("%d JobSucceeded, want 1", n)
	}
	if b := f.balance(key); b.HeldUnits != 0 || b.SpentUnits != 4*per {
		t.Fatalf("after the end: held %d spent %d, want 0 and %d", b.HeldUnits, b.SpentUnits, 4*per)
	}
	if n := f.count(`SELECT count(*) FROM job_queue WHERE job_id = $1`, j.ID()); n != 0 {
		t.Fatalf("%d positions left on the queue", n)
	}
	if _, _, err := f.h.StartJob(f.ctx, j.ID(), "w3", false); !errors.Is(err, commands.ErrNotClaimable) {
		t.Fatalf("start of a finished job: %v", err)
	}
	if _, err := record("w1", 0); !errors.Is(err, commands.ErrNotClaimable) {
		t.Fatalf("record after the end: %v", err)
	}
}

// A process records a job from the aggregate it kept in memory, read up to date under
// the job's lock: two workers in two processes recording one job in turns each see the
// other's positions, so a position sent twice is recorded once, and the job ends
// exactly when its last position is recorded, whichever process records it.
func TestRecordingCatchesUpWithOtherProcesses(t *testing.T) {
	f := newFixture(t)
	j, key := f.job(4)
	other := commands.New(eventstore.NewStore(f.pool, nil), pepper)
	procs := map[string]*commands.Handler{"w1": f.h, "w2": other}
	for _, w := range []string{"w1", "w2"} {
		f.take(w, 2, time.Minute)
		if _, _, err := procs[w].StartJob(f.ctx, j.ID(), w, false); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		worker string
		index  int
		done   int
	}{
		{"w1", 0, 1}, {"w2", 2, 2}, {"w1", 1, 3}, // each process's second record follows the other's first
		{"w1", 0, 3}, // again: already recorded (w1 knows from its own cache)
		{"w2", 3, 4}, // the last: ends the job
	}
	for _, st := range steps {
		got, err := procs[st.worker].RecordPositions(f.ctx, key, j.ID(), st.worker, []commands.Position{position(t, j, st.index)})
		if err != nil {
			t.Fatalf("%s records %d: %v", st.worker, st.index, err)
		}
		loaded, err := commands.LoadJob(f.ctx, f.pool, j.ID())
		if err != nil {
			t.Fatal(err)
		}
		if got.Done() != st.done || got.Version() != loaded.Version() || got.Done() != loaded.Done() || got.State() != loaded.State() {
			t.Fatalf("%s after recording %d: done %d at version %d (%s); the stream: done %d at version %d (%s); want done %d",
				st.worker, st.index, got.Done(), got.Version(), got.State(), loaded.Done(), loaded.Version(), loaded.State(), st.done)
		}
	}
	if n := f.events(j.ID(), "JobPositionAnalysed"); n != 4 {
		t.Fatalf("%d positions recorded, want 4", n)
	}
	if n := f.events(j.ID(), "JobSucceeded"); n != 1 {
		t.Fatalf("%d JobSucceeded, want 1", n)
	}
	// the job ended: neither process records more, whatever it kept
	for w, h := range procs {
		if _, err := h.RecordPositions(f.ctx, key, j.ID(), w, []commands.Position{position(t, j, 1)}); !errors.Is(err, commands.ErrNotClaimable) {
			t.Fatalf("%s records after the end: %v", w, err)
		}
	}
}

// A lease that ran out lets another worker take the position up (JobResumed); the
// first worker can then neither record it nor renew it, and a cancel takes every
// position off the queue.
func TestJobTakeoverAndCancel(t *testing.T) {
	f := newFixture(t)
	j, key := f.job(3)
	if got := f.take("w1", 4, -time.Second); len(got) != 3 { // leases already over
		t.Fatalf("w1 took %v", got)
	}
	if _, _, err := f.h.StartJob(f.ctx, j.ID(), "w1", false); err != nil {
		t.Fatal(err)
	}
	// a lease that ran out but that nobody took is still good for recording
	if _, err := f.h.RecordPositions(f.ctx, key, j.ID(), "w1", []commands.Position{position(t, j, 0)}); err != nil {
		t.Fatal(err)
	}
	taken := f.take("w2", 5, time.Minute)
	if len(taken) != 2 || !taken[0].TookOver || !taken[1].TookOver {
		t.Fatalf("w2 took %v, want positions 1 and 2 taken over", taken)
	}
	resumed, _, err := f.h.StartJob(f.ctx, j.ID(), "w2", true)
	if err != nil {
		t.Fatal(err)
	}
	if resumed.Worker() != "w2" || resumed.Result(0) == nil || f.events(j.ID(), "JobResumed") != 1 {
		t.Fatalf("resumed by %s, position 0 kept: %v", resumed.Worker(), resumed.Result(0) != nil)
	}
	if got, err := f.h.RecordPositions(f.ctx, key, j.ID(), "w1", []commands.Position{position(t, j, 1)}); err != nil || got.Done() != 1 {
		t.Fatalf("record by the worker that lost the lease: %v, done %d", err, got.Done())
	}
	slots := []commands.Slot{{JobID: j.ID(), Index: 1}, {JobID: j.ID(), Index: 2}}
	if lost, err := f.h.RenewPositions(f.ctx, "w1", slots, time.Minute); err != nil || len(lost) != 2 {
		t.Fatalf("renew by the worker that lost the leases: lost %v (%v)", lost, err)
	}
	if lost, err := f.h.RenewPositions(f.ctx, "w2", slots, time.Minute); err != nil || len(lost) != 0 {
		t.Fatalf("renew by the worker that holds them: lost %v (%v)", lost, err)
	}

	if _, err := f.h.CancelJob(f.ctx, commands.Actor{Key: key}, j.ID()); err != nil {
		t.Fatal(err)
	}
	if lost, err := f.h.RenewPositions(f.ctx, "w2", slots, time.Minute); err != nil || len(lost) != 2 {
		t.Fatalf("renew after the cancel: lost %v (%v), want both", lost, err)
	}
	if _, err := f.h.RecordPositions(f.ctx, key, j.ID(), "w2", []commands.Position{position(t, j, 1)}); !errors.Is(err, commands.ErrNotClaimable) {
		t.Fatalf("record after the cancel: %v", err)
	}
	if n := f.events(j.ID(), "JobPositionAnalysed"); n != 1 {
		t.Fatalf("%d positions recorded, want only the one before the takeover", n)
	}
	if b := f.balance(key); b.HeldUnits != 0 || b.SpentUnits != position(t, j, 0).Units {
		t.Fatalf("after the cancel: held %d spent %d", b.HeldUnits, b.SpentUnits)
	}
	_, err = f.h.CancelJob(f.ctx, commands.Actor{Key: key}, j.ID())
	wantCode(t, "second cancel", err, domain.CodeConflict)
}

// Renewing waits for no row lock: a position whose row another transaction holds (its
// record, deleting it) is neither waited for, nor lost, nor renewed this time, and the
// others are renewed. Waiting could deadlock with a record that locks the rows in
// another order (seen in the bench: a second's stall of the whole job).
func TestRenewWaitsForNoLock(t *testing.T) {
	f := newFixture(t)
	j, _ := f.job(2)
	if got := f.take("w1", 2, time.Minute); len(got) != 2 {
		t.Fatalf("w1 took %v", got)
	}
	tx, err := f.pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(f.ctx) //nolint:errcheck // the test's own lock
	if _, err := tx.Exec(f.ctx, `SELECT 1 FROM job_queue WHERE job_id = $1 AND idx = 0 FOR UPDATE`, j.ID()); err != nil {
		t.Fatal(err)
	}
	leaseOf := func(idx int) (until time.Time) {
		if err := f.pool.QueryRow(f.ctx, `SELECT lease_until FROM job_queue WHERE job_id = $1 AND idx = $2`, j.ID(), idx).Scan(&until); err != nil {
			t.Fatal(err)
		}
		return until
	}
	before0, before1 := leaseOf(0), leaseOf(1)
	ctx, cancel := context.WithTimeout(f.ctx, 5*time.Second)
	defer cancel()
	slots := []commands.Slot{{JobID: j.ID(), Index: 0}, {JobID: j.ID(), Index: 1}}
	lost, err := f.h.RenewPositions(ctx, "w1", slots, time.Hour)
	if err != nil || len(lost) != 0 {
		t.Fatalf("renew beside a locked position: lost %v (%v), want none and no wait", lost, err)
	}
	if leaseOf(0) != before0 || !leaseOf(1).After(before1) {
		t.Fatalf("leases %v -> %v and %v -> %v: want the locked one unchanged, the other renewed", before0, leaseOf(0), before1, leaseOf(1))
	}
}

// Positions are taken fairly between accounts: an account's long batch does not keep
// another account's later job waiting behind it, and within an account the older job
// goes first.
func TestJobQueueIsFairBetweenAccounts(t *testing.T) {
	f := newFixture(t)
	a, _ := f.job(6)
	b, _ := f.job(2) // another account, submitted later
	lease := time.Minute
	var order []string
	for range 4 {
		for _, tk := range f.take("w", 2, lease) {
			name := map[string]string{a.ID(): "a", b.ID(): "b"}[tk.JobID]
			order = append(order, fmt.Sprintf("%s%d", name, tk.Index))
		}
	}
	if got, want := strings.Join(order, " "), "a0 b0 a1 b1 a2 a3 a4 a5"; got != want {
		t.Fatalf("taken in the order %s, want %s", got, want)
	}
}

func (f *fixture) take(worker string, n int, lease time.Duration) []commands.Taken {
	f.t.Helper()
	got, err := f.h.TakePositions(f.ctx, worker, n, n, lease)
	if err != nil {
		f.t.Fatal(err)
	}
	return got
}

// A worker alive and holding nothing has its share of a take, as a worker holding
// positions has: beyond what its idle engines need, the first worker to take an
// 8-position job takes half of it while another is alive, all of it once the other
// stopped or its word ran out.
func TestTakeLeavesAliveWorkersTheirShare(t *testing.T) {
	for _, tc := range []struct {
		name  string
		other func(f *fixture)
		want  int
	}{
		{"alone", func(*fixture) {}, 8},
		{"another alive", func(f *fixture) { f.alive("idle", time.Minute) }, 4},
		{"two others alive", func(f *fixture) { f.alive("idle", time.Minute); f.alive("idle2", time.Minute) }, 3},
		{"another whose word ran out", func(f *fixture) { f.alive("idle", -time.Second) }, 8},
		{"another long dead, forgotten", func(f *fixture) {
			f.alive("dead", -time.Hour)
			f.alive("idle", time.Minute)
			if n := f.count(`SELECT count(*) FROM job_workers WHERE worker = 'dead'`); n != 0 {
				t.Fatalf("a worker dead for an hour still listed")
			}
		}, 4},
		{"another stopped", func(f *fixture) {
			f.alive("idle", time.Minute)
			if err := f.h.StopWorker(f.ctx, "idle"); err != nil {
				t.Fatal(err)
			}
		}, 8},
		{"itself alive", func(f *fixture) { f.alive("w", time.Minute) }, 8},
		{"itself back after a long pause", func(f *fixture) { f.alive("w", -time.Hour); f.alive("w", time.Minute) }, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.job(8)
			tc.other(f)
			got, err := f.h.TakePositions(f.ctx, "w", 8, 0, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tc.want {
				t.Fatalf("took %d positions, want %d", len(got), tc.want)
			}
		})
	}
}

func (f *fixture) alive(worker string, d time.Duration) {
	f.t.Helper()
	if err := f.h.WorkerAlive(f.ctx, worker, d); err != nil {
		f.t.Fatal(err)
	}
}
