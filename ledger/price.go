package ledger

import (
	"fmt"

	"github.com/shopspring/decimal"

	"chessd/domain"
)

// UnitPriceUSD is what one unit costs.
var UnitPriceUSD = decimal.New(1, -5) // $0.00001

// Price is a quote; the same numbers are charged.
type Price struct {
	Units       int64           // fresh analysis of every position
	USD         decimal.Decimal // Units × UnitPriceUSD
	CachedUnits int64           // what one position costs when served from the cache
	CachedUSD   decimal.Decimal
	PerPosition int64 // fresh units of one position
	Positions   int   // the call's positions
}

// Charged is what an answered call priced p costs: every position searched, or (cached)
// every position served without a search at the cached price.
func (p Price) Charged(cached bool) int64 {
	if cached {
		return p.CachedUnits * int64(p.Positions)
	}
	return p.Units
}

// Quote is the one pricing function: every quote of GET /price, every reservation and
// every charge use it. A new price component is a change here and in its tests.
//
// One position at depth d with m lines costs 10 × tier(d) × (m+1)/2 units, rounded up,
// where tier doubles every 4 plies past depth 10 (≤10: 1, 11–14: 2, 15–18: 4, 19–22: 8,
// 23–26: 16, 27–30: 32) because search time roughly doubles with it; each extra line
// adds half. A movetime makes the search stop at whichever limit comes first, so the
// price is the lower of the depth price and 5 units per started 250 ms (times the same
// line factor). A position served from the cache costs a tenth, at least 1 unit.
func Quote(c domain.Call) (Price, error) {
	if c.Depth < 1 || c.MultiPV < 1 || c.Positions < 1 || c.MoveTimeMS < 0 {
		return Price{}, fmt.Errorf("quote: invalid call %+v", c)
	}
	depthTier := int64(1) << ((max(0, c.Depth-10) + 3) / 4)
	units := ceilHalf(10 * depthTier * int64(c.MultiPV+1))
	if c.MoveTimeMS > 0 {
		slices := int64((c.MoveTimeMS + 249) / 250)
		units = min(units, ceilHalf(5*slices*int64(c.MultiPV+1)))
	}
	cached := max(1, (units+9)/10)
	total := units * int64(c.Positions)
	return Price{
		Units: total, USD: UnitsUSD(total), CachedUnits: cached, CachedUSD: UnitsUSD(cached), PerPosition: units,
		Positions: c.Positions,
	}, nil
}

// UnitsUSD is the price of n units. (ledger.USD names the currency of a posting.)
func UnitsUSD(units int64) decimal.Decimal { return UnitPriceUSD.Mul(decimal.NewFromInt(units)) }

func ceilHalf(v int64) int64 { return (v + 1) / 2 }
