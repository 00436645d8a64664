package httpapi_test

import (
	"slices"
	"strings"
	"testing"
)

// fieldsNamed is the set of fields a problem's errors name, sorted.
func fieldsNamed(t *testing.T, r response) []string {
	t.Helper()
	errs, _ := r.Body["errors"].([]any)
	var out []string
	for _, e := range errs {
		m, _ := e.(map[string]any)
		f, _ := m["field"].(string)
		out = append(out, f)
	}
	slices.Sort(out)
	return out
}

// wantFields checks that r is a refusal with status and next naming exactly fields.
func wantFields(t *testing.T, r response, status int, next string, fields ...string) {
	t.Helper()
	wantProblem(t, r, status, next)
	slices.Sort(fields)
	if got := fieldsNamed(t, r); !slices.Equal(got, fields) {
		t.Fatalf("errors name %v, want %v: %s", got, fields, r.Raw)
	}
}

// TestEvalNamesEveryBadField: a 400 from /eval and /bestmove names every bad field at
// once (docs/API.md), the FEN and unknown fields included.
func TestEvalNamesEveryBadField(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("every-field@example.com")
	fen := `"fen":"` + startFEN + `"`
	cases := []struct {
		name, body string
		fields     []string
	}{
		{"bad fen, multipv ok, unknown engine", `{"fen":"bad","multipv":2,"engine":"nope"}`, []string{"fen", "engine"}},
		{"bad fen, depth 31", `{"fen":"bad","depth":31}`, []string{"fen", "depth"}},
		{"illegal fen, bad multipv and path", `{"fen":"4k3/8/8/8/8/8/4R3/4K3 w - - 0 1","multipv":0,"path":"gpu"}`, []string{"fen", "multipv", "path"}},
		{"bad fen, bad option", `{"fen":"bad","options":{"elo":100}}`, []string{"fen", "options.elo"}},
		{"missing fen, bad depth", `{"depth":0}`, []string{"fen", "depth"}},
		{"unknown option with bad fields", `{"fen":"bad","depth":31,"multipv":0,"movetime_ms":1,"options":{"elo":100,"foo":1}}`,
			[]string{"fen", "depth", "multipv", "movetime_ms", "options.elo", "options.foo"}},
		{"unknown field with bad fields", `{` + fen + `,"depth":31,"ponder":true}`, []string{"depth", "ponder"}},
		{"wrong type with bad fields", `{"fen":"bad","depth":"14","multipv":11}`, []string{"fen", "depth", "multipv"}},
		{"wrong-typed fen with bad depth", `{"fen":5,"depth":31}`, []string{"fen", "depth"}},
		{"wrong-typed option with bad option", `{` + fen + `,"options":{"limit_strength":"no","elo":100}}`, []string{"options.limit_strength", "options.elo"}},
		{"depth given twice with bad multipv", `{` + fen + `,"depth":5,"depth":31,"multipv":0}`, []string{"depth", "multipv"}},
		// names are matched exactly, as the document's schemas have them: not in
		// another case, nor folded as Unicode folds them (U+017F, long s, is s)
		{"names in capitals", `{"FEN":"` + startFEN + `","DEPTH":3}`, []string{"FEN", "DEPTH", "fen"}},
		{"a name in capitals beside its own", `{` + fen + `,"depth":5,"Depth":6}`, []string{"Depth"}},
		{"a folded option name", `{` + fen + `,"options":{"\u017fhow_wdl":true,"ELO":1500}}`, []string{"options.\u017fhow_wdl", "options.ELO"}},
	}
	for _, tc := range cases {
		for _, path := range []string{"/v1/eval", "/v1/bestmove"} {
			t.Run(tc.name+" "+path, func(t *testing.T) {
				wantFields(t, e.do("POST", path, key, tc.body), 400, "fix_request", tc.fields...)
			})
		}
	}
	t.Run("keyless", func(t *testing.T) {
		wantFields(t, e.do("POST", "/v1/eval", "", `{"fen":"bad","depth":31,"engine":"nope"}`), 400, "fix_request", "fen", "depth", "engine")
	})
	t.Run("a valid body is still answered", func(t *testing.T) {
		if r := e.do("POST", "/v1/eval", key, `{`+fen+`,"depth":6,"options":{"elo":1500}}`); r.Status != 200 {
			t.Fatalf("%d %s", r.Status, r.Raw)
		}
	})
}

