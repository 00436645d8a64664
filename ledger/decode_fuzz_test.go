package ledger

import (
	"bytes"
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"
	"unicode/utf8"

	gojson "github.com/goccy/go-json"
	"github.com/shopspring/decimal"

	"chessd/domain"
)

// Events decode (domain.Decode, goccy/go-json) to what encoding/json reads: every
// registered type (the money events' amounts, times and postings
// among them), and no input panics.
func FuzzDecodeEvents(f *testing.F) {
	fresh := addEventSeeds(f)
	f.Fuzz(func(t *testing.T, name string, payload []byte) {
		got, err := domain.Decode(name, 1, payload)
		mk, ok := fresh[name]
		if !ok {
			if err == nil {
				t.Fatalf("unknown event type %q decoded", name)
			}
			return
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

// goccy/go-json writes every registered event as the JSON encoding/json writes: the
// same value, numbers digit for digit (eventstore writes the log's payloads with it;
// it escapes \b and \f as \u0008 and \u000c where encoding/json writes them short).
func FuzzEncodeEvents(f *testing.F) {
	fresh := addEventSeeds(f)
	f.Fuzz(func(t *testing.T, name string, payload []byte) {
		mk, ok := fresh[name]
		if !ok {
			return
		}
		v := mk()
		if json.Unmarshal(payload, v) != nil {
			return
		}
		want, werr := json.Marshal(v)
		got, gerr := gojson.Marshal(v)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("%s: encoding/json: %v; goccy: %v", name, werr, gerr)
		}
		if werr != nil {
			return
		}
		var a, b any
		for _, d := range []struct {
			body []byte
			v    *any
		}{{got, &a}, {want, &b}} {
			dec := json.NewDecoder(bytes.NewReader(d.body))
			dec.UseNumber()
			if err := dec.Decode(d.v); err != nil {
				t.Fatalf("%s: %s: %v", name, d.body, err)
			}
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: goccy wrote\n%s\nencoding/json\n%s", name, got, want)
		}
	})
}

// addEventSeeds seeds f with every registered event type, the ledger's with amounts,
// times and postings, and returns the registry.
func addEventSeeds(f *testing.F) map[string]func() domain.Event {
	fresh := domain.Registered() // the ledger's events are registered by now
	for _, name := range slices.Sorted(maps.Keys(fresh)) {
		seed, err := json.Marshal(fresh[name]())
		if err != nil {
			f.Fatal(err)
		}
		f.Add(name, seed)
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
		"ChargesSettled": &ChargesSettled{AccountID: "acc_1", KeyID: "key_1", Env: "live", Units: 4, USD: usd.Add(usd), Postings: postings,
			Lines: []SettledCharge{
				{RequestID: "req_1", Day: "2026-11-26", ChargedAt: at, Endpoint: "eval", Params: Params{Depth: 10, MultiPV: 2, Positions: 1},
					Engine: "sf-17.1", Path: "native", Cached: true, Units: 2, USD: usd, IdempotencyKey: "idem-1"},
				{RequestID: "req_2", Day: "2026-11-26", ChargedAt: at, Endpoint: "bestmove", Params: Params{Depth: 12, MultiPV: 1, Positions: 1},
					Engine: "sf-15.1", Path: "native", Units: 2, USD: usd},
			}},
		"UnitsCredited": &UnitsCredited{CreditID: "crd_1", ChargeID: "chg_1_0", ChargePosition: 42, ChargeLine: 1, AccountID: "acc_1", KeyID: "key_1",
			Env: "live", Day: "2026-11-26", CreditedAt: at, Units: 2, USD: usd, Reason: "wrong\nanswer", Actor: "ops", Postings: postings},
	} {
		seed, err := json.Marshal(ev)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(name, seed)
	}
	f.Add("UnitsCharged", []byte(`{"usd":"1e-5","units":2,"postings":[{"debit":"0.1","credit":0}]}`))
	f.Add("JobSubmitted", []byte(`{"job_id":"job_1","positions":[{"index":0,"fen":"8/8/8/4k3/8/8/4P3/4K3 w - - 0 1"}],"spec":{"depth":12}}`))
	return fresh
}
