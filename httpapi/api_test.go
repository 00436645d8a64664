package httpapi_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHealth(t *testing.T) {
	e := newEnv(t)
	if r := e.do("GET", "/v1/healthz", "", nil); r.Status != 200 || r.Body["status"] != "ok" {
		t.Fatalf("healthz: %d %s", r.Status, r.Raw)
	}
	r := e.do("GET", "/v1/readyz", "", nil)
	checks, _ := r.Body["checks"].(map[string]any)
	if r.Status != 200 || checks["postgres"] != "ok" || checks["migrations"] != "ok" {
		t.Fatalf("readyz: %d %s", r.Status, r.Raw)
	}
}

func TestRouterErrorsAreProblems(t *testing.T) {
	e := newEnv(t)
	key, _ := e.signup("router@example.com")
	wantProblem(t, e.do("GET", "/v1/nowhere", "", nil), 404, "fix_request")
	wantProblem(t, e.do("GET", "/eval", "", nil), 404, "fix_request")
	r := e.do("PUT", "/v1/keys", key, nil)
	wantProblem(t, r, 405, "fix_request")
	if allow := r.Header.Get("Allow"); allow != "GET, HEAD, POST" {
		t.Fatalf("Allow = %q", allow)
	}
	wantProblem(t, e.do("GET", "/v1/signup", "", nil), 405, "fix_request")
	// the console's bundle answers a file it lacks the same way
	for _, path := range []string{"/assets/no-such-file.js", "/assets/"} {
		wantProblem(t, e.do("GET", path, "", nil), 404, "fix_request")
	}
}

// TestPathsAreTakenAsSent: a path with an empty, . or .. segment (an encoded slash
// makes one) is a 404 problem for every method, never a redirect to its cleaned form:
// a client following a 301 turns a POST into a GET of the list, and believes it made
// what it did not. Nothing is changed by such a request; an encoded slash inside an
// id, or a NUL, is refused as before. It runs on a server without the contract check:
// the document's validator takes /v1//keys and /v1/keys/ for /keys, as the router used
// to.
func TestPathsAreTakenAsSent(t *testing.T) {
	e := newEnv(t)
	key, keyID := e.signup("paths@example.com")
	plain := httptest.NewServer(e.api)
	defer plain.Close()
	client := *plain.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	send := func(t *testing.T, method, path, body string) response {
		t.Helper()
		req, err := http.NewRequest(method, plain.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		raw, _ := io.ReadAll(res.Body)
		r := response{Status: res.StatusCode, Header: res.Header, Raw: string(raw)}
		if err := json.Unmarshal(raw, &r.Body); err != nil {
			t.Fatalf("%s %s: %d %v with a body that is not JSON: %q", method, path, res.StatusCode, res.Header, raw)
		}
		return r
	}
	const unclean = "the path holds an empty, . or .. segment"
	for _, tc := range []struct {
		method, path, body string
		status             int
		detail             string
	}{
		{"POST", "/v1//keys", `{"label":"x"}`, 404, unclean},
		{"POST", "//v1/keys", `{"label":"x"}`, 404, unclean},
		{"PATCH", "/v1/keys/%2F", `{"label":"x"}`, 404, unclean},
		{"PATCH", "/v1/keys/" + keyID + "/.", `{"label":"x"}`, 404, unclean},
		{"DELETE", "/v1/keys/../keys/" + keyID, "", 404, unclean},
		{"DELETE", "/v1/keys/%2E%2E/keys/" + keyID, "", 404, unclean},
		{"POST", "/v1/keys/" + keyID + "//rotate", "", 404, unclean},
		{"GET", "/v1//me", "", 404, unclean},
		{"GET", "/v1/./me", "", 404, unclean},
		// a . or .. where a route takes an id: the route would match, and its handler
		// (or the 405 of its other methods) answer
		{"GET", "/v1/keys/..", "", 404, unclean},
		{"PATCH", "/v1/keys/..", `{"label":"x"}`, 404, unclean},
		{"DELETE", "/v1/keys/.", "", 404, unclean},
		{"GET", "/v1/jobs/..", "", 404, unclean},
		{"POST", "/v1/webhooks/../test", "", 404, unclean},
		{"POST", "/v1/keys/", `{"label":"x"}`, 404, "no endpoint POST /v1/keys/ (every path"},
		{"PATCH", "/v1/keys/a%2Fb", `{"label":"x"}`, 404, "no endpoint PATCH /v1/keys/a/b (every path"},
		{"GET", "/v1/jobs/a%2F%00", "", 400, "control character"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			r := send(t, tc.method, tc.path, tc.body)
			wantProblem(t, r, tc.status, "fix_request")
			if loc := r.Header.Get("Location"); loc != "" {
				t.Fatalf("Location %q", loc)
			}
			if detail, _ := r.Body["detail"].(string); !strings.Contains(detail, tc.detail) {
				t.Fatalf("detail %q, want it to hold %q", detail, tc.detail)
			}
		})
	}
	r := e.do("GET", "/v1/keys", key, nil)
	keys, _ := r.Body["keys"].([]any)
	if k, _ := keys[0].(map[string]any); r.Status != 200 || len(keys) != 1 || k["status"] != "active" || k["label"] != "signup" {
		t.Fatalf("after the refusals: %d %s", r.Status, r.Raw)
	}
	if r := send(t, "PATCH", "/v1/keys/"+keyID, `{"label":"as sent"}`); r.Status != 200 || r.Body["label"] != "as sent" {
		t.Fatalf("a clean path: %d %s", r.Status, r.Raw)
	}
}

