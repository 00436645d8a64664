package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"chessd/analysis"
	"chessd/domain"
)

// fieldsOfErr lists the fields a decode error names, in order.
func fieldsOfErr(t *testing.T, err error) []string {
	t.Helper()
	var de *domain.Error
	if !errors.As(err, &de) || de.Code != domain.CodeInvalid {
		t.Fatalf("error %v is not a 400-class *domain.Error", err)
	}
	var out []string
	for _, f := range de.Fields {
		out = append(out, f.Field)
	}
	return out
}

func TestDecodeReportsEveryField(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		body   string
		into   func() any
		fields []string
	}{
		{"three wrong types", `{"depth":"x","multipv":"y","fen":5}`, func() any { return &analysis.Request{} },
			[]string{"depth", "multipv", "fen"}},
		{"nested options", `{"fen":"x","options":{"hash_mb":"big","elo":true,"nope":1}}`, func() any { return &analysis.Request{} },
			[]string{"options.hash_mb", "options.elo", "options.nope"}},
		{"array elements", `{"fens":["ok",3,"\u0000"],"depth":1.5}`, func() any { return &batchRequest{} },
			[]string{"fens[1]", "fens[2]", "depth"}},
		{"null array elements", `{"fens":[null,"ok",null],"chess960":null}`, func() any { return &batchRequest{} },
			[]string{"fens[0]", "fens[2]", "chess960"}},
		// null is a value of no member of a body read into a struct (the document
		// allows it in PATCH bodies only, read as maps): not absent, not "" or 0
		{"null strings", `{"charge_ids":["chg_1"],"reason":null}`, func() any { return &disputeRequest{} }, []string{"reason"}},
		{"null key fields", `{"label":null,"budget_units":null,"scopes":null,"env":"test"}`, func() any { return &createKeyRequest{} },
			[]string{"label", "budget_units", "scopes"}},
		{"null eval fields", `{"fen":null,"depth":null,"options":{"elo":null,"show_wdl":true}}`, func() any { return &analysis.Request{} },
			[]string{"fen", "depth", "options.elo"}},
		{"null options", `{"fen":"x","options":null}`, func() any { return &analysis.Request{} }, []string{"options"}},
		{"null array", `{"fens":null,"depth":1}`, func() any { return &batchRequest{} }, []string{"fens"}},
		{"null in an array behind a pointer", `{"scopes":["eval",null]}`, func() any { return &createKeyRequest{} },
			[]string{"scopes[1]"}},
		{"unknown, and a bad duplicate", `{"email":"a@b.co","bogus":1,"email":"c\u0000@d.co"}`, func() any { return &signupRequest{} },
			[]string{"email", "bogus", "email"}},
		{"a field given twice", `{"fen":"x","depth":1,"depth":30}`, func() any { return &analysis.Request{} }, []string{"depth"}},
		// names match exactly, case and all, as the document's schemas have them: the
		// first three would take the one pass (goccy matches without regard to case),
		// the fourth folds as Unicode does (U+017F, long s, is s)
		{"names in capitals", `{"FEN":"x","DEPTH":3}`, func() any { return &analysis.Request{} }, []string{"FEN", "DEPTH"}},
		{"a name in capitals beside its own", `{"fen":"x","depth":1,"DEPTH":2}`, func() any { return &analysis.Request{} }, []string{"DEPTH"}},
		{"key fields in capitals", `{"LABEL":"x","Scopes":["eval"],"Budget_Units":5}`, func() any { return &createKeyRequest{} },
			[]string{"LABEL", "Scopes", "Budget_Units"}},
		{"a nested name folded", `{"fen":"x","options":{"\u017fhow_wdl":true,"Elo":1500}}`, func() any { return &analysis.Request{} },
			[]string{"options.\u017fhow_wdl", "options.Elo"}},
		{"the Kelvin sign", "{\"\u212aey\":1}", func() any { return &signupRequest{} }, []string{"\u212aey"}},
		{"twice in a nested object", `{"fen":"x","options":{"elo":1500,"elo":2000}}`, func() any { return &analysis.Request{} },
			[]string{"options.elo"}},
		{"twice in an array's object", `{"x":[{"a":1},{"a":1,"a":2}]}`, func() any { return &map[string]any{} }, []string{"x[1].a"}},
		{"NUL in every signup field", `{"email":"a\u0000@b.co","name":"\u0000","agent":"x\u0001","source":"\u007f"}`,
			func() any { return &signupRequest{} }, []string{"email", "name", "agent", "source"}},
		{"C1 control and newline in a label", `{"label":"a\u0085","scopes":["eval\n"]}`, func() any { return &createKeyRequest{} },
			[]string{"label", "scopes[0]"}},
		{"unpaired surrogates", `{"name":"\ud800","agent":"\udc00x","source":"\ud800\u0041"}`, func() any { return &signupRequest{} },
			[]string{"name", "agent", "source"}},
		{"invalid UTF-8", "{\"name\":\"\xff\",\"email\":\"a@b.co\"}", func() any { return &signupRequest{} }, []string{"name"}},
		{"PATCH body as a map", `{"label":"a\u0000","budget_units":null}`, func() any { return &map[string]json.RawMessage{} },
			[]string{"label"}},
		{"nested strings in a map", `{"x":{"a":[1,"\u0000",{"b":"\u0001"}]},"y":"ok"}`, func() any { return &map[string]any{} },
			[]string{"x.a[1]", "x.a[2].b"}},
		{"many bad strings, a short answer", `{"fens":[` + strings.Repeat(`"\u0000",`, 200) + `"x"]}`, func() any { return &batchRequest{} },
			func() []string {
				var out []string
				for i := range maxProblems {
					out = append(out, fmt.Sprintf("fens[%d]", i))
				}
				return out
			}()},
		{"PGN keeps newlines, not NUL", `{"pgn":"[Event \"x\"]\n1. e4\t*\r\n","fen":"a\nb"}`, func() any { return &analyzeRequest{} },
			[]string{"fen"}},
		{"PGN with NUL", `{"pgn":"[Event \"\u0000\"] 1. e4 *"}`, func() any { return &analyzeRequest{} }, []string{"pgn"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := fieldsOfErr(t, decodeBytes([]byte(tt.body), tt.into()))
			if !slices.Equal(got, tt.fields) {
				t.Fatalf("fields %v, want %v", got, tt.fields)
			}
		})
	}
}