// TestPlanCapsNameEveryField: a keyed call above several of its plan's caps is told of
// each in one 402, as a keyless one is.
func TestPlanCapsNameEveryField(t *testing.T) {
	e := newEnv(t)
	free, _ := e.signup("caps-every@example.com")
	body := `{"fen":"` + startFEN + `","depth":21,"multipv":4,"movetime_ms":20000}`
	r := e.do("POST", "/v1/eval", free, body)
	wantFields(t, r, 402, "upgrade", "depth", "multipv", "movetime_ms")
	for _, want := range []string{`"field":"depth","reason":"above the free plan's cap of 20","max":20`,
		`"field":"multipv","reason":"above the free plan's cap of 3","max":3`,
		`"field":"movetime_ms","reason":"above the free plan's cap of 10000","max":10000`} {
		if !strings.Contains(r.Raw, want) {
			t.Errorf("no %s in %s", want, r.Raw)
		}
	}
	wantFields(t, e.do("POST", "/v1/bestmove", free, `{"fen":"`+startFEN+`","depth":20,"multipv":4}`), 402, "upgrade", "multipv")
	wantFields(t, e.do("POST", "/v1/eval", "", `{"fen":"`+startFEN+`","depth":21,"multipv":4}`), 402, "sign_up", "depth", "multipv")
}