// HEAD is answered wherever GET is (RFC 9110, 9.1: uptime checkers use it): the GET
// answer's status and headers, no body. A job's event stream is GET only (a HEAD would
// hold the connection for as long as the job runs). The document lists GET operations
// only, so this runs on a server without the contract check.
func TestHeadWhereverGet(t *testing.T) {
	e := newEnv(t)
	key, _ := e.signup("head@example.com")
	plain := httptest.NewServer(e.api)
	defer plain.Close()
	head := func(path string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodHead, plain.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := plain.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res, body
	}
	for _, path := range []string{"/v1/healthz", "/v1/me", "/v1/engines", "/v1/openapi.json", "/v1/keys", "/v1/docs", "/docs", "/account"} {
		res, body := head(path)
		if res.StatusCode != 200 || len(body) != 0 || res.Header.Get("Content-Type") == "" {
			t.Errorf("HEAD %s: %s, %d bytes of body, Content-Type %q", path, res.Status, len(body), res.Header.Get("Content-Type"))
		}
	}
	if res, _ := head("/v1/jobs/job_x/events"); res.StatusCode != 405 || res.Header.Get("Allow") != "GET" {
		t.Errorf("HEAD of a job's event stream: %s, Allow %q", res.Status, res.Header.Get("Allow"))
	}
}

func TestProblemTypesResolve(t *testing.T) {
	e := newEnv(t)
	key, _ := e.signup("types@example.com")
	for _, r := range []response{
		e.do("GET", "/v1/nowhere", "", nil),
		e.do("POST", "/v1/keys", "", nil),
		e.do("POST", "/v1/keys", key, `{"bogus":1}`),
		e.do("DELETE", "/v1/signup", "", nil),
	} {
		typ := r.Body["type"].(string)
		page := e.do("GET", strings.TrimPrefix(typ, "http://chessd.test"), "", nil)
		if page.Status != 200 || page.Body["type"] != typ || page.Body["next_action"] != r.Body["next_action"] {
			t.Fatalf("type %s does not resolve: %d %s", typ, page.Status, page.Raw)
		}
	}
	wantProblem(t, e.do("GET", "/v1/problems/no-such-thing", "", nil), 404, "fix_request")
}

