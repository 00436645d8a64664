package domain

import (
	"testing"
	"time"

	"github.com/shopspring/decimal"
)

func newTestJob(t *testing.T) *Job {
	t.Helper()
	e, err := NewJob(JobSubmitted{JobID: "job_1", Kind: "batch", Positions: []JobPosition{{Index: 0, FEN: "x"}, {Index: 1, FEN: "y"}},
		HoldUnits: 40, HoldUSD: decimal.RequireFromString("0.0004")})
	if err != nil {
		t.Fatal(err)
	}
	return RehydrateJob([]Event{e})
}

func TestJobTransitions(t *testing.T) {
	all := []JobState{StateQueued, StateRunning, StateSucceeded, StateFailed, StateCancelled}
	allowed := map[[2]JobState]bool{
		{StateQueued, StateRunning}: true, {StateQueued, StateCancelled}: true,
		{StateRunning, StateSucceeded}: true, {StateRunning, StateFailed}: true, {StateRunning, StateCancelled}: true,
	}
	for _, from := range all {
		for _, to := range all {
			if CanMove(from, to) != allowed[[2]JobState{from, to}] {
				t.Errorf("%s -> %s: CanMove %v", from, to, CanMove(from, to))
			}
		}
	}
}

func TestJobLifecycle(t *testing.T) {
	now := time.Now()
	j := newTestJob(t)
	if _, err := j.Succeed(now); err == nil {
		t.Fatal("a queued job succeeded")
	}
	if _, err := j.Analysed(JobPositionAnalysed{Index: 0}); err == nil {
		t.Fatal("a queued job recorded a position")
	}
	s, err := j.Start("w1", now)
	if err != nil {
		t.Fatal(err)
	}
	j.Apply(s)
	if _, err := j.Start("w2", now); err == nil {
		t.Fatal("a running job started twice")
	}
	p, err := j.Analysed(JobPositionAnalysed{Index: 1, Units: 15, USD: decimal.RequireFromString("0.00015")})
	if err != nil {
		t.Fatal(err)
	}
	j.Apply(p)
	if _, err := j.Analysed(JobPositionAnalysed{Index: 1}); ErrorCode(err) != CodeConflict {
		t.Fatalf("a position analysed twice: %v", err)
	}
	if _, err := j.Analysed(JobPositionAnalysed{Index: 2}); err == nil {
		t.Fatal("a position the job does not have")
	}
	if _, err := j.Succeed(now); err == nil {
		t.Fatal("succeeded with a position missing")
	}
	c, err := j.Cancel(now)
	if err != nil {
		t.Fatal(err)
	}
	j.Apply(c)
	if _, err := j.Cancel(now); ErrorCode(err) != CodeConflict {
		t.Fatalf("cancelled twice: %v", err)
	}
	if j.State() != StateCancelled || j.CostUnits() != 15 || j.FinishedAt() == nil {
		t.Fatalf("state %s cost %d", j.State(), j.CostUnits())
	}
}

func TestNewJobBounds(t *testing.T) {
	if _, err := NewJob(JobSubmitted{Kind: "batch"}); err == nil {
		t.Fatal("no positions accepted")
	}
	many := make([]JobPosition, 51)
	for i := range many {
		many[i].Index = i
	}
	if _, err := NewJob(JobSubmitted{Kind: "batch", Positions: many}); err == nil {
		t.Fatal("51 positions accepted")
	}
}