// A PATCH body's names are taken as sent: two names differing in case are two
// members (the handler refuses the one it does not know), not one given twice.
func TestDecodeMapTakesNamesAsSent(t *testing.T) {
	t.Parallel()
	var raw map[string]json.RawMessage
	if err := decodeBytes([]byte(`{"label":"a","Label":"b","budget_UNITS":1}`), &raw); err != nil {
		t.Fatal(err)
	}
	if len(raw) != 3 || string(raw["label"]) != `"a"` || string(raw["Label"]) != `"b"` || string(raw["budget_UNITS"]) != "1" {
		t.Fatalf("read %q", raw)
	}
}

// The one pass (goccy) matches a member to a field without regard to case; it is
// taken only for names without a capital letter (scanNames), which match nothing but
// the field of their own name as long as every field's name is in small letters.
func TestRequestFieldNamesAreSmall(t *testing.T) {
	t.Parallel()
	var walk func(t *testing.T, typ reflect.Type)
	walk = func(t *testing.T, typ reflect.Type) {
		for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice || typ.Kind() == reflect.Map {
			typ = typ.Elem()
		}
		if typ.Kind() != reflect.Struct {
			return
		}
		for name, f := range fieldsOf(typ) {
			if strings.ToLower(name) != name {
				t.Errorf("%s's field %q has a capital letter", typ, name)
			}
			walk(t, typ.Field(f.index).Type)
		}
	}
	for name, mk := range requestTypes {
		t.Run(name, func(t *testing.T) { walk(t, reflect.TypeOf(mk())) })
	}
}

// A PATCH body is read as a map (an absent member and a null one differ): a member
// whose strings break the text rules is named and left out, and the others are still
// read, so that the handler names their problems in the same refusal.
func TestDecodeMapKeepsTheOtherMembers(t *testing.T) {
	t.Parallel()
	var raw map[string]json.RawMessage
	err := decodeBytes([]byte(`{"label":"a\u0000","budget_units":null,"scopes":["x"],"budget_period":"\u0001"}`), &raw)
	if got := fieldsOfErr(t, err); !slices.Equal(got, []string{"label", "budget_period"}) {
		t.Fatalf("fields %v", got)
	}
	if _, ok := raw["label"]; ok || string(raw["budget_units"]) != "null" || string(raw["scopes"]) != `["x"]` || len(raw) != 2 {
		t.Fatalf("read %q", raw)
	}
}