// TestSingleValueHeaders: a header the API reads one value of (Authorization,
// Idempotency-Key, Last-Event-ID) sent in more than one field line is refused with
// 400 naming it, with the request's other faults, before the key is looked at: no
// first or last one wins (the first was taken: two accounts' keys answered as the
// first's). A comma-joined value, as a proxy may join two lines, is no valid value.
// Accept, a list, is read whole, every line of it.
func TestSingleValueHeaders(t *testing.T) {
	e := newEnv(t)
	a, _ := e.signup("single-a@example.com")
	b, _ := e.signup("single-b@example.com")
	for _, tc := range []struct {
		name, method, path string
		header             http.Header
		status             int
		next               string
		fields             []string
	}{
		{"two accounts' keys", "GET", "/v1/me", http.Header{"Authorization": {"Bearer " + a, "Bearer " + b}}, 400, "fix_request", []string{"Authorization"}},
		{"one key twice", "GET", "/v1/me", http.Header{"Authorization": {"Bearer " + a, "Bearer " + a}}, 400, "fix_request", []string{"Authorization"}},
		{"two keys on a costed call", "POST", "/v1/validate", http.Header{"Authorization": {"Bearer " + a, "Bearer " + b}}, 400, "fix_request", []string{"Authorization"}},
		{"two keys joined", "GET", "/v1/me", http.Header{"Authorization": {"Bearer " + a + ", Bearer " + b}}, 401, "fix_request", nil},
		{"two idempotency keys", "POST", "/v1/validate", http.Header{"Authorization": {"Bearer " + a}, "Idempotency-Key": {"k-1", "k-2"}}, 400, "fix_request", []string{"Idempotency-Key"}},
		{"two idempotency keys joined", "POST", "/v1/validate", http.Header{"Authorization": {"Bearer " + a}, "Idempotency-Key": {"k-1, k-2"}}, 400, "fix_request", []string{"Idempotency-Key"}},
		{"two event ids", "GET", "/v1/jobs/job_x/events", http.Header{"Authorization": {"Bearer " + a}, "Last-Event-ID": {"3", "9"}}, 400, "fix_request", []string{"Last-Event-ID"}},
		{"every fault at once", "GET", "/v1/me?bogus=1", http.Header{"Authorization": {"Bearer " + a, "Bearer " + b}, "Idempotency-Key": {"k", "k"}},
			400, "fix_request", []string{"Authorization", "Idempotency-Key", "bogus"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader
			if tc.method == "POST" {
				body = strings.NewReader(`{"fen":"` + startFEN + `"}`)
			}
			req, _ := http.NewRequest(tc.method, e.srv.URL+tc.path, body)
			for name, values := range tc.header {
				req.Header[http.CanonicalHeaderKey(name)] = values
			}
			r := e.send(req)
			if tc.fields == nil {
				wantProblem(t, r, tc.status, tc.next)
			} else {
				wantFields(t, r, tc.status, tc.next, tc.fields...)
			}
		})
	}
	t.Run("one of each is taken", func(t *testing.T) {
		req, _ := http.NewRequest("POST", e.srv.URL+"/v1/validate", strings.NewReader(`{"fen":"`+startFEN+`"}`))
		req.Header.Set("Authorization", "Bearer "+b)
		req.Header.Set("Idempotency-Key", "k-1,k-2") // one key, commas and all
		if r := e.send(req); r.Status != 200 {
			t.Fatalf("%d %s", r.Status, r.Raw)
		}
	})
	t.Run("Accept is read whole", func(t *testing.T) {
		req, _ := http.NewRequest("GET", e.srv.URL+"/v1/usage", nil)
		req.Header.Set("Authorization", "Bearer "+a)
		req.Header["Accept"] = []string{"application/json;q=0.5", "text/csv"}
		res, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if ct := res.Header.Get("Content-Type"); res.StatusCode != 200 || !strings.HasPrefix(ct, "text/csv") {
			t.Fatalf("%d %q, want CSV, preferred by the second line", res.StatusCode, ct)
		}
	})
}

