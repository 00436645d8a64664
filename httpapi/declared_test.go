package httpapi_test

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// Every operation takes only what the OpenAPI document declares of it, by one rule: a
// query parameter it does not declare, a parameter given twice, and a body sent to an
// operation that declares none are each a 400 naming the field (the parameter, or
// body), whatever the handler would have done with the rest of the request. Before,
// GET /me?bogus=1 and POST /eval?depth=99 answered 200 ignoring the query, GET
// /keys?env=live&env=test listed test keys, GET /usage?group_by=day&group_by=key
// grouped by day, and POST /billing/portal took {"x":1}.
func TestOnlyWhatTheDocumentDeclares(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("declared@example.com")
	keyID := principalKeyID(t, e, key)

	// something of each kind to ask about: a job, a charge, a dispute, a webhook endpoint
	r := e.do("POST", "/v1/batch", key, map[string]any{"fens": []string{startFEN}, "depth": 4})
	if r.Status != 202 {
		t.Fatalf("batch: %d %s", r.Status, r.Raw)
	}
	job := r.Body["job_id"].(string)
	e.waitJob(key, job, finished)
	e.caughtUp()
	charge := e.chargeIDs(keyID)[0]
	r = e.do("POST", "/v1/disputes", key, map[string]any{"charge_ids": []string{charge}, "reason": "checking parameters"})
	if r.Status != 201 {
		t.Fatalf("dispute: %d %s", r.Status, r.Raw)
	}
	dispute := r.Body["dispute_id"].(string)
	r = e.do("POST", "/v1/webhooks", key, map[string]any{"url": "https://example.com/declared"})
	if r.Status != 201 {
		t.Fatalf("webhook: %d %s", r.Status, r.Raw)
	}
	hook := r.Body["id"].(string)

	refused := func(t *testing.T, r response, reason string, fields ...string) {
		t.Helper()
		wantProblem(t, r, 400, "fix_request")
		var got []string
		for _, f := range r.Body["errors"].([]any) {
			f := f.(map[string]any)
			got = append(got, f["field"].(string))
			if !strings.Contains(f["reason"].(string), reason) {
				t.Errorf("%s: reason %q, want one saying %q", f["field"], f["reason"], reason)
			}
		}
		if !slices.Equal(got, fields) {
			t.Fatalf("errors name %q, want %q: %s", got, fields, r.Raw)
		}
	}

	for _, op := range []struct {
		method, path string
		query        string // a query the operation takes, kept in every case
		twice        string // a parameter of it given twice; "" when it takes none
		body         string // the body it takes; "" when it declares none
	}{
		{"GET", "/v1/me", "", "", ""},
		{"GET", "/v1/engines", "", "", ""},
		{"GET", "/v1/keys", "", "env=live&env=test", ""},
		{"GET", "/v1/jobs", "limit=5", "env=live&env=test", ""},
		{"GET", "/v1/jobs/" + job, "", "", ""},
		{"GET", "/v1/jobs/" + job + "/result", "", "", ""},
		{"DELETE", "/v1/jobs/" + job, "", "", ""},
		{"GET", "/v1/disputes", "state=open", "limit=1&limit=2", ""},
		{"GET", "/v1/disputes/" + dispute, "", "", ""},
		{"GET", "/v1/usage", "", "group_by=day&group_by=key", ""},
		{"GET", "/v1/usage", "group_by=day", "tz=UTC&tz=Nope/Zone", ""},
		{"GET", "/v1/usage/charges", "", "from=2026-01-01&from=2026-01-02", ""},
		{"GET", "/v1/price", "endpoint=eval", "depth=5&depth=99", ""},
		{"GET", "/v1/charges/" + charge, "", "", ""},
		{"GET", "/v1/webhooks", "", "env=live&env=live", ""},
		{"GET", "/v1/webhooks/" + hook + "/deliveries", "", "", ""},
		{"POST", "/v1/webhooks/" + hook + "/test", "", "", ""},
		{"POST", "/v1/me/verify-email", "", "", ""},
		{"POST", "/v1/billing/portal", "", "", ""},
		{"POST", "/v1/eval", "", "", evalBody(cheapFEN, `"depth":6`)},
		{"POST", "/v1/validate", "", "", `{"fen":"` + startFEN + `"}`},
		{"GET", "/v1/healthz", "", "", ""},
	} {
		t.Run(op.method+" "+op.path, func(t *testing.T) {
			target := func(q string) string {
				if op.query != "" {
					q = op.query + "&" + q
				}
				return op.path + "?" + q
			}
			var body any
			if op.body != "" {
				body = op.body
			}
			refused(t, e.do(op.method, target("bogus=1"), key, body), "is not a parameter of", "bogus")
			refused(t, e.do(op.method, target("bogus=1&bogus=2&Other="), key, body), "is not a parameter of", "Other", "bogus")
			if op.twice != "" {
				name, _, _ := strings.Cut(op.twice, "=")
				refused(t, e.do(op.method, target(op.twice), key, body), "more than once", name)
			}
			if op.body == "" {
				refused(t, e.do(op.method, op.path, key, `{"x":1}`), "takes no request body", "body")
				refused(t, e.do(op.method, op.path, key, "\n"), "takes no request body", "body")
				// a body of unknown length (chunked) is read to tell
				req, err := http.NewRequest(op.method, e.srv.URL+op.path, io.MultiReader(strings.NewReader("{}")))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Authorization", "Bearer "+key)
				refused(t, e.send(req), "takes no request body", "body")
			}
		})
	}

	// POST /eval?depth=99&bogus=1: the query is not read as the body's options
	refused(t, e.do("POST", "/v1/eval?depth=99&bogus=1", key, evalBody(cheapFEN, `"depth":6`)), "is not a parameter of", "bogus", "depth")
	// a query that does not parse is not dropped in silence
	refused(t, e.do("GET", "/v1/keys?env=test;x=1", key, nil), "malformed", "query")
	refused(t, e.do("GET", "/v1/keys?=test", key, nil), "without a name", "query")
	// and what is declared still passes: an empty body of unknown length, a parameter once
	req, err := http.NewRequest("POST", e.srv.URL+"/v1/billing/portal", io.MultiReader(strings.NewReader("")))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if r := e.send(req); r.Status == 400 {
		t.Fatalf("an empty chunked body: %d %s", r.Status, r.Raw)
	}
	if r := e.do("GET", "/v1/usage?group_by=day&tz=UTC", key, nil); r.Status != 200 {
		t.Fatalf("usage: %d %s", r.Status, r.Raw)
	}
	if r := e.do("GET", "/v1/price?endpoint=eval&depth=5", key, nil); r.Status != 200 || r.Body["breakdown"].(map[string]any)["depth"] != 5.0 {
		t.Fatalf("price: %d %s", r.Status, r.Raw)
	}
}
