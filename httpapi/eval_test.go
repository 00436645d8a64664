package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"chessd/domain"
	"chessd/engine"
	"chessd/httpapi"
	"chessd/postgres/pgtest"
)

// evalBody builds an /eval request body.
func evalBody(fen string, extra string) string {
	if extra != "" {
		extra = "," + extra
	}
	return fmt.Sprintf(`{"fen":%q%s}`, fen, extra)
}

func pvs(r response) []map[string]any {
	var out []map[string]any
	for _, p := range r.Body["pvs"].([]any) {
		out = append(out, p.(map[string]any))
	}
	return out
}

func score(v any) (string, float64) {
	m := v.(map[string]any)
	return m["type"].(string), m["value"].(float64)
}

func TestEvalWithRealEngines(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("eval@example.com")
	cases := []struct {
		name, body string
		check      func(t *testing.T, r response)
	}{
		{"mate in one for white", evalBody("6k1/5ppp/8/8/8/8/5PPP/3R2K1 w - - 0 1", `"depth":10`), func(t *testing.T, r response) {
			if typ, v := score(r.Body["eval"]); typ != "mate" || v != 1 {
				t.Fatalf("eval %v, want mate +1", r.Body["eval"])
			}
			if r.Body["bestmove"] != "d1d8" || r.Body["bestmove_san"] != "Rd8#" {
				t.Fatalf("bestmove %v %v", r.Body["bestmove"], r.Body["bestmove_san"])
			}
		}},
		{"mate in one for black", evalBody("3r2k1/5ppp/8/8/8/8/5PPP/6K1 b - - 0 1", `"depth":10`), func(t *testing.T, r response) {
			if typ, v := score(r.Body["eval"]); typ != "mate" || v != -1 {
				t.Fatalf("eval %v, want mate -1 (Black mates, White's view)", r.Body["eval"])
			}
			if r.Body["bestmove"] != "d8d1" || r.Body["bestmove_san"] != "Rd1#" {
				t.Fatalf("bestmove %v %v", r.Body["bestmove"], r.Body["bestmove_san"])
			}
		}},
		{"checkmated", evalBody("rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3", ""), func(t *testing.T, r response) {
			if typ, v := score(r.Body["eval"]); typ != "mate" || v != 0 || r.Body["bestmove"] != nil || len(pvs(r)) != 0 {
				t.Fatalf("checkmated: %s", r.Raw)
			}
		}},
		{"stalemated", evalBody("7k/5Q2/6K1/8/8/8/8/8 b - - 0 1", ""), func(t *testing.T, r response) {
			if typ, v := score(r.Body["eval"]); typ != "cp" || v != 0 || r.Body["bestmove"] != nil {
				t.Fatalf("stalemated: %s", r.Raw)
			}
		}},
		{"multipv 3", evalBody(startFEN, `"depth":10,"multipv":3`), func(t *testing.T, r response) {
			lines := pvs(r)
			if len(lines) != 3 {
				t.Fatalf("%d lines", len(lines))
			}
			seen := map[string]bool{}
			prev := 1e9
			for i, l := range lines {
				first := l["moves"].([]any)[0].(string)
				if seen[first] || l["rank"] != float64(i+1) {
					t.Fatalf("line %d starts with %s (rank %v): lines must be distinct and ranked", i, first, l["rank"])
				}
				seen[first] = true
				if _, v := score(l["eval"]); v > prev {
					t.Fatalf("line %d scores better than line %d", i+1, i)
				} else {
					prev = v
				}
				if len(l["moves_san"].([]any)) != len(l["moves"].([]any)) {
					t.Fatal("SAN and UCI lines differ in length")
				}
			}
		}},
		{"show_wdl", evalBody("8/8/8/8/8/5k2/8/Q3K3 w - - 0 1", `"depth":8,"options":{"show_wdl":true}`), func(t *testing.T, r response) {
			wdl, ok := pvs(r)[0]["wdl"].(map[string]any)
			if !ok {
				t.Fatalf("no wdl: %s", r.Raw)
			}
			w, d, l := wdl["w"].(float64), wdl["d"].(float64), wdl["l"].(float64)
			if w+d+l != 1000 || w < 900 {
				t.Fatalf("wdl %v: must sum to 1000 and favour White (queen up)", wdl)
			}
		}},
		{"no wdl unless asked", evalBody("8/8/8/8/8/5k2/8/Q3K3 w - - 0 1", `"depth":8`), func(t *testing.T, r response) {
			if _, ok := pvs(r)[0]["wdl"]; ok {
				t.Fatalf("wdl without show_wdl: %s", r.Raw)
			}
		}},
		{"chess960 castling is king takes rook", evalBody("k7/8/8/8/8/7p/7P/5K1R w H - 0 1", `"depth":6,"multipv":10,"options":{"chess960":true}`), func(t *testing.T, r response) {
			lines := pvs(r)
			if len(lines) != 6 {
				t.Fatalf("%d lines, want all 6 legal moves", len(lines))
			}
			found := false
			for _, l := range lines {
				if l["moves"].([]any)[0] == "f1h1" && l["moves_san"].([]any)[0] == "O-O" {
					found = true
				}
			}
			if !found {
				t.Fatalf("castling f1h1 / O-O not among the lines: %s", r.Raw)
			}
		}},
		{"sf-15.1", evalBody(startFEN, `"depth":6,"engine":"sf-15.1"`), func(t *testing.T, r response) {
			if r.Body["engine"] != "sf-15.1" || r.Body["engine_name"] != "Stockfish 15.1" || r.Body["path"] != "native" {
				t.Fatalf("%v %v %v", r.Body["engine"], r.Body["engine_name"], r.Body["path"])
			}
		}},
		{"wasm path", evalBody(startFEN, `"depth":6,"path":"wasm"`), func(t *testing.T, r response) {
			if r.Body["engine"] != "sf-17.1" || r.Body["path"] != "wasm" || !strings.Contains(r.Body["engine_name"].(string), "WASM") {
				t.Fatalf("%v %v %v", r.Body["engine"], r.Body["engine_name"], r.Body["path"])
			}
		}},
		{"latest native", evalBody(startFEN, `"depth":6,"engine":"latest","path":"native"`), func(t *testing.T, r response) {
			if r.Body["engine"] != "sf-17.1" || r.Body["path"] != "native" || r.Body["engine_name"] != "Stockfish 17.1" {
				t.Fatalf("%v %v %v", r.Body["engine"], r.Body["engine_name"], r.Body["path"])
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do("POST", "/v1/eval", key, tc.body)
			if r.Status != 200 {
				t.Fatalf("%d %s", r.Status, r.Raw)
			}
			if r.Body["cost_units"].(float64) < 1 {
				t.Fatalf("cost_units %v", r.Body["cost_units"])
			}
			// flushed by the handler, the answer still goes out whole: its length, no chunks
			if cl := r.Header.Get("Content-Length"); cl != strconv.Itoa(len(r.Raw)) {
				t.Fatalf("Content-Length %q for an answer of %d bytes", cl, len(r.Raw))
			}
			tc.check(t, r)
		})
	}
	t.Run("bestmove", func(t *testing.T) {
		r := e.do("POST", "/v1/bestmove", key, evalBody("6k1/5ppp/8/8/8/8/5PPP/3R2K1 w - - 0 1", `"depth":9`))
		if r.Status != 200 || r.Body["bestmove"] != "d1d8" || r.Body["bestmove_san"] != "Rd8#" {
			t.Fatalf("%d %s", r.Status, r.Raw)
		}
		if typ, v := score(r.Body["eval"]); typ != "mate" || v != 1 {
			t.Fatalf("eval %v", r.Body["eval"])
		}
		if _, ok := r.Body["pvs"]; ok {
			t.Fatal("bestmove answers the short form")
		}
	})
}

func TestEvalRefusesBadRequests(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("bad-eval@example.com")
	fen := `"fen":"` + startFEN + `"`
	cases := map[string]struct{ body, field string }{
		"missing fen":           {`{}`, "fen"},
		"malformed fen":         {`{"fen":"xyz"}`, "fen"},
		"illegal fen":           {`{"fen":"4k3/8/8/8/8/8/4R3/4K3 w - - 0 1"}`, "fen"},
		"depth 0":               {`{` + fen + `,"depth":0}`, "depth"},
		"depth 31":              {`{` + fen + `,"depth":31}`, "depth"},
		"depth not integer":     {`{` + fen + `,"depth":14.5}`, "depth"},
		"depth string":          {`{` + fen + `,"depth":"14"}`, "depth"},
		"multipv 0":             {`{` + fen + `,"multipv":0}`, "multipv"},
		"multipv 11":            {`{` + fen + `,"multipv":11}`, "multipv"},
		"movetime 49":           {`{` + fen + `,"movetime_ms":49}`, "movetime_ms"},
		"movetime 60001":        {`{` + fen + `,"movetime_ms":60001}`, "movetime_ms"},
		"unknown engine":        {`{` + fen + `,"engine":"sf-99"}`, "engine"},
		"empty engine":          {`{` + fen + `,"engine":""}`, "engine"},
		"unknown path":          {`{` + fen + `,"path":"gpu"}`, "path"},
		"no wasm for 15.1":      {`{` + fen + `,"engine":"sf-15.1","path":"wasm"}`, "path"},
		"hash above policy":     {`{` + fen + `,"options":{"hash_mb":257}}`, "options.hash_mb"},
		"hash 0":                {`{` + fen + `,"options":{"hash_mb":0}}`, "options.hash_mb"},
		"elo too low":           {`{` + fen + `,"options":{"elo":100}}`, "options.elo"},
		"elo with strength off": {`{` + fen + `,"options":{"elo":1500,"limit_strength":false}}`, "options.elo"},
		"skill 21":              {`{` + fen + `,"options":{"skill_level":21}}`, "options.skill_level"},
		"overhead above policy": {`{` + fen + `,"options":{"move_overhead_ms":5001}}`, "options.move_overhead_ms"},
		"chess960 not boolean":  {`{` + fen + `,"options":{"chess960":"yes"}}`, "options.chess960"},
		"unknown option":        {`{` + fen + `,"options":{"threads":4}}`, "options.threads"},
		"unknown field":         {`{` + fen + `,"ponder":true}`, "ponder"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := e.do("POST", "/v1/eval", key, tc.body)
			wantProblem(t, r, 400, "fix_request")
			errs, _ := r.Body["errors"].([]any)
			if len(errs) == 0 || !strings.Contains(r.Raw, `"field":"`+tc.field+`"`) {
				t.Fatalf("errors do not name %s: %s", tc.field, r.Raw)
			}
		})
	}
	t.Run("every bad field at once", func(t *testing.T) {
		r := e.do("POST", "/v1/eval", key, `{"fen":"`+startFEN+`","depth":0,"multipv":99,"movetime_ms":1}`)
		if errs, _ := r.Body["errors"].([]any); r.Status != 400 || len(errs) != 3 {
			t.Fatalf("%d %s", r.Status, r.Raw)
		}
	})
}