func TestRequestID(t *testing.T) {
	e := newEnv(t)
	req, _ := http.NewRequest("GET", e.srv.URL+"/v1/healthz", nil)
	req.Header.Set("X-Request-Id", "client-chosen-42")
	res, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if got := res.Header.Get("X-Request-Id"); got != "client-chosen-42" {
		t.Fatalf("echoed %q", got)
	}
	r := e.do("GET", "/v1/nowhere", "", nil)
	id := r.Header.Get("X-Request-Id")
	if !strings.HasPrefix(id, "req_") || r.Body["request_id"] != id {
		t.Fatalf("generated id %q, problem says %v", id, r.Body["request_id"])
	}
	req.Header.Set("X-Request-Id", "bad id\twith spaces")
	res, _ = e.srv.Client().Do(req)
	res.Body.Close()
	if got := res.Header.Get("X-Request-Id"); !strings.HasPrefix(got, "req_") {
		t.Fatalf("an unsafe id must be replaced, got %q", got)
	}
	req.Header["X-Request-Id"] = []string{"first-1", "second-2"} // neither is taken
	res, _ = e.srv.Client().Do(req)
	res.Body.Close()
	if got := res.Header.Get("X-Request-Id"); !strings.HasPrefix(got, "req_") {
		t.Fatalf("an id given twice must be replaced, got %q", got)
	}
}

func TestBodyTooLarge(t *testing.T) {
	e := newEnv(t)
	big := `{"email":"` + strings.Repeat("a", 70<<10) + `@example.com"}`
	wantProblem(t, e.do("POST", "/v1/signup", "", big), 413, "fix_request")
}

// A body that is not one JSON object is a 400 whose errors name the field "body", with
// the detail as its reason: every 400 lists what to fix.
func TestMalformedBodiesNameTheBody(t *testing.T) {
	e := newEnv(t)
	key, _ := e.signup("bodies@example.com")
	// the body alone, also where a refusal naming fields is completed with the other
	// fields' problems (/eval, /keys): nothing of this body was read to check
	for _, tt := range []struct{ path, key, body, detail string }{
		{"/v1/signup", "", `{"email":"a@b.co",,}`, "malformed JSON at byte "},
		{"/v1/signup", "", `{"email":"a@b.co"} {"x":1}`, "unexpected data after the JSON object"},
		{"/v1/signup", "", `["a@b.co"]`, "the request body must be a JSON object, not "},
		{"/v1/eval", "", `{"fen":`, "the JSON body ends early"},
		{"/v1/eval", "", `[1]`, "the request body must be a JSON object, not "},
		{"/v1/keys", key, `{"scopes":["eval"]} x`, "unexpected data after the JSON object"},
	} {
		r := e.do("POST", tt.path, tt.key, tt.body)
		wantProblem(t, r, 400, "fix_request")
		detail, _ := r.Body["detail"].(string)
		if !strings.HasPrefix(detail, tt.detail) {
			t.Fatalf("%s: detail %q, want it to start %q", tt.body, detail, tt.detail)
		}
		errs, _ := r.Body["errors"].([]any)
		if len(errs) != 1 {
			t.Fatalf("%s: errors %v, want one: %s", tt.body, r.Body["errors"], r.Raw)
		}
		if f, _ := errs[0].(map[string]any); f["field"] != "body" || f["reason"] != detail {
			t.Fatalf("%s: errors %v, want the field body with the detail as its reason", tt.body, errs)
		}
	}
}