// TestKeysNameEveryBadField: POST /keys and PATCH /keys/{id} name every bad field at
// once, the budgets and the label included.
func TestKeysNameEveryBadField(t *testing.T) {
	e := newEnv(t)
	key, keyID := e.signup("keys-every@example.com")
	long := strings.Repeat("x", 101)
	create := []struct {
		name   string
		body   string
		fields []string
	}{
		{"budgets and period", `{"scopes":["eval"],"budget_usd":"1.0000001","budget_units":-1,"budget_period":"week"}`,
			[]string{"budget_usd", "budget_units", "budget_period"}},
		{"env, scopes and budgets", `{"env":"prod","scopes":["bogus"],"budget_units":-1,"label":"` + long + `"}`,
			[]string{"env", "scopes", "budget_units", "label"}},
		{"empty scopes and budget", `{"scopes":[],"budget_usd":"-1"}`, []string{"scopes", "budget_usd"}},
		{"wrong-typed label and budget", `{"label":5,"budget_usd":"1.0000001"}`, []string{"label", "budget_usd"}},
		{"unknown field and budget", `{"colour":"red","budget_units":-1}`, []string{"colour", "budget_units"}},
		{"null scope and budget", `{"scopes":["eval",null],"budget_units":-1}`, []string{"scopes[1]", "budget_units"}},
		{"names in capitals", `{"LABEL":"x","Scopes":["eval"],"Budget_Units":5}`, []string{"LABEL", "Scopes", "Budget_Units"}},
	}
	for _, tc := range create {
		t.Run("POST "+tc.name, func(t *testing.T) {
			wantFields(t, e.do("POST", "/v1/keys", key, tc.body), 400, "fix_request", tc.fields...)
		})
	}
	patch := []struct {
		name   string
		body   string
		fields []string
	}{
		{"scopes, budget and label", `{"scopes":["bogus"],"budget_units":-5,"label":"` + long + `"}`,
			[]string{"scopes", "budget_units", "label"}},
		{"wrong-typed label and budget", `{"label":5,"budget_usd":"1.0000001"}`, []string{"label", "budget_usd"}},
		{"period and budgets", `{"budget_period":"week","budget_usd":"-1","budget_units":-1}`,
			[]string{"budget_period", "budget_usd", "budget_units"}},
		{"unknown field and label", `{"colour":"red","label":"` + long + `"}`, []string{"colour", "label"}},
		// a string that breaks the text rules does not hide the other fields' problems
		{"NUL in the label with bad fields", `{"label":"ci\u0000","budget_units":"x","colour":"red","scopes":"eval"}`,
			[]string{"label", "budget_units", "colour", "scopes"}},
		{"invalid UTF-8 in the label with bad fields", "{\"label\":\"\xff\",\"budget_period\":\"week\",\"budget_usd\":\"-1\"}",
			[]string{"label", "budget_period", "budget_usd"}},
		{"control characters in two fields", `{"label":"\u001b[2J","budget_period":"day\u0000","scopes":["bogus"]}`,
			[]string{"label", "budget_period", "scopes"}},
		{"label twice, once with a NUL, and a bad budget", `{"label":"ok","label":"x\u0001","budget_units":-1}`,
			[]string{"label", "label", "budget_units"}},
		{"a name in capitals beside its own", `{"label":"ok","Label":"x","BUDGET_UNITS":null}`, []string{"Label", "BUDGET_UNITS"}},
		// a scope of the wrong type is named by its index, as on POST, and not as unknown
		{"wrong-typed scopes and budget", `{"scopes":["eval",5,null,["jobs"]],"budget_units":-1}`,
			[]string{"scopes[1]", "scopes[2]", "scopes[3]", "budget_units"}},
	}
	for _, tc := range patch {
		t.Run("PATCH "+tc.name, func(t *testing.T) {
			wantFields(t, e.do("PATCH", "/v1/keys/"+keyID, key, tc.body), 400, "fix_request", tc.fields...)
		})
	}
	t.Run("PATCH names problems in one order", func(t *testing.T) {
		// the decoder's (the text rules) first, then the fields in the documentation's
		// order, then other names, sorted: the same answer to the same body every time
		for _, tc := range []struct {
			path, body string
			fields     []string
		}{
			{"/v1/keys/" + keyID, `{"zone":1,"budget_period":"week","colour":"red","budget_units":"x","scopes":"eval","label":5}`,
				[]string{"label", "scopes", "budget_units", "budget_period", "colour", "zone"}},
			{"/v1/keys/" + keyID, `{"colour":"red","budget_period":"week","budget_units":"x","label":"a\u0000"}`,
				[]string{"label", "budget_units", "budget_period", "colour"}},
			{"/v1/me", `{"zone":1,"budget_period":"week","budget_usd":true,"colour":"red","budget_units":"x","timezone":"Mars/X"}`,
				[]string{"timezone", "budget_units", "budget_usd", "budget_period", "colour", "zone"}},
		} {
			for range 10 {
				if got := problemFields(t, e.do("PATCH", tc.path, key, tc.body)); !slices.Equal(got, tc.fields) {
					t.Fatalf("%s %s: fields %v, want %v", tc.path, tc.body, got, tc.fields)
				}
			}
		}
	})
	t.Run("valid bodies are still taken", func(t *testing.T) {
		if r := e.do("POST", "/v1/keys", key, `{"scopes":["eval"],"budget_usd":"1.000001","budget_units":1,"budget_period":"day","label":"ok"}`); r.Status != 201 {
			t.Fatalf("create: %d %s", r.Status, r.Raw)
		}
		if r := e.do("PATCH", "/v1/keys/"+keyID, key, `{"label":"fine","budget_units":5}`); r.Status != 200 {
			t.Fatalf("patch: %d %s", r.Status, r.Raw)
		}
	})
}