func TestDecodeAccepts(t *testing.T) {
	t.Parallel()
	var req analysis.Request
	body := `{"fen":"8/8/8/8/8/8/8/K6k w - - 0 1","depth":3,"options":{"show_wdl":true,"hash_mb":16},"engine":"Ré\u00e9\ud83d\ude00"}`
	if err := decodeBytes([]byte(body), &req); err != nil {
		t.Fatal(err)
	}
	if *req.Depth != 3 || !*req.Options.ShowWDL || *req.Options.HashMB != 16 || *req.Engine != "Réé😀" {
		t.Fatalf("decoded %+v", req)
	}
	var pgn analyzeRequest
	if err := decodeBytes([]byte(`{"pgn":"1. e4\n*"}`), &pgn); err != nil || *pgn.PGN != "1. e4\n*" {
		t.Fatalf("%v %+v", err, pgn)
	}
	var key createKeyRequest
	if err := decodeBytes([]byte(`{"label":"ci \"main\" \\ /","budget_usd":"1.5"}`), &key); err != nil ||
		key.Label != `ci "main" \ /` || key.BudgetUSD.decimalOf().String() != "1.5" || key.Scopes != nil {
		t.Fatalf("%v %+v", err, key)
	}
}

func TestDecodeRefusesNonObjects(t *testing.T) {
	t.Parallel()
	for _, body := range []string{`[]`, `null`, `"x"`, `{"a":1} {}`, `{"a":`, `{"a":1}}`} {
		var req signupRequest
		err := decodeBytes([]byte(body), &req)
		if domain.ErrorCode(err) != domain.CodeInvalid || strings.Contains(err.Error(), "panic") {
			t.Errorf("%q: %v", body, err)
		}
	}
}

// memberTwice on the bodies that made it quadratic: 1 MiB of distinct names in one
// object (a name given twice at its end, escaped),
// and an object nested thousands deep with long names (the name given twice at the
// bottom). Each is found, with its path; the deep one allocates in proportion to the
// body, not to its depth times its size (before: gigabytes).
func TestMemberTwiceOnWideAndDeepBodies(t *testing.T) {
	var wide strings.Builder
	wide.WriteString(`{"k0":0`)
	for i := 1; wide.Len() < 1<<20; i++ {
		fmt.Fprintf(&wide, `,"k%d":0`, i)
	}
	wide.WriteString(`,"k\u0030":1}`) // "k0" again, escaped
	name := strings.Repeat("n", 100)
	const depth = 9000
	var deep strings.Builder
	for range depth {
		deep.WriteString(`{"` + name + `":`)
	}
	deep.WriteString(`{"x":1,"X":2,"x":3}`)
	deep.WriteString(strings.Repeat("}", depth))
	for _, c := range []struct {
		name, body, path string
		maxAlloc         uint64
	}{
		{"wide", wide.String(), "k0", 64 << 20},
		{"deep", deep.String(), "." + name, 64 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !json.Valid([]byte(c.body)) {
				t.Fatal("not JSON")
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			path, twice := memberTwice([]byte(c.body))
			runtime.ReadMemStats(&after)
			if !twice || !strings.HasPrefix(path, strings.TrimPrefix(c.path, ".")) {
				t.Fatalf("found %v at %.80q", twice, path)
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > c.maxAlloc {
				t.Fatalf("%d MiB allocated for a %d KiB body", got>>20, len(c.body)>>10)
			}
		})
	}
}

// BenchmarkDecodeBytes is the decoder on the bodies of the commonest calls: the one
// pass (goccy) with its checks, which a change to the checks must not slow.
func BenchmarkDecodeBytes(b *testing.B) {
	fens := make([]string, 200)
	for i := range fens {
		fens[i] = `"rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"`
	}
	for _, bc := range []struct {
		name, body string
		into       func() any
	}{
		{"eval", `{"fen":"rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1","depth":8,"multipv":2,"options":{"show_wdl":true}}`,
			func() any { return &analysis.Request{} }},
		{"batch", `{"fens":[` + strings.Join(fens, ",") + `],"depth":10,"engine":"sf-17.1"}`, func() any { return &batchRequest{} }},
		{"createKey", `{"label":"ci","scopes":["eval","jobs"],"budget_units":5000,"budget_period":"month"}`,
			func() any { return &createKeyRequest{} }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			body := []byte(bc.body)
			for b.Loop() {
				if err := decodeBytes(body, bc.into()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
