package ledger_test

import (
	"context"
	"fmt"
	"testing"

	"chessd/commands"
	"chessd/domain"
	"chessd/ledger"
)

// BenchmarkMeterSettle is the settler's commit of a batch of answered calls (one key,
// the one-round-trip path once warm), reserved from memory and waited for with Flush:
// the database's work per group commit, as the service does it after each answer.
func BenchmarkMeterSettle(b *testing.B) {
	for _, calls := range []int{1, 64} {
		b.Run(fmt.Sprintf("calls=%d", calls), func(b *testing.B) {
			f := newFixture(b, nil)
			ctx := context.Background()
			// the pro plan's daily allowance: room for every call the benchmark makes
			if err := commands.New(f.store, []byte("meter-test-pepper-0123456789")).ChangePlan(ctx, f.account.ID(), domain.PlanPro, "bench"); err != nil {
				b.Fatal(err)
			}
			acct, err := commands.LoadAccount(ctx, f.pool, f.account.ID())
			if err != nil {
				b.Fatal(err)
			}
			f.account = acct
			m := f.meter(b, ledger.MeterConfig{Gather: -1, LeaseCalls: 4096})
			i := 0
			batch := func() {
				rs := make([]*ledger.Reservation, calls)
				for j := range rs {
					r, err := m.Reserve(ctx, f.evalCall(i))
					if err != nil {
						b.Fatal(err)
					}
					rs[j], i = r, i+1
				}
				for _, r := range rs {
					if err := r.Settle(answered()); err != nil {
						b.Fatal(err)
					}
				}
				if err := m.Flush(ctx); err != nil {
					b.Fatal(err)
				}
			}
			batch() // the lease and the cursor warm
			for b.Loop() {
				batch()
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*calls), "µs/call")
		})
	}
}
