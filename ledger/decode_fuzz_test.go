package ledger

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/shopspring/decimal"

	"chessd/domain"
)

// The money events decode (domain.Decode, goccy/go-json) to what encoding/json, which
// wrote them, reads: amounts, times and postings alike; no input panics.
func FuzzDecodeMoneyEvents(f *testing.F) {
	fresh := map[string]func() domain.Event{
		"UnitsCharged":    func() domain.Event { return &UnitsCharged{} },
		"UnitsCredited":   func() domain.Event { return &UnitsCredited{} },
		"DisputeOpened":   func() domain.Event { return &DisputeOpened{} },
		"DisputeAccepted": func() domain.Event { return &DisputeWasAccepted{} },
		"DisputeRejected": func() domain.Event { return &DisputeWasRejected{} },
	}
	usd := decimal.RequireFromString("0.000020")
	postings := []Posting{
		{Book: "units", Account: "key:key_1:held", Currency: "UNIT", Debit: decimal.NewFromInt(2), Credit: decimal.Zero},
		{Book: "units", Account: "key:key_1:spent", Currency: "UNIT", Debit: decimal.Zero, Credit: decimal.NewFromInt(2)},
		{Book: "usd", Account: "account:acc_1:receivable", Currency: "USD", Debit: usd, Credit: decimal.Zero},
		{Book: "usd", Account: "revenue", Currency: "USD", Debit: decimal.Zero, Credit: usd},
	}
	at := time.Date(2026, 11, 26, 20, 0, 0, 123456789, time.UTC)
	for name, ev := range map[string]domain.Event{
		"UnitsCharged": &UnitsCharged{ChargeID: "chg_1", RequestID: "req_1", AccountID: "acc_1", KeyID: "key_1", Env: "live",
			Day: "2026-11-26", ChargedAt: at, Endpoint: "eval", Params: Params{Depth: 10, MultiPV: 2, Positions: 1, FEN: "8/8/8/4k3/8/8/4P3/4K3 w - - 0 1"},
			Engine: "sf-17.1", Path: "native", Cached: true, Units: 2, USD: usd, Postings: postings},
		"UnitsCredited": &UnitsCredited{CreditID: "crd_1", ChargeID: "chg_1", ChargePosition: 42, AccountID: "acc_1", KeyID: "key_1",
			Env: "live", Day: "2026-11-26", CreditedAt: at, Units: 2, USD: usd, Reason: "wrong\nanswer", Actor: "ops", Postings: postings},
		"DisputeOpened": &DisputeOpened{},
	} {
		seed, err := json.Marshal(ev)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(name, seed)
	}
	f.Add("UnitsCharged", []byte(`{"usd":"1e-5","units":2,"postings":[{"debit":"0.1","credit":0}]}`))
	f.Fuzz(func(t *testing.T, name string, payload []byte) {
		got, err := domain.Decode(name, 1, payload)
		mk, ok := fresh[name]
		if !ok {
			return // another package's event, or none: FuzzDecode in domain
		}
		want := mk()
		// encoding/json never writes invalid UTF-8 (it writes U+FFFD), nor what it cannot read
		if !utf8.Valid(payload) || json.Unmarshal(payload, want) != nil {
			return
		}
		if err != nil {
			t.Fatalf("%s: encoding/json reads %q, Decode fails: %v", name, payload, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s %q: Decode reads %+v, encoding/json %+v", name, payload, got, want)
		}
	})
}
