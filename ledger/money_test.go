package ledger

import (
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
