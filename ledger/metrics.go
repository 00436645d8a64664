package ledger

import (
	"maps"
	"sync"

	"github.com/shopspring/decimal"

	"chessd/eventstore"
)

// Counts is what this process's money path did since it started, for the metrics
// (/metrics reads it at scrape time): the charges it committed, the refusals it gave
// and the answered calls it forgave. Every process counts its own; Prometheus sums them.
type Counts struct {
	Charges  map[ChargeKind]ChargeTotals
	Refusals map[string]int64 // by outcome (OutcomeBudgetUnits, …)
	Forgiven map[string]int64 // by reason (ForgivenLate, …)
}

// Why the meter forgave answered calls (their answers stand, nothing is charged), as
// Counts.Forgiven counts them.
const (
	// ForgivenLate: not committed within its deadline (settleTrying after its
	// charged_at): the database was away or too slow.
	ForgivenLate = "late"
	// ForgivenUnknown: whether its commit went through could not be learnt by its
	// deadline (settleWithin): the ledger holds it or not, never twice.
	ForgivenUnknown = "unknown"
	// ForgivenRefused: the ledger refused its charge (settleRefused).
	ForgivenRefused = "refused"
	// ForgivenLost: its lease was gone or its Idempotency-Key claim taken over by a
	// retry.
	ForgivenLost = "lost"
)

// ChargeKind is what a charge is counted under.
type ChargeKind struct {
	Endpoint string
	Cached   bool
}

// ChargeTotals are the charges of one kind.
type ChargeTotals struct {
	Charges int64
	Units   int64
	USD     decimal.Decimal
}

var counted = struct {
	sync.Mutex
	charges  map[ChargeKind]ChargeTotals
	refusals map[string]int64
	forgiven map[string]int64
}{charges: map[ChargeKind]ChargeTotals{}, refusals: map[string]int64{}, forgiven: map[string]int64{}}

// Counted returns a copy of the counts so far.
func Counted() Counts {
	counted.Lock()
	defer counted.Unlock()
	out := Counts{Charges: make(map[ChargeKind]ChargeTotals, len(counted.charges)), Refusals: maps.Clone(counted.refusals),
		Forgiven: maps.Clone(counted.forgiven)}
	for k, v := range counted.charges {
		out.Charges[k] = v
	}
	return out
}

// CountCommitted counts the charges among events a transaction committed (a job's
// positions: commands.RecordPositions); the meter counts its own settles.
func CountCommitted(evs []eventstore.Event) {
	for _, e := range evs {
		if uc, ok := e.Value().(*UnitsCharged); ok {
			countCharge(uc.Endpoint, uc.Cached, uc.Units, uc.USD)
		}
	}
}

// countCharge counts one committed charge.
func countCharge(endpoint string, cached bool, units int64, usd decimal.Decimal) {
	k := ChargeKind{Endpoint: endpoint, Cached: cached}
	counted.Lock()
	t := counted.charges[k]
	t.Charges++
	t.Units += units
	t.USD = t.USD.Add(usd)
	counted.charges[k] = t
	counted.Unlock()
}

// countRefusal counts a refusal of the money path as it is made.
func countRefusal(outcome string) {
	counted.Lock()
	counted.refusals[outcome]++
	counted.Unlock()
}

// countForgiven counts n answered calls forgiven for reason.
func countForgiven(reason string, n int) {
	counted.Lock()
	counted.forgiven[reason] += int64(n)
	counted.Unlock()
}
