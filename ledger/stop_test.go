package ledger_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"chessd/ledger"
	"chessd/postgres/pgtest"
	"chessd/syncbuf"
)

// A meter asked to stop while calls it reserved are still running (a search takes up
// to a minute) reserves nothing more, waits for them, and charges the one answered
// after the stop was asked for before it stops; the one that produced no answer is
// free. It stopped at once before: the late answer was answered free, or queued after
// the last drain and dropped.
func TestMeterStopChargesCallsAnsweredWhileStopping(t *testing.T) {
	f := newFixture(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	m := ledger.NewMeter(ctx, f.store, nil, ledger.MeterConfig{})
	running, err := m.Reserve(context.Background(), f.evalCall(1))
	if err != nil {
		t.Fatal(err)
	}
	failing, err := m.Reserve(context.Background(), f.evalCall(2))
	if err != nil {
		t.Fatal(err)
	}
	cancel() // the server stops
	pgtest.WaitFor(t, "the stopping meter to refuse new calls", func() bool {
		r, err := m.Reserve(context.Background(), f.evalCall(3))
		if err == nil {
			r.Cancel() // not stopping yet
		}
		return errors.Is(err, ledger.ErrStopped)
	})
	failing.Cancel()
	select {
	case <-m.Done():
		t.Fatal("the meter stopped with a reserved call still running")
	default:
	}
	if err := running.Settle(answered()); err != nil {
		t.Fatalf("settle while stopping: %v", err)
	}
	select {
	case <-m.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the meter did not stop once its last call was settled")
	}
	if b := f.balance(t); b.spent != 10 || b.charges != 1 || b.held != 0 || b.leases != 0 || b.dayHeld != 0 {
		t.Fatalf("balance %+v, want the call answered while stopping charged once, and the lease given back", b)
	}
}

// A call answered after the meter's final drain (the grace ran out, or Stop's context
// ended) is never queued: Settle refuses it (503: nothing charged, retry, so its
// answer is not given), counts it and logs it at warn with its request id. Nothing is
// charged and the units go back. Calls settled before the drain are all charged, also
// those settled while it began.
func TestMeterSettleAfterTheFinalDrainIsRefused(t *testing.T) {
	f := newFixture(t, nil)
	var logs syncbuf.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	m := ledger.NewMeter(context.Background(), f.store, logger, ledger.MeterConfig{})
	ctx := context.Background()
	const before = 50
	late, err := m.Reserve(ctx, f.evalCall(0))
	if err != nil {
		t.Fatal(err)
	}
	var calls []*ledger.Reservation
	for i := range before {
		r, err := m.Reserve(ctx, f.evalCall(1+i))
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, r)
	}
	// settled as the drain begins: each is charged, or refused, never lost
	var wg sync.WaitGroup
	settled := make([]error, before)
	for i, r := range calls {
		wg.Add(1)
		go func() { defer wg.Done(); settled[i] = r.Settle(answered()) }()
	}
	refusedBefore := ledger.Counted().Refusals[ledger.OutcomeStoppedUnsettled]
	over, stop := context.WithCancel(ctx)
	stop() // the grace is over: the final drain at once
	m.Stop(over)
	wg.Wait()
	charged := 0
	for _, err := range settled {
		if err == nil {
			charged++
		} else if !errors.Is(err, ledger.ErrStopped) {
			t.Fatalf("settle as the drain began: %v", err)
		}
	}
	err = late.Settle(answered())
	if !errors.Is(err, ledger.ErrStopped) {
		t.Fatalf("settle after the final drain: %v, want ErrStopped", err)
	}
	var refusal *ledger.Refusal
	if !errors.As(err, &refusal) || refusal.Outcome != ledger.OutcomeStoppedUnsettled {
		t.Fatalf("settle after the final drain: %#v, want a %s refusal", err, ledger.OutcomeStoppedUnsettled)
	}
	if got := ledger.Counted().Refusals[ledger.OutcomeStoppedUnsettled] - refusedBefore; got != int64(before-charged+1) {
		t.Fatalf("%d calls counted as answered after the drain, want %d", got, before-charged+1)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "request_id=req-0") {
		t.Fatalf("no warning names the refused call:\n%s", logs.String())
	}
	late.Cancel() // the handler's clean-up: nothing more
	if b := f.balance(t); b.spent != int64(10*charged) || b.charges != int64(charged) || b.held != 0 || b.leases != 0 {
		t.Fatalf("balance %+v, want the %d calls settled before the drain charged, nothing held", b, charged)
	}
	t.Logf("%d of %d calls settled as the drain began were charged", charged, before)
}