func TestEvalCache(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("cache@example.com")
	fen := "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"
	call := func(extra string) response {
		t.Helper()
		r := e.do("POST", "/v1/eval", key, evalBody(fen, extra))
		if r.Status != 200 {
			t.Fatalf("%d %s", r.Status, r.Raw)
		}
		return r
	}
	first := call(`"depth":12,"multipv":3`)
	if first.Body["cached"] != false || first.Body["cost_units"] != float64(40) {
		t.Fatalf("first call: cached %v cost %v", first.Body["cached"], first.Body["cost_units"])
	}
	again := call(`"depth":12,"multipv":3`)
	if again.Body["cached"] != true || again.Body["cost_units"] != float64(4) || again.Body["nodes"] != first.Body["nodes"] {
		t.Fatalf("repeat: cached %v cost %v", again.Body["cached"], again.Body["cost_units"])
	}
	shallower := call(`"depth":10,"multipv":1`)
	if shallower.Body["cached"] != true || len(pvs(shallower)) != 1 || shallower.Body["depth"].(float64) < 12 {
		t.Fatalf("a deeper result with more lines must answer, trimmed: %s", shallower.Raw)
	}
	// another fullmove number: the same position; another halfmove clock is not
	// (Stockfish's answer depends on it: the fifty-move rule, and its evaluation scales)
	r := e.do("POST", "/v1/eval", key, evalBody(strings.Replace(fen, " 2 3", " 2 17", 1), `"depth":12`))
	if r.Body["cached"] != true {
		t.Fatalf("the fullmove number must not matter: %s", r.Raw)
	}
	if r := e.do("POST", "/v1/eval", key, evalBody(strings.Replace(fen, " 2 3", " 0 3", 1), `"depth":12`)); r.Body["cached"] != false {
		t.Fatalf("another halfmove clock answered from the cache: %s", r.Raw)
	}
	for name, extra := range map[string]string{
		"deeper":             `"depth":13`,
		"more lines":         `"depth":12,"multipv":4`,
		"other engine":       `"depth":12,"engine":"sf-15.1"`,
		"other path":         `"depth":12,"path":"wasm"`,
		"chess960 mode":      `"depth":12,"options":{"chess960":true}`,
		"limited strength":   `"depth":12,"options":{"skill_level":3}`,
		"limited strength 2": `"depth":12,"options":{"skill_level":3}`,
		"elo":                `"depth":12,"options":{"elo":1500}`,
	} {
		t.Run(name, func(t *testing.T) {
			if r := call(extra); r.Body["cached"] != false {
				t.Fatalf("served from cache: %s", r.Raw)
			}
		})
	}
	t.Run("other position", func(t *testing.T) {
		r := e.do("POST", "/v1/eval", key, evalBody(startFEN, `"depth":12`))
		if r.Body["fen"] != startFEN {
			t.Fatalf("answered for %v", r.Body["fen"])
		}
	})
	var rows int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM eval_cache WHERE result::text LIKE '%skill%' OR pos_key LIKE '%Skill%'`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("limited results stored: %d %v", rows, err)
	}
	t.Run("persistent layer", func(t *testing.T) {
		e.svc.Cache().Forget()
		deadline := time.Now().Add(10 * time.Second)
		for { // the PostgreSQL write happens in the background
			r := call(`"depth":12,"multipv":2`)
			if r.Body["cached"] == true {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the eval_cache table never answered")
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

func TestKeyless(t *testing.T) {
	e := newEnv(t)
	r := e.do("POST", "/v1/eval", "", evalBody(startFEN, `"depth":8`))
	if r.Status != 200 {
		t.Fatalf("keyless eval: %d %s", r.Status, r.Raw)
	}
	for _, tt := range []struct {
		path, body string
		caps       map[string]int
	}{
		{"/v1/eval", `"depth":13`, map[string]int{"depth": 12}},
		{"/v1/bestmove", `"depth":8,"multipv":4`, map[string]int{"multipv": 3}},
		{"/v1/eval", `"depth":13,"multipv":4`, map[string]int{"depth": 12, "multipv": 3}},
	} {
		r := e.do("POST", tt.path, "", evalBody(startFEN, tt.body))
		wantProblem(t, r, 402, "sign_up")
		wantCaps(t, r, tt.caps)
	}
	wantProblem(t, e.do("POST", "/v1/eval", "ce_live_"+strings.Repeat("x", 43), evalBody(startFEN, `"depth":8`)), 401, "fix_request")
	// the defaults work without a key: the depth is the keyless cap's
	if r := e.do("POST", "/v1/eval", "", `{"fen":"`+startFEN+`"}`); r.Status != 200 || r.Body["depth"] != float64(httpapi.KeylessMaxDepth) {
		t.Fatalf("keyless eval with the defaults: %d %s", r.Status, r.Raw)
	}
	// a failed call gives its allowance back
	e.do("POST", "/v1/eval", "", evalBody("8/8/8/8/8/8/8/8 w - - 0 1", ""))
	// the server takes the allowance in blocks and gives an idle block's unused calls
	// back: then the database counts the two answered calls, not the refused ones
	deadline := time.Now().Add(10 * time.Second)
	for calls := -1; calls != 2; {
		if err := e.pool.QueryRow(context.Background(), `SELECT calls FROM keyless_usage`).Scan(&calls); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("allowance used %d, want 2: refused calls must not count", calls)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := e.pool.Exec(context.Background(), `UPDATE keyless_usage SET calls = 49`); err != nil {
		t.Fatal(err)
	}
	if r := e.do("POST", "/v1/bestmove", "", evalBody(startFEN, `"depth":8`)); r.Status != 200 {
		t.Fatalf("50th call: %d %s", r.Status, r.Raw)
	}
	wantProblem(t, e.do("POST", "/v1/eval", "", evalBody(startFEN, `"depth":8`)), 402, "sign_up")
	key, _ := e.signup("keyless@example.com")
	if r := e.do("POST", "/v1/eval", key, evalBody(startFEN, `"depth":20,"movetime_ms":100`)); r.Status != 200 {
		t.Fatalf("a key is not limited by the keyless allowance: %d %s", r.Status, r.Raw)
	}
}

func TestEnginesAndPrice(t *testing.T) {
	e := newEnv(t)
	r := e.do("GET", "/v1/engines", "", nil)
	if r.Status != 200 || r.Body["default"] != "sf-17.1" {
		t.Fatalf("%d %s", r.Status, r.Raw)
	}
	ids := map[string]map[string]any{}
	for _, v := range r.Body["versions"].([]any) {
		v := v.(map[string]any)
		ids[v["id"].(string)] = v
	}
	if len(ids["sf-17.1"]["paths"].([]any)) != 2 || len(ids["sf-15.1"]["paths"].([]any)) != 1 {
		t.Fatalf("paths: %s", r.Raw)
	}
	if ids["sf-17.1"]["name"] != "Stockfish 17.1" || len(ids["sf-17.1"]["nnue"].([]any)) == 0 {
		t.Fatalf("sf-17.1: %v", ids["sf-17.1"])
	}
	opts := map[string]map[string]any{}
	for _, o := range r.Body["options"].([]any) {
		o := o.(map[string]any)
		opts[o["name"].(string)] = o
	}
	for _, name := range []string{"hash_mb", "limit_strength", "elo", "skill_level", "chess960", "show_wdl", "move_overhead_ms"} {
		if opts[name] == nil {
			t.Fatalf("option %s missing from the schema", name)
		}
	}
	if opts["hash_mb"]["max"] != float64(256) || opts["hash_mb"]["min"] != float64(1) || opts["skill_level"]["max"] != float64(20) ||
		opts["elo"]["min"] != float64(1320) || opts["chess960"]["default"] != false || opts["hash_mb"]["type"] != "integer" {
		t.Fatalf("schema: %v", opts)
	}

	key, _ := e.signup("price@example.com")
	for _, tc := range []struct {
		query        string
		units, cache float64
		usd          string
	}{
		{"endpoint=eval", 20, 2, "0.000200"},
		{"endpoint=bestmove&depth=20&multipv=3", 160, 16, "0.001600"},
		{"endpoint=batch&items=50&depth=10", 500, 50, "0.005000"},
		{"endpoint=analyze&plies=40&depth=14&multipv=2", 1200, 120, "0.012000"},
		{"endpoint=eval&depth=30&movetime_ms=100", 5, 1, "0.000050"},
	} {
		r := e.do("GET", "/v1/price?"+tc.query, key, nil)
		if r.Status != 200 || r.Body["units"] != tc.units || r.Body["cached_units"] != tc.cache || r.Body["usd"] != tc.usd {
			t.Fatalf("%s: %d %s", tc.query, r.Status, r.Raw)
		}
	}
	for _, q := range []string{"", "endpoint=ponder", "endpoint=batch&depth=15", "endpoint=batch&items=51", "endpoint=eval&multipv=11", "endpoint=eval&depth=x", "endpoint=eval&color=white"} {
		wantProblem(t, e.do("GET", "/v1/price?"+q, key, nil), 400, "fix_request")
	}
	// a parameter the endpoint's calls cannot have is named, not ignored (jobs take no
	// movetime: the quote was of a call that cannot be made)
	for q, field := range map[string]string{"endpoint=batch&items=50&movetime_ms=100": "movetime_ms", "endpoint=eval&items=5": "items",
		"endpoint=analyze&items=5": "items", "endpoint=bestmove&plies=3": "plies", "endpoint=batch&plies=3": "plies"} {
		r := e.do("GET", "/v1/price?"+q, key, nil)
		wantProblem(t, r, 400, "fix_request")
		if errs, _ := r.Body["errors"].([]any); len(errs) != 1 || errs[0].(map[string]any)["field"] != field {
			t.Fatalf("%s: want one error naming %s: %s", q, field, r.Raw)
		}
	}
	wantProblem(t, e.do("GET", "/v1/price?endpoint=eval", "", nil), 401, "sign_up")
	// what /price quotes is what /eval charges
	ev := e.do("POST", "/v1/eval", key, evalBody(startFEN, `"depth":9,"multipv":2`))
	pr := e.do("GET", "/v1/price?endpoint=eval&depth=9&multipv=2", key, nil)
	if ev.Body["cost_units"] != pr.Body["units"] {
		t.Fatalf("eval cost %v, price %v", ev.Body["cost_units"], pr.Body["units"])
	}
}

// childEngines finds this process's engine children whose command line contains match.
func childEngines(t *testing.T, match string) []int {
	t.Helper()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var out []int
	for _, d := range dirs {
		stat, err := os.ReadFile(d + "/stat")
		if err != nil {
			continue
		}
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(os.Getpid()) {
			continue
		}
		cmd, _ := os.ReadFile(d + "/cmdline")
		if strings.Contains(string(cmd), match) {
			pid, _ := strconv.Atoi(filepath.Base(d))
			out = append(out, pid)
		}
	}
	return out
}

func TestEngineFailureAndDisconnect(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("crash@example.com")
	pool, err := e.svc.Catalog().Pool(context.Background(), "sf-17.1", engine.PathNative)
	if err != nil {
		t.Fatal(err)
	}
	busy := func() bool { return pool.Stats().Idle == 0 }
	idle := func() bool { s := pool.Stats(); return s.Idle == s.Size && s.Live == s.Size }
	pgtest.WaitFor(t, "an idle pool", idle)

	t.Run("killed mid-search", func(t *testing.T) {
		done := make(chan response, 1)
		go func() {
			done <- e.do("POST", "/v1/eval", key, evalBody("r1bq1rk1/ppp2ppp/2np1n2/2b1p3/2B1P3/2NP1N2/PPP2PPP/R1BQ1RK1 w - - 0 7", `"depth":30,"movetime_ms":30000`))
		}()
		pgtest.WaitFor(t, "the search to start", busy)
		pids := childEngines(t, "sf-17.1/stockfish")
		if len(pids) == 0 {
			t.Fatal("no native engine process found")
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		r := <-done
		wantProblem(t, r, 503, "retry_after")
		if r.Header.Get("Retry-After") == "" {
			t.Fatal("503 without Retry-After")
		}
		pgtest.WaitFor(t, "the pool to heal", idle)
		if r := e.do("POST", "/v1/eval", key, evalBody(startFEN, `"depth":7`)); r.Status != 200 {
			t.Fatalf("after healing: %d %s", r.Status, r.Raw)
		}
	})

	t.Run("client goes away", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "POST", e.srv.URL+"/v1/eval",
			strings.NewReader(evalBody("r2q1rk1/ppp2ppp/2np1n2/2b1p3/2B1P1b1/2NP1N2/PPP2PPP/R1BQ1RK1 w - - 0 8", `"depth":30,"movetime_ms":60000`)))
		req.Header.Set("Authorization", "Bearer "+key)
		errc := make(chan error, 1)
		go func() {
			res, err := e.srv.Client().Do(req)
			if err == nil {
				res.Body.Close()
			}
			errc <- err
		}()
		pgtest.WaitFor(t, "the search to start", busy)
		cancel()
		if err := <-errc; err == nil {
			t.Fatal("the request was not cut")
		}
		// a 60 s search that kept running would hold the only process far longer
		pgtest.WaitFor(t, "the engine to be released", idle)
		if r := e.do("POST", "/v1/eval", key, evalBody(startFEN, `"depth":7,"multipv":2`)); r.Status != 200 {
			t.Fatalf("next request: %d %s", r.Status, r.Raw)
		}
	})
}

// A refusal above a plan's cap names the field and its cap in errors[].max, so that a
// client (the UCI bridge) asks again within it without reading the detail.
func TestCapRefusalsNameTheCap(t *testing.T) {
	e := newEnv(t)
	key, _ := e.signup("caps@example.com") // the free plan: depth 20, multipv 3, movetime 10 s
	for _, tt := range []struct {
		body  string
		field string
		max   int
	}{
		{`"depth":25`, "depth", 20},
		{`"depth":10,"multipv":5`, "multipv", 3},
		{`"movetime_ms":20000`, "movetime_ms", 10000},
	} {
		r := e.do("POST", "/v1/eval", key, evalBody(startFEN, tt.body))
		wantProblem(t, r, 402, "upgrade")
		wantCaps(t, r, map[string]int{tt.field: tt.max})
	}
}

// wantCaps checks that problem r names exactly these fields' caps in errors[].max.
func wantCaps(t *testing.T, r response, caps map[string]int) {
	t.Helper()
	var p struct {
		Errors []domain.FieldError `json:"errors"`
	}
	if err := json.Unmarshal([]byte(r.Raw), &p); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, e := range p.Errors {
		if e.Max != nil {
			got[e.Field] = *e.Max
		}
	}
	if !maps.Equal(got, caps) {
		t.Errorf("caps named %v, want %v: %s", got, caps, r.Raw)
	}
}