// TestBodiesNameEveryBadField: the endpoints beyond /eval and /keys name every bad
// field of a body in one 400 too: the decoder's (an unknown field, a wrong type) with
// those of the fields it could read, which the endpoint checks itself. A refused job
// holds nothing and starts nothing.
func TestBodiesNameEveryBadField(t *testing.T) {
	e := newEnv(t)
	key, keyID := e.signupProID("bodies-every@example.com")
	long := strings.Repeat("c", 65)
	const fen960 = "bqnb1rkr/pp3ppp/3ppn2/2p5/5P2/P2P4/NPP1P1PP/BQ1BNRKR w HFhf - 2 9" // Shredder-FEN: Chess960 only
	cases := []struct {
		method, path, body string
		fields             []string
	}{
		{"POST", "/v1/batch", `{"fens":["bad"],"depth":99,"bogus":1}`, []string{"fens[0]", "depth", "bogus"}},
		{"POST", "/v1/batch", `{"fens":["bad"],"depth":"x","multipv":9}`, []string{"fens[0]", "depth", "multipv"}},
		{"POST", "/v1/batch", `{"fens":["` + startFEN + `",5],"engine":"nope"}`, []string{"fens[1]", "engine"}},
		{"POST", "/v1/batch", `{"fens":["bad",5],"multipv":0}`, []string{"fens[0]", "fens[1]", "multipv"}},
		{"POST", "/v1/batch", `{"fens":[],"bogus":1}`, []string{"fens", "bogus"}},
		{"POST", "/v1/batch", `{"bogus":1}`, []string{"bogus", "fens"}},
		{"POST", "/v1/analyze", `{"fen":"bad","depth":99,"bogus":1}`, []string{"fen", "depth", "bogus"}},
		{"POST", "/v1/analyze", `{"pgn":"1. e4 e4","depth":"x","multipv":9}`, []string{"pgn", "depth", "multipv"}},
		{"POST", "/v1/analyze", `{"pgn":5,"fen":"bad","path":"gpu"}`, []string{"pgn", "fen", "path"}},
		{"POST", "/v1/signup", `{"email":"x","name":5,"bogus":1}`, []string{"email", "name", "bogus"}},
		{"POST", "/v1/signup", `{"agent":5}`, []string{"agent", "email"}},
		{"PATCH", "/v1/me", `{"timezone":"Mars/X","budget_units":-1,"bogus":1}`, []string{"timezone", "budget_units", "bogus"}},
		{"PATCH", "/v1/me", `{"timezone":"Mars/X","budget_usd":"-1"}`, []string{"timezone", "budget_usd"}},
		// a string that breaks the text rules does not hide the other fields' problems
		{"PATCH", "/v1/me", `{"timezone":"Europe/Paris\u0000","budget_units":-1,"bogus":1}`, []string{"timezone", "budget_units", "bogus"}},
		{"PATCH", "/v1/me", `{"timezone":"\ud800","budget_usd":"x","budget_period":"week"}`, []string{"timezone", "budget_usd", "budget_period"}},
		{"PATCH", "/v1/me", "{\"budget_period\":\"\xffday\",\"timezone\":5}", []string{"budget_period", "timezone"}},
		{"POST", "/v1/billing/checkout", `{"plan":"gold","bogus":1}`, []string{"plan", "bogus"}},
		{"POST", "/v1/billing/checkout", `{"bogus":1}`, []string{"plan", "bogus"}},
		{"POST", "/v1/disputes", `{"charge_ids":[],"reason":5,"bogus":1}`, []string{"charge_ids", "reason", "bogus"}},
		{"POST", "/v1/disputes", `{"charge_ids":"chg_1","reason":""}`, []string{"charge_ids", "reason"}},
		{"POST", "/v1/disputes", `{"charge_ids":["` + long + `"],"reason":" "}`, []string{"charge_ids", "reason"}},
		{"POST", "/v1/webhooks", `{"url":"ftp://example.com/hook","bogus":1}`, []string{"url", "bogus"}},
		{"POST", "/v1/webhooks", `{"bogus":1}`, []string{"url", "bogus"}},
		{"POST", "/v1/keys/" + keyID + "/rotate", `{"grace_seconds":-1,"bogus":1}`, []string{"grace_seconds", "bogus"}},
		{"POST", "/v1/validate", `{"chess960":"no"}`, []string{"chess960", "fen"}},
		{"POST", "/v1/validate", `{"fen":"bad","bogus":1}`, []string{"bogus"}}, // a bad FEN is validate's answer, not a 400
		{"POST", "/v1/legal-moves", `{"fen":"bad","bogus":1}`, []string{"fen", "bogus"}},
		{"POST", "/v1/recover", `{"email":"x","bogus":1}`, []string{"email", "bogus"}},
		{"POST", "/v1/verify-email", `{"bogus":1}`, []string{"token", "bogus"}},
		{"POST", "/v1/recover/confirm", `{"token":"","bogus":1}`, []string{"token", "bogus"}},
		// a field the decoder refused is not told again through what it left behind:
		// fen was there (of the wrong type), and a Chess960 position is not refused as
		// standard chess because chess960 could not be read
		{"POST", "/v1/analyze", `{"fen":5}`, []string{"fen"}},
		{"POST", "/v1/disputes", `{"charge_ids":[5,5],"reason":"x"}`, []string{"charge_ids[0]", "charge_ids[1]"}},
		// an element of the wrong type, null included, is named by its index, once: not
		// again through the "" left in its place (a repeat, an unknown charge, a FEN)
		{"POST", "/v1/disputes", `{"charge_ids":["chg_1",null,null],"reason":"x"}`, []string{"charge_ids[1]", "charge_ids[2]"}},
		{"POST", "/v1/disputes", `{"charge_ids":[null],"reason":""}`, []string{"charge_ids[0]", "reason"}},
		{"POST", "/v1/disputes", `{"charge_ids":["chg_1",5,"chg_1",{}],"reason":"x"}`, []string{"charge_ids[1]", "charge_ids[3]", "charge_ids"}},
		// an empty id is named by its index, not looked up (404 no charge "")
		{"POST", "/v1/disputes", `{"charge_ids":["",""],"reason":"x"}`, []string{"charge_ids[0]", "charge_ids[1]"}},
		{"POST", "/v1/disputes", `{"charge_ids":["chg_1","",5],"reason":""}`, []string{"charge_ids[1]", "charge_ids[2]", "reason"}},
		{"POST", "/v1/batch", `{"fens":["` + startFEN + `",null,"bad"],"depth":99}`, []string{"fens[1]", "fens[2]", "depth"}},
		{"POST", "/v1/analyze", `{"fen":"` + fen960 + `","chess960":"yes"}`, []string{"chess960"}},
		{"POST", "/v1/batch", `{"fens":["` + fen960 + `"],"chess960":1}`, []string{"chess960"}},
		{"POST", "/v1/legal-moves", `{"fen":"` + fen960 + `","chess960":"yes"}`, []string{"chess960"}},
		{"POST", "/v1/eval", `{"fen":"` + fen960 + `","options":{"chess960":"yes"}}`, []string{"options.chess960"}},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path+" "+tc.body, func(t *testing.T) {
			wantFields(t, e.do(tc.method, tc.path, key, tc.body), 400, "fix_request", tc.fields...)
		})
	}
	t.Run("a null or empty element is named as one", func(t *testing.T) {
		for _, tc := range []struct{ method, path, body, want string }{
			{"POST", "/v1/batch", `{"fens":["` + startFEN + `",null]}`, `{"field":"fens[1]","reason":"must be a string, not null"}`},
			{"POST", "/v1/disputes", `{"charge_ids":[null],"reason":"x"}`, `{"field":"charge_ids[0]","reason":"must be a string, not null"}`},
			{"POST", "/v1/disputes", `{"charge_ids":[""],"reason":"x"}`, `{"field":"charge_ids[0]","reason":"must not be empty: a charge id (chg_…)"}`},
			{"POST", "/v1/keys", `{"scopes":["eval",null]}`, `{"field":"scopes[1]","reason":"must be a string, not null"}`},
			{"PATCH", "/v1/keys/" + keyID, `{"scopes":[null]}`, `{"field":"scopes[0]","reason":"must be a string, not null"}`},
		} {
			r := e.do(tc.method, tc.path, key, tc.body)
			if errs, _ := r.Body["errors"].([]any); r.Status != 400 || len(errs) != 1 || !strings.Contains(r.Raw, tc.want) {
				t.Errorf("%s %s %s: want only %s: %d %s", tc.method, tc.path, tc.body, tc.want, r.Status, r.Raw)
			}
		}
	})
	t.Run("a null member is refused, not read as absent or empty", func(t *testing.T) {
		for _, tc := range []struct{ method, path, body, want string }{
			{"POST", "/v1/disputes", `{"charge_ids":["chg_1"],"reason":null}`, `{"field":"reason","reason":"must be a string, not null"}`},
			{"POST", "/v1/keys", `{"label":null}`, `{"field":"label","reason":"must be a string, not null"}`},
			{"POST", "/v1/signup", `{"email":"null-name@example.com","name":null}`, `{"field":"name","reason":"must be a string, not null"}`},
			{"POST", "/v1/eval", `{"fen":"` + startFEN + `","depth":null}`, `{"field":"depth","reason":"must be an integer, not null"}`},
			{"POST", "/v1/eval", `{"fen":"` + startFEN + `","options":null}`, `{"field":"options","reason":"must be an object, not null"}`},
			{"POST", "/v1/batch", `{"fens":null}`, `{"field":"fens","reason":"must be an array, not null"}`},
			{"POST", "/v1/validate", `{"fen":"` + startFEN + `","chess960":null}`, `{"field":"chess960","reason":"must be true or false, not null"}`},
			{"POST", "/v1/keys/" + keyID + "/rotate", `{"grace_seconds":null}`, `{"field":"grace_seconds","reason":"must be an integer, not null"}`},
			{"PATCH", "/v1/keys/" + keyID, `{"label":null}`, `{"field":"label","reason":"must be a string, not null"}`},
			{"PATCH", "/v1/keys/" + keyID, `{"budget_period":null}`, `{"field":"budget_period","reason":"must be total, month or day, not null"}`},
			{"PATCH", "/v1/me", `{"timezone":null}`, `{"field":"timezone","reason":"must be an IANA time zone name, not null"}`},
			{"PATCH", "/v1/me", `{"budget_period":null}`, `{"field":"budget_period","reason":"must be total, month or day, not null"}`},
		} {
			r := e.do(tc.method, tc.path, key, tc.body)
			if errs, _ := r.Body["errors"].([]any); r.Status != 400 || len(errs) != 1 || !strings.Contains(r.Raw, tc.want) {
				t.Errorf("%s %s %s: want only %s: %d %s", tc.method, tc.path, tc.body, tc.want, r.Status, r.Raw)
			}
		}
	})
	t.Run("refused jobs hold and start nothing", func(t *testing.T) {
		if r := e.do("GET", "/v1/jobs", key, nil); r.Status != 200 || len(r.Body["jobs"].([]any)) != 0 {
			t.Fatalf("jobs after refusals: %d %s", r.Status, r.Raw)
		}
		r := e.do("GET", "/v1/me", key, nil)
		if today, _ := r.Body["today"].(map[string]any); r.Status != 200 || today["held_units"] != float64(0) || today["units"] != float64(0) {
			t.Fatalf("me after refusals: %d %s", r.Status, r.Raw)
		}
	})
	t.Run("valid bodies are still taken", func(t *testing.T) {
		if r := e.do("POST", "/v1/batch", key, `{"fens":["`+startFEN+`"],"depth":4}`); r.Status != 202 {
			t.Fatalf("batch: %d %s", r.Status, r.Raw)
		}
		if r := e.do("PATCH", "/v1/me", key, `{"timezone":"Europe/Paris","budget_units":1000}`); r.Status != 200 {
			t.Fatalf("me: %d %s", r.Status, r.Raw)
		}
		if r := e.do("POST", "/v1/webhooks", key, `{"url":"https://example.com/hook"}`); r.Status != 201 {
			t.Fatalf("webhooks: %d %s", r.Status, r.Raw)
		}
	})
}
