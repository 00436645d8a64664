package domain

import (
	"encoding/json"
	"reflect"
	"sort"
	"testing"
	"unicode/utf8"
)

// Decode reads payloads with goccy/go-json, the events were written with
// encoding/json: whatever encoding/json reads, Decode reads to the same value, and no
// input makes it panic.
func FuzzDecode(f *testing.F) {
	names := make([]string, 0, len(decoders))
	for name := range decoders {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		seed, err := json.Marshal(decoders[name]())
		if err != nil {
			f.Fatal(err)
		}
		f.Add(name, seed)
	}
	f.Add("JobSubmitted", []byte(`{"job_id":"job_1","positions":[{"index":0,"fen":"8/8/8/4k3/8/8/4P3/4K3 w - - 0 1"}],"spec":{"depth":12}}`))
	f.Add("KeyUpdated", []byte(`{"key_id":"key_1","scopes":["eval","batch"],"budget":{"units":"12.50"},"at":"2026-11-26T20:00:00.123456789Z"}`))
	f.Fuzz(func(t *testing.T, name string, payload []byte) {
		got, err := Decode(name, 1, payload)
		mk, known := decoders[name]
		if !known {
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
