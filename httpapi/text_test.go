package httpapi_test

import (
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// problemFields lists the fields a 400 problem names.
func problemFields(t *testing.T, r response) []string {
	t.Helper()
	wantProblem(t, r, 400, "fix_request")
	var out []string
	errs, _ := r.Body["errors"].([]any)
	for _, e := range errs {
		out = append(out, e.(map[string]any)["field"].(string))
	}
	return out
}

// TestStoredTextIsCheckedAtTheDoor posts NUL and other control characters in every
// field that is stored, and checks each is refused naming the field, and that the
// accounts projection, which PostgreSQL would stop on a NUL, still applies a signup.
func TestStoredTextIsCheckedAtTheDoor(t *testing.T) {
	e := newEnv(t)
	key, _ := e.signup("door@example.com")
	_, keyID := e.createKey(key, map[string]any{"label": "other"})
	const fen = "8/8/8/8/8/8/8/K6k w - - 0 1"
	tests := []struct {
		name, method, path, body string
		fields                   []string
	}{
		{"signup", "POST", "/v1/signup", `{"email":"x\u0000@example.com","name":"Ada\u0000","agent":"bot\u0001","source":"ad\u007f"}`,
			[]string{"email", "name", "agent", "source"}},
		{"signup name", "POST", "/v1/signup", `{"email":"nul@example.com","name":"Ada\u0000Lovelace"}`, []string{"name"}},
		{"signup C1 and surrogate", "POST", "/v1/signup", `{"email":"c1@example.com","name":"\u009b31m","agent":"\udc00"}`,
			[]string{"name", "agent"}},
		{"key label", "POST", "/v1/keys", `{"label":"ci\u0000"}`, []string{"label"}},
		{"key label on PATCH", "PATCH", "/v1/keys/" + keyID, `{"label":"ci\u001b[2J","budget_units":5}`, []string{"label"}},
		{"PGN tag", "POST", "/v1/analyze", `{"pgn":"[White \"A\u0000\"]\n1. e4 *","depth":1}`, []string{"pgn"}},
		{"FENs in a batch", "POST", "/v1/batch", `{"fens":["` + fen + `","` + fen + `\u0000"],"depth":1}`, []string{"fens[1]"}},
		{"FEN in eval", "POST", "/v1/eval", `{"fen":"` + fen + `\n","depth":1}`, []string{"fen"}},
		{"engine", "POST", "/v1/eval", `{"fen":"` + fen + `","engine":"sf\u0000"}`, []string{"engine"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := problemFields(t, e.do(tt.method, tt.path, key, tt.body)); !slices.Equal(got, tt.fields) {
				t.Fatalf("fields %v, want %v", got, tt.fields)
			}
		})
	}
	t.Run("Idempotency-Key", func(t *testing.T) {
		// net/http's client and server refuse control characters in headers; a proxy
		// or another server in front might not, so the handler is called directly.
		for _, path := range []string{"/v1/signup", "/v1/keys", "/v1/eval", "/v1/batch"} {
			req := httptest.NewRequest("POST", path, strings.NewReader(`{"email":"idem@example.com"}`))
			req.Header.Set("Authorization", "Bearer "+key)
			req.Header["Idempotency-Key"] = []string{"k\x00ey"}
			rec := httptest.NewRecorder()
			e.checked.ServeHTTP(rec, req)
			if rec.Code != 400 || !strings.Contains(rec.Body.String(), `"field":"Idempotency-Key"`) {
				t.Fatalf("%s: %d %s", path, rec.Code, rec.Body)
			}
		}
	})
	t.Run("path ids", func(t *testing.T) {
		for _, c := range []struct{ method, path string }{
			{"GET", "/v1/jobs/%00"}, {"GET", "/v1/jobs/job_%FF"}, {"DELETE", "/v1/jobs/%00"}, {"GET", "/v1/jobs/%00/events"},
			{"GET", "/v1/keys/%FF"}, {"PATCH", "/v1/keys/%00"}, {"DELETE", "/v1/keys/%FF"}, {"POST", "/v1/keys/%00/rotate"},
			{"GET", "/v1/usage?from=%00"},
		} {
			r := e.do(c.method, c.path, key, nil)
			if fields := problemFields(t, r); len(fields) != 1 {
				t.Fatalf("%s %s: %s", c.method, c.path, r.Raw)
			}
		}
	})

	// The accounts projection still applies what comes after.
	next, _ := e.signup("after@example.com")
	if r := e.do("GET", "/v1/me", next, nil); r.Status != 200 || r.Body["email"] != "after@example.com" {
		t.Fatalf("GET /me after the refusals: %d %s", r.Status, r.Raw)
	}
}

// TestEveryBadFieldAtOnce: wrong types are all reported, each under its own name, and
// an unknown engine is reported under engine even when a path is given.
func TestEveryBadFieldAtOnce(t *testing.T) {
	e := newEnv(t)
	key, _ := e.signup("fields@example.com")
	const fen = `"fen":"8/8/8/8/8/8/8/K6k w - - 0 1"`
	tests := []struct {
		name, path, body string
		fields           []string
	}{
		{"three types", "/v1/eval", `{"depth":"x","multipv":"y","fen":5}`, []string{"depth", "multipv", "fen"}},
		{"options", "/v1/eval", `{` + fen + `,"options":{"hash_mb":"x","show_wdl":1}}`, []string{"options.hash_mb", "options.show_wdl"}},
		{"unknown engine with a path", "/v1/eval", `{` + fen + `,"engine":"nope","path":"native"}`, []string{"engine"}},
		{"unknown engine and path", "/v1/bestmove", `{` + fen + `,"engine":"nope","path":"gpu"}`, []string{"path", "engine"}},
		{"job: unknown engine with a path", "/v1/batch", `{"fens":["8/8/8/8/8/8/8/K6k w - - 0 1"],"engine":"nope","path":"native"}`, []string{"engine"}},
		{"job: missing path", "/v1/analyze", `{` + fen + `,"engine":"sf-15.1","path":"wasm"}`, []string{"path"}},
		{"job types", "/v1/batch", `{"fens":[1,"x"],"depth":"deep","chess960":"no"}`, []string{"fens[0]", "depth", "chess960", "fens[1]"}}, // "x" is no FEN either
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := problemFields(t, e.do("POST", tt.path, key, tt.body)); !slices.Equal(got, tt.fields) {
				t.Fatalf("fields %v, want %v", got, tt.fields)
			}
		})
	}
}

func TestAnalyzeRefusesTwoGames(t *testing.T) {
	e := newEnv(t)
	key, _ := e.signup("games@example.com")
	pgn := `[Event \"a\"]\n1. e4 e5 1-0\n\n[Event \"b\"]\n1. d4 d5 0-1\n`
	r := e.do("POST", "/v1/analyze", key, `{"pgn":"`+pgn+`","depth":1}`)
	if fields := problemFields(t, r); !slices.Equal(fields, []string{"pgn"}) || !strings.Contains(r.Raw, "holds 2 games") {
		t.Fatalf("%s", r.Raw)
	}
}
