package httpapi

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	gojson "github.com/goccy/go-json"

	"chessd/analysis"
)

// A costed call's answer is written by goccy/go-json, which must write the JSON
// encoding/json writes: the same value, numbers digit for digit (it escapes \b and \f
// as \u0008 and \u000c where encoding/json writes them short; nothing else differs).
func FuzzAnswersEncodeAsEncodingJSON(f *testing.F) {
	best, san := "e2e4", "e4"
	res := &analysis.Result{FEN: "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1",
		Eval: analysis.Score{Type: "cp", Value: 31, Bound: "lower"}, BestMove: &best, BestMoveSAN: &san, Ponder: "e7e5",
		PVs: []analysis.PV{{Rank: 1, Eval: analysis.Score{Type: "mate", Value: -3}, Moves: []string{"e2e4", "e7e5"},
			MovesSAN: []string{"e4", "e5"}, Depth: 12, SelDepth: 17, Nodes: 90210, WDL: &analysis.WDL{W: 310, D: 650, L: 40}}},
		Depth: 12, SelDepth: 17, Nodes: 90210, TimeMS: 41, Engine: "sf-17.1", EngineName: "Stockfish 17.1 <&>", Path: "native"}
	for _, v := range []any{
		evalAnswer{Result: res, cost: newCost(true, 3)},
		evalAnswer{Result: &analysis.Result{PVs: []analysis.PV{}}, cost: newCost(false, 1)},
		bestMoveAnswer{BestMove: &best, BestMoveSAN: &san, Eval: res.Eval, Depth: 12, Engine: "sf-17.1", cost: newCost(true, 2)},
	} {
		seed, err := json.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(seed, false)
		f.Add(seed, true)
	}
	f.Add([]byte(`{"fen":"\u2028<script>","pvs":null,"eval":{"type":"cp","value":-0},"cost_usd":"\ud800"}`), false)
	f.Fuzz(func(t *testing.T, body []byte, bestMove bool) {
		var v any
		if bestMove {
			a := bestMoveAnswer{}
			if json.Unmarshal(body, &a) != nil {
				return
			}
			v = a
		} else {
			a := evalAnswer{Result: &analysis.Result{}}
			if json.Unmarshal(body, &a) != nil {
				return
			}
			v = a
		}
		want, werr := json.Marshal(v)
		got, gerr := gojson.Marshal(v)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("encoding/json: %v; goccy: %v", werr, gerr)
		}
		if werr == nil && !sameJSON(t, got, want) {
			t.Fatalf("goccy wrote\n%s\nencoding/json\n%s", got, want)
		}
	})
}

// sameJSON says whether a and b hold the same JSON value, numbers compared as written.
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	for _, d := range []struct {
		body []byte
		v    *any
	}{{a, &va}, {b, &vb}} {
		dec := json.NewDecoder(bytes.NewReader(d.body))
		dec.UseNumber()
		if err := dec.Decode(d.v); err != nil {
			t.Fatalf("%s: %v", d.body, err)
		}
	}
	return reflect.DeepEqual(va, vb)
}
