package httpapi_test

import (
	"net/url"
	"slices"
	"strings"
	"testing"
)

// Test and live are two worlds, in every list: GET /jobs, /disputes, /usage/charges and
// /webhooks show the calling key's env; a live key may ask env=test for the test items
// (pages following their Link stay in test), a test key asking env=live is 403 as on
// GET /keys, and a bad value, a repeat or an unknown parameter is 400 naming it. A
// single item of the other env stays 404.
func TestListsEnv(t *testing.T) {
	e := newEnv(t)
	live := e.signupPro("env-lists@example.com")
	liveID := principalKeyID(t, e, live)
	test, testID := e.createKey(live, map[string]any{"env": "test", "label": "t"})

	// jobs: one live, two test (so that env=test has more than one page of one)
	submit := func(k string) string {
		t.Helper()
		r := e.do("POST", "/v1/batch", k, map[string]any{"fens": []string{startFEN}, "depth": 4})
		if r.Status != 202 {
			t.Fatalf("batch: %d %s", r.Status, r.Raw)
		}
		id := r.Body["job_id"].(string)
		e.waitJob(k, id, finished)
		return id
	}
	liveJobs := []string{submit(live)}
	testJobs := []string{submit(test), submit(test)}
	for _, k := range []string{live, test} {
		if r := e.do("POST", "/v1/eval", k, evalBody(cheapFEN, `"depth":8`)); r.Status != 200 {
			t.Fatalf("eval: %d %s", r.Status, r.Raw)
		}
	}
	e.caughtUp()
	liveCharges, testCharges := e.chargeIDs(liveID), e.chargeIDs(testID)
	if len(liveCharges) != 2 || len(testCharges) != 3 {
		t.Fatalf("charges: %d live, %d test", len(liveCharges), len(testCharges))
	}

	// disputes: one live, two test, each on a charge of its env
	dispute := func(k, chargeID string) string {
		t.Helper()
		r := e.do("POST", "/v1/disputes", k, map[string]any{"charge_ids": []string{chargeID}, "reason": "checking the env"})
		if r.Status != 201 {
			t.Fatalf("dispute: %d %s", r.Status, r.Raw)
		}
		return r.Body["dispute_id"].(string)
	}
	liveDisputes := []string{dispute(live, liveCharges[0])}
	testDisputes := []string{dispute(test, testCharges[0]), dispute(test, testCharges[1])}

	// webhook endpoints: one of each env
	hook := func(k, u string) string {
		t.Helper()
		r := e.do("POST", "/v1/webhooks", k, map[string]any{"url": u})
		if r.Status != 201 {
			t.Fatalf("webhook: %d %s", r.Status, r.Raw)
		}
		return r.Body["id"].(string)
	}
	liveHooks := []string{hook(live, "https://example.com/live")}
	testHooks := []string{hook(test, "https://example.com/test")}

	lists := []struct {
		path, items, id string
		live, test      []string
		hasEnv          bool // the answer says its env at the top
		paged           bool
	}{
		{"/v1/jobs", "jobs", "job_id", liveJobs, testJobs, true, true},
		{"/v1/disputes", "disputes", "dispute_id", liveDisputes, testDisputes, false, true},
		{"/v1/usage/charges", "charges", "charge_id", liveCharges, testCharges, true, true},
		{"/v1/webhooks", "webhooks", "id", liveHooks, testHooks, false, false},
	}
	listed := func(t *testing.T, r response, items, id string) []string {
		t.Helper()
		var out []string
		for _, it := range r.Body[items].([]any) {
			out = append(out, it.(map[string]any)[id].(string))
		}
		return out
	}
	field := func(t *testing.T, r response, name string) {
		t.Helper()
		wantProblem(t, r, 400, "fix_request")
		if !strings.Contains(r.Raw, `"field":"`+name+`"`) {
			t.Fatalf("400 does not name %s: %s", name, r.Raw)
		}
	}
	for _, l := range lists {
		t.Run(l.items, func(t *testing.T) {
			for _, c := range []struct {
				name, key, query, env string
				want                  []string
			}{
				{"live key, default", live, "", "live", l.live},
				{"live key, env=live", live, "env=live", "live", l.live},
				{"live key, env=test", live, "env=test", "test", l.test},
				{"test key, default", test, "", "test", l.test},
				{"test key, env=test", test, "env=test", "test", l.test},
			} {
				r := e.do("GET", l.path+"?"+c.query, c.key, nil)
				if r.Status != 200 {
					t.Fatalf("%s: %d %s", c.name, r.Status, r.Raw)
				}
				got := listed(t, r, l.items, l.id)
				if !sameSet(got, c.want) {
					t.Fatalf("%s: listed %v, want %v", c.name, got, c.want)
				}
				if l.hasEnv && r.Body["env"] != c.env {
					t.Fatalf("%s: env %v, want %s", c.name, r.Body["env"], c.env)
				}
			}
			r := e.do("GET", l.path+"?env=live", test, nil)
			wantProblem(t, r, 403, "fix_request")
			if !strings.HasSuffix(r.Body["type"].(string), "/missing-scope") {
				t.Fatalf("test key, env=live: %s", r.Raw)
			}
			field(t, e.do("GET", l.path+"?env=bogus", live, nil), "env")
			field(t, e.do("GET", l.path+"?env=bogus", test, nil), "env")
			field(t, e.do("GET", l.path+"?env=test&env=test", live, nil), "env")
			field(t, e.do("GET", l.path+"?env=test&nope=1", live, nil), "nope")
			field(t, e.do("GET", l.path+"?nope=1", test, nil), "nope")
			if !l.paged {
				return
			}
			// a page at a time: each next link keeps env=test, and the pages hold the
			// test items only, each once
			var got []string
			next := e.srv.URL + l.path + "?env=test&limit=1"
			for pages := 1; next != ""; pages++ {
				if pages > len(l.test) {
					t.Fatalf("more pages than test items: %v", got)
				}
				r := e.do("GET", strings.TrimPrefix(next, e.srv.URL), live, nil)
				if r.Status != 200 {
					t.Fatalf("page %d: %d %s", pages, r.Status, r.Raw)
				}
				got = append(got, listed(t, r, l.items, l.id)...)
				next = ""
				if link := r.Header.Get("Link"); link != "" {
					u, err := url.Parse(strings.TrimSuffix(strings.TrimPrefix(link, "<"), `>; rel="next"`))
					if err != nil || u.Query().Get("env") != "test" || !strings.HasPrefix(link, "<http://chessd.test/v1/") {
						t.Fatalf("page %d: Link %q does not stay in test", pages, link)
					}
					next = e.srv.URL + strings.TrimPrefix(u.String(), "http://chessd.test")
				}
			}
			if len(got) != len(l.test) || !sameSet(got, l.test) {
				t.Fatalf("paged with env=test: %v, want %v", got, l.test)
			}
		})
	}

	// a single item of the other env stays 404, env=test or not
	wantProblem(t, e.do("GET", "/v1/jobs/"+testJobs[0], live, nil), 404, "fix_request")
	wantProblem(t, e.do("GET", "/v1/disputes/"+testDisputes[0], live, nil), 404, "fix_request")
	wantProblem(t, e.do("GET", "/v1/charges/"+testCharges[0], live, nil), 404, "fix_request")
	wantProblem(t, e.do("GET", "/v1/webhooks/"+testHooks[0]+"/deliveries", live, nil), 404, "fix_request")
}

// sameSet reports whether a and b hold the same strings, in any order.
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
