package ledger

import (
	"testing"

	"github.com/shopspring/decimal"
)

// What is left never goes below 0 (a budget lowered under what was spent) and is nil
// without a budget.
func TestRemaining(t *testing.T) {
	i := func(v int64) *int64 { return &v }
	d := func(s string) *decimal.Decimal { v := decimal.RequireFromString(s); return &v }
	cases := []struct {
		name      string
		b         Balance
		units     *int64
		usd       string // "" for nil
		allowance int64
	}{
		{"no budget", Balance{SpentUnits: 5, HeldUnits: 3}, nil, "", 92},
		{"room", Balance{BudgetUnits: i(100), BudgetUSD: d("0.001"), SpentUnits: 10, SpentUSD: UnitsUSD(10),
			PeriodUnits: 10, PeriodUSD: UnitsUSD(10), HeldUnits: 20, HeldUSD: UnitsUSD(20)}, i(70), "0.000700", 70},
		{"overdrawn", Balance{BudgetUnits: i(100), BudgetUSD: d("0.0005"), SpentUnits: 90, SpentUSD: UnitsUSD(90),
			PeriodUnits: 90, PeriodUSD: UnitsUSD(90), HeldUnits: 20, HeldUSD: UnitsUSD(20)}, i(0), "0.000000", 0},
		// a budget by period caps the period's spend, not the key's life's
		{"a new period", Balance{BudgetUnits: i(100), BudgetUSD: d("0.001"), SpentUnits: 500, SpentUSD: UnitsUSD(500),
			PeriodUnits: 10, PeriodUSD: UnitsUSD(10), HeldUnits: 20, HeldUSD: UnitsUSD(20)}, i(70), "0.000700", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.b.RemainingUnits()
			if (got == nil) != (tc.units == nil) || got != nil && *got != *tc.units {
				t.Errorf("units %v, want %v", got, tc.units)
			}
			usd := tc.b.RemainingUSD()
			if (usd == nil) != (tc.usd == "") || usd != nil && usd.StringFixed(6) != tc.usd {
				t.Errorf("usd %v, want %q", usd, tc.usd)
			}
			day := AllowanceDay{Units: tc.b.SpentUnits, HeldUnits: tc.b.HeldUnits}
			if r := day.Remaining(100); r != tc.allowance {
				t.Errorf("allowance left %d, want %d", r, tc.allowance)
			}
		})
	}
}
