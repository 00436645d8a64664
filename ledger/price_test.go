package ledger

import (
	"testing"

	"chessd/domain"
)

// priced describes a call to price, its arguments in domain.Call's field order.
func priced(ep domain.Endpoint, depth, multiPV, moveTimeMS, positions int) domain.Call {
	return domain.Call{Endpoint: ep, Depth: depth, MultiPV: multiPV, MoveTimeMS: moveTimeMS, Positions: positions}
}

func TestQuote(t *testing.T) {
	cases := []struct {
		name                  string
		call                  domain.Call
		units, cached, perPos int64
		usd                   string
	}{
		{"shallow", priced(domain.EndpointEval, 8, 1, 0, 1), 10, 1, 10, "0.000100"},
		{"default depth 14", priced(domain.EndpointEval, 14, 1, 0, 1), 20, 2, 20, "0.000200"},
		{"depth 15 doubles", priced(domain.EndpointEval, 15, 1, 0, 1), 40, 4, 40, "0.000400"},
		{"depth 30", priced(domain.EndpointEval, 30, 1, 0, 1), 320, 32, 320, "0.003200"},
		{"three lines", priced(domain.EndpointEval, 14, 3, 0, 1), 40, 4, 40, "0.000400"},
		{"ten lines deep", priced(domain.EndpointBestMove, 30, 10, 0, 1), 1760, 176, 1760, "0.017600"},
		{"short movetime caps", priced(domain.EndpointEval, 30, 1, 100, 1), 5, 1, 5, "0.000050"},
		{"long movetime does not raise", priced(domain.EndpointEval, 14, 1, 60000, 1), 20, 2, 20, "0.000200"},
		{"batch of 50", priced(domain.EndpointBatch, 14, 3, 0, 50), 2000, 4, 40, "0.020000"},
		{"analyze 40 plies", priced(domain.EndpointAnalyze, 10, 1, 0, 40), 400, 1, 10, "0.004000"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Quote(tc.call)
			if err != nil {
				t.Fatal(err)
			}
			if p.Units != tc.units || p.CachedUnits != tc.cached || p.PerPosition != tc.perPos || p.USD.StringFixed(6) != tc.usd {
				t.Fatalf("got units %d cached %d per %d usd %s", p.Units, p.CachedUnits, p.PerPosition, p.USD.StringFixed(6))
			}
			if p.CachedUnits >= p.PerPosition && p.PerPosition > 1 {
				t.Fatal("a cached result must cost less than a fresh one")
			}
			if n := int64(tc.call.Positions); p.Charged(false) != tc.units || p.Charged(true) != tc.cached*n {
				t.Fatalf("charged fresh %d, cached %d; want %d and %d", p.Charged(false), p.Charged(true), tc.units, tc.cached*n)
			}
		})
	}
	for _, bad := range []domain.Call{priced(domain.EndpointEval, 0, 1, 0, 1), priced(domain.EndpointEval, 10, 0, 0, 1), priced(domain.EndpointEval, 10, 1, -1, 1), priced(domain.EndpointBatch, 10, 1, 0, 0)} {
		if _, err := Quote(bad); err == nil {
			t.Fatalf("Quote(%+v) accepted", bad)
		}
	}
}

// Price never falls as a search gets harder.
func TestQuoteMonotonic(t *testing.T) {
	for m := 1; m <= 10; m++ {
		prev := int64(0)
		for d := 1; d <= 30; d++ {
			p, _ := Quote(priced(domain.EndpointEval, d, m, 0, 1))
			if p.Units < prev {
				t.Fatalf("depth %d multipv %d costs %d, less than depth %d", d, m, p.Units, d-1)
			}
			prev = p.Units
		}
	}
}