func TestLegalMovesAndValidate(t *testing.T) {
	e := newEnv(t)
	key, _ := e.signup("chess@example.com")
	cases := []struct {
		name, body string
		count      int
		contains   string
	}{
		{"start position", `{"fen":"` + startFEN + `"}`, 20, `{"uci":"g1f3","san":"Nf3"}`},
		{"promotion with check", `{"fen":"8/P6k/8/8/8/8/8/K7 w - - 0 1"}`, 7, `{"uci":"a7a8q","san":"a8=Q"}`},
		{"castling", `{"fen":"r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1"}`, 26, `{"uci":"e1g1","san":"O-O"}`},
		{"chess960 castling is king takes rook", `{"fen":"1r2k1r1/8/8/8/8/8/8/1R2K1R1 w GBgb - 0 1","chess960":true}`, 25, `{"uci":"e1b1","san":"O-O-O"}`},
		{"checkmated has none", `{"fen":"rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3"}`, 0, `"status":"checkmate"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do("POST", "/v1/legal-moves", key, tc.body)
			if r.Status != 200 || !strings.Contains(r.Raw, tc.contains) {
				t.Fatalf("%d %s", r.Status, r.Raw)
			}
			if tc.count > 0 && r.Body["count"] != float64(tc.count) {
				t.Fatalf("count %v, want %d", r.Body["count"], tc.count)
			}
		})
	}
	for name, body := range map[string]string{
		"malformed FEN":              `{"fen":"not a fen"}`,
		"two white kings":            `{"fen":"K6K/8/8/8/8/8/8/7k w - - 0 1"}`,
		"side not to move in check":  `{"fen":"4k3/8/8/8/8/8/4R3/4K3 w - - 0 1"}`,
		"pawn on rank 8":             `{"fen":"P3k3/8/8/8/8/8/8/4K3 w - - 0 1"}`,
		"impossible castle":          `{"fen":"4k3/8/8/8/8/8/8/4K3 w K - 0 1"}`,
		"chess960 castle, king on a": `{"fen":"4k3/8/8/8/8/8/8/K6R w H - 0 1","chess960":true}`,
		"missing fen":                `{}`,
		"fen wrong type":             `{"fen":1}`,
	} {
		t.Run(name, func(t *testing.T) {
			r := e.do("POST", "/v1/legal-moves", key, body)
			wantProblem(t, r, 400, "fix_request")
			if errs, _ := r.Body["errors"].([]any); len(errs) == 0 {
				t.Fatalf("no errors list: %s", r.Raw)
			}
		})
	}
	t.Run("validate says yes", func(t *testing.T) {
		r := e.do("POST", "/v1/validate", key, `{"fen":"`+startFEN+`"}`)
		if r.Status != 200 || r.Body["valid"] != true || r.Body["side_to_move"] != "white" || r.Body["legal_moves"] != float64(20) {
			t.Fatalf("%d %s", r.Status, r.Raw)
		}
	})
	for _, tc := range []struct{ name, fen, reason string }{
		{"side not to move in check", "4k3/8/8/8/8/8/4R3/4K3 w - - 0 1", "check"},
		// A character outside ASCII is named whole, not by its first byte ('â' of '€').
		{"non-ASCII piece", "4k3/8/8/8/8/8/8/4K€3 w - - 0 1", "rank 1 has invalid character '€'"},
		{"invisible castling character", "4k3/8/8/8/8/8/8/4K3 w \u200b- - 0 1", `invalid character '\u200b'`},
		// Counters that do not fit the rest of the FEN.
		{"en passant with a running clock", "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 5 3", "halfmove clock 5 is impossible with the en passant square d6"},
		{"en passant before black has moved", "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 1", "en passant square d6 is impossible at fullmove number 1 with white to move"},
	} {
		t.Run("validate says no and why: "+tc.name, func(t *testing.T) {
			r := e.do("POST", "/v1/validate", key, map[string]string{"fen": tc.fen})
			reason, _ := r.Body["reason"].(string)
			if r.Status != 200 || r.Body["valid"] != false || !strings.Contains(reason, tc.reason) {
				t.Fatalf("%d %s, want a reason containing %q", r.Status, r.Raw, tc.reason)
			}
		})
	}
	// Invalid UTF-8 never reaches the FEN parser: the text rules refuse it first.
	t.Run("validate refuses invalid UTF-8", func(t *testing.T) {
		r := e.do("POST", "/v1/validate", key, []byte("{\"fen\":\"4k3/8/8/8/8/8/8/4K\xff3 w - - 0 1\"}"))
		wantProblem(t, r, 400, "fix_request")
		if !strings.Contains(r.Raw, "UTF-8") {
			t.Fatalf("%s: the refusal does not name UTF-8", r.Raw)
		}
	})
	// Chess960 rights each side could hold alone, but not on this board: a king outside
	// b-g, kings on two files, same-side rooks on two files.
	for _, fen := range []string{
		"4k3/8/8/8/8/8/8/K6R w H - 0 1",
		"r2k3r/8/8/8/8/8/8/R3K2R w KQkq - 0 1",
		"1r2k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1",
	} {
		t.Run("validate says no to chess960 "+fen, func(t *testing.T) {
			r := e.do("POST", "/v1/validate", key, `{"fen":"`+fen+`","chess960":true}`)
			reason, _ := r.Body["reason"].(string)
			if r.Status != 200 || r.Body["valid"] != false || !strings.Contains(reason, "castling") {
				t.Fatalf("%d %s", r.Status, r.Raw)
			}
		})
	}
}

// FuzzRequestBodies sends arbitrary bodies to every JSON endpoint: no input may produce
// a 500 or a panic, and every error must be problem+json.
func FuzzRequestBodies(f *testing.F) {
	for _, s := range []string{
		`{"fen":"` + startFEN + `"}`, `{"fen":"8/8/8/8/8/8/8/K6k w - - 0 1","chess960":true}`,
		`{"email":"a@b.co"}`, `{"label":"x","scopes":["eval"],"budget_usd":"1.5"}`, `{"budget_units":null}`,
		`{"grace_seconds":10}`, `[]`, `null`, `{"fen":"\u0000"}`, `{"budget_usd":1e400}`, `{"scopes":[1]}`,
		`{"fen":"8/8/8/8/8/8/8/K6k w - - 0 1","depth":3,"multipv":2,"options":{"show_wdl":true}}`,
		`{"fens":["8/8/8/8/8/8/8/K6k w - - 0 1"],"depth":2}`, `{"pgn":"1. e4 e5 2. Nf3 {c} (2. f4) Nc6 $1 *","depth":2}`,
		`{"pgn":"[FEN \"bad\"]\n1. e4"}`, `{"plan":"pro"}`, `{"fen":"` + startFEN + `","depth":1e9}`,
	} {
		f.Add(s)
	}
	e := newEnv(f)
	key, keyID := e.signup("fuzz@example.com")
	f.Fuzz(func(t *testing.T, body string) {
		for _, ep := range []struct{ method, path string }{
			{"POST", "/v1/validate"}, {"POST", "/v1/legal-moves"}, {"POST", "/v1/keys"},
			{"PATCH", "/v1/keys/" + keyID}, {"POST", "/v1/keys/key_x/rotate"}, {"POST", "/v1/signup"},
			{"POST", "/v1/eval"}, {"POST", "/v1/bestmove"}, {"POST", "/v1/batch"}, {"POST", "/v1/analyze"},
			{"POST", "/v1/billing/checkout"},
		} {
			req := httptest.NewRequest(ep.method, ep.path, strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+key)
			rec := httptest.NewRecorder()
			e.checked.ServeHTTP(rec, req)
			if rec.Code >= 500 {
				t.Fatalf("%s %s with %q: %d %s", ep.method, ep.path, body, rec.Code, rec.Body)
			}
			if rec.Code >= 400 && rec.Header().Get("Content-Type") != "application/problem+json" {
				t.Fatalf("%s %s: error without problem+json", ep.method, ep.path)
			}
			var v map[string]any
			if rec.Code != 204 && json.Unmarshal(rec.Body.Bytes(), &v) != nil {
				t.Fatalf("%s %s: response is not JSON: %q", ep.method, ep.path, rec.Body)
			}
		}
	})
}
