package ledger

import (
	"math/rand/v2"
	"testing"

	"github.com/shopspring/decimal"
)

func TestChargeTransactionBalances(t *testing.T) {
	cases := []struct {
		units    int64
		usd      string
		postings int
	}{
		{1, "0.00001", 4},
		{1760, "0.0176", 4},
		{5, "0", 2}, // a free call moves units only
	}
	for _, tc := range cases {
		tr, err := ChargeTransaction("acct_1", "live", "key_1", tc.units, decimal.RequireFromString(tc.usd))
		if err != nil {
			t.Fatal(err)
		}
		ps := tr.Postings()
		if len(ps) != tc.postings || !Balanced(ps) {
			t.Fatalf("%+v: %d postings, balanced %v", tc, len(ps), Balanced(ps))
		}
		for _, p := range ps {
			if p.Book != "acct_1/live" {
				t.Fatalf("posting in book %s", p.Book)
			}
			if p.Account == KeyAccount("key_1") && !p.Credit.IsZero() {
				t.Fatal("the key's account is debited, never credited, by a charge")
			}
		}
	}
}

func TestNewTransactionRefuses(t *testing.T) {
	for name, m := range map[string]Move{
		"zero":            {From: "a", To: "b", Currency: Units, Amount: decimal.Zero},
		"negative":        {From: "a", To: "b", Currency: USD, Amount: decimal.RequireFromString("-0.01")},
		"fractional unit": {From: "a", To: "b", Currency: Units, Amount: decimal.RequireFromString("1.5")},
		"to itself":       {From: "a", To: "a", Currency: Units, Amount: decimal.NewFromInt(1)},
	} {
		if _, err := NewTransaction("b", m); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestBalancedDetectsTampering(t *testing.T) {
	tr, _ := ChargeTransaction("a", "live", "k", 10, decimal.RequireFromString("0.0001"))
	ps := tr.Postings()
	ps[0].Debit = ps[0].Debit.Add(decimal.NewFromInt(1))
	if Balanced(ps) {
		t.Fatal("an edited posting still balances")
	}
	ps = tr.Postings()
	ps[1].Debit = ps[1].Credit // both sides on one line
	if Balanced(ps) {
		t.Fatal("a line with debit and credit passes")
	}
}

func TestBalanced(t *testing.T) {
	d := decimal.RequireFromString
	line := func(c Currency, debit, credit string) Posting {
		return Posting{Book: "b", Account: "x", Currency: c, Debit: d(debit), Credit: d(credit)}
	}
	many := func(n int, last Posting) []Posting { // n lines of one unit each way, then last
		var ps []Posting
		for i := range n {
			if i%2 == 0 {
				ps = append(ps, line(Units, "1", "0"))
			} else {
				ps = append(ps, line(Units, "0", "1"))
			}
		}
		return append(ps, last)
	}
	for _, tc := range []struct {
		name string
		ps   []Posting
		want bool
	}{
		{"none", nil, true},
		{"one way", []Posting{line(USD, "1", "0"), line(USD, "0", "1")}, true},
		{"interleaved", []Posting{line(USD, "0.5", "0"), line(Units, "0", "2"), line(USD, "0", "0.25"), line(Units, "2", "0"), line(USD, "0", "0.25")}, true},
		{"scales differ", []Posting{line(USD, "0.10", "0"), line(USD, "0", "0.1")}, true},
		{"one currency off", []Posting{line(USD, "1", "0"), line(USD, "0", "1"), line(Units, "1", "0")}, false},
		{"across currencies", []Posting{line(USD, "1", "0"), line(Units, "0", "1")}, false},
		{"later line off", []Posting{line(Units, "1", "0"), line(USD, "1", "0"), line(Units, "0", "1"), line(USD, "0", "0.9999")}, false},
		{"negative", []Posting{line(USD, "-1", "0"), line(USD, "0", "-1")}, false},
		{"both sides", []Posting{line(USD, "1", "1")}, false},
		{"many, balanced", many(10, line(USD, "0", "0")), true},
		{"many, off", many(10, line(Units, "0", "1")), false},
		{"many, negative", many(10, line(Units, "-1", "0")), false},
	} {
		if got := Balanced(tc.ps); got != tc.want {
			t.Errorf("%s: Balanced = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestBalancedAgreesWithSums compares Balanced with summing every currency in a map, on
// random postings of up to eight lines (where it sums without one).
func TestBalancedAgreesWithSums(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	amounts := []string{"0", "1", "2", "0.5", "0.0001", "0.00010", "3"}
	for range 20_000 {
		ps := make([]Posting, rng.IntN(9))
		for i := range ps {
			amount := decimal.RequireFromString(amounts[rng.IntN(len(amounts))])
			ps[i] = Posting{Currency: []Currency{Units, USD}[rng.IntN(2)], Debit: decimal.Zero, Credit: decimal.Zero}
			if rng.IntN(2) == 0 {
				ps[i].Debit = amount
			} else {
				ps[i].Credit = amount
			}
		}
		if got, want := Balanced(ps), balancedByMap(ps); got != want {
			t.Fatalf("%+v: Balanced %v, summed %v", ps, got, want)
		}
	}
}
