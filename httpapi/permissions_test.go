package httpapi_test

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"chessd/domain"
)

// spend makes a charged call with key and checks that the key's balance counts it.
func (e *env) spend(key, keyID string) {
	e.t.Helper()
	if r := e.do("POST", "/v1/eval", key, evalBody(cheapFEN, `"depth":6`)); r.Status != 200 {
		e.t.Fatalf("eval: %d %s", r.Status, r.Raw)
	}
	if err := e.meter.Flush(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	var spent int64
	if err := e.pool.QueryRow(context.Background(), `SELECT spent_units FROM key_balances WHERE key_id = $1`, keyID).Scan(&spent); err != nil || spent <= 0 {
		e.t.Fatalf("a charged call left spent_units %d (%v)", spent, err)
	}
}

// keyRecord is keyID's record as GET /keys (with env, when given) lists it to key.
func (e *env) keyRecord(key, keyID, env string) map[string]any {
	e.t.Helper()
	path := "/v1/keys"
	if env != "" {
		path += "?env=" + env
	}
	r := e.do("GET", path, key, nil)
	if r.Status != 200 {
		e.t.Fatalf("list keys: %d %s", r.Status, r.Raw)
	}
	for _, k := range r.Body["keys"].([]any) {
		if k := k.(map[string]any); k["key_id"] == keyID {
			return k
		}
	}
	e.t.Fatalf("key %s not listed: %s", keyID, r.Raw)
	return nil
}

// TestKeyPermissions: a key acts only on keys of its own env whose scopes it holds,
// and never hands out a scope, an env or a budget it does not hold itself.
func TestKeyPermissions(t *testing.T) {
	e := newEnv(t)
	root, _ := e.signup("perm@example.com")
	keysOnly, _ := e.createKey(root, map[string]any{"label": "kw", "scopes": []string{"keys:write"}})
	keysEval, _ := e.createKey(root, map[string]any{"label": "kwe", "scopes": []string{"keys:write", "eval"}})
	testAll, _ := e.createKey(root, map[string]any{"label": "test-all", "env": "test"})
	budgeted, budgetedID := e.createKey(root, map[string]any{"label": "b", "scopes": []string{"eval", "keys:write"}, "budget_units": 1000})
	e.spend(budgeted, budgetedID) // it holds a lease now: what it has left is below its budget

	// fresh makes a new target key with root (or by, when given) for one case.
	fresh := func(by string, body map[string]any) func() string {
		return func() string {
			if by == "" {
				by = root
			}
			_, id := e.createKey(by, body)
			return id
		}
	}
	allScopes := fresh("", map[string]any{"label": "all"})
	evalOnly := fresh("", map[string]any{"label": "eval", "scopes": []string{"eval"}})
	testEval := fresh(testAll, map[string]any{"label": "test-eval", "scopes": []string{"eval"}})
	child := fresh(budgeted, map[string]any{"label": "child", "scopes": []string{"eval"}, "budget_units": 10})
	rootBudgeted := fresh("", map[string]any{"label": "rb", "scopes": []string{"eval"}, "budget_units": 5})
	self := func() string { return budgetedID }
	none := func() string { return "" }

	cases := []struct {
		name   string
		actor  string
		op     string // create, update, rotate, revoke
		target func() string
		body   map[string]any
		status int
	}{
		// create
		{"create: grant a scope it lacks", keysOnly, "create", none, map[string]any{"scopes": []string{"eval"}}, 403},
		{"create: its own scopes", keysOnly, "create", none, map[string]any{"label": "x"}, 201},
		{"create: test key makes a live key", testAll, "create", none, map[string]any{"env": "live"}, 403},
		{"create: live key makes a test key", root, "create", none, map[string]any{"env": "test"}, 201},
		{"create: budgeted makes unbudgeted", budgeted, "create", none, map[string]any{"scopes": []string{"eval"}}, 403},
		{"create: budgeted over what it has left", budgeted, "create", none, map[string]any{"budget_units": 1000}, 403},
		{"create: budgeted within what it has left", budgeted, "create", none, map[string]any{"budget_units": 10}, 201},
		{"create: budgeted, a budget kind it has none of", budgeted, "create", none, map[string]any{"budget_units": 1, "budget_usd": "99"}, 201},
		// update
		{"update: scope superset target", keysOnly, "update", allScopes, map[string]any{"label": "mine"}, 403},
		{"update: scope subset target", keysEval, "update", evalOnly, map[string]any{"label": "mine"}, 200},
		{"update: grant a scope it lacks", keysEval, "update", evalOnly, map[string]any{"scopes": []string{"eval", "jobs"}}, 403},
		{"update: test key, live target", testAll, "update", evalOnly, map[string]any{"label": "mine"}, 404},
		{"update: live key, test target", root, "update", testEval, map[string]any{"label": "mine"}, 403},
		{"update: raise its own budget", budgeted, "update", self, map[string]any{"budget_units": 5000}, 403},
		{"update: clear its own budget", budgeted, "update", self, map[string]any{"budget_units": nil}, 403},
		{"update: clear a budget", budgeted, "update", child, map[string]any{"budget_units": nil}, 403},
		{"update: over what it has left", budgeted, "update", child, map[string]any{"budget_units": 1000}, 403},
		{"update: a raise past what it has left", budgeted, "update", child, map[string]any{"budget_units": 995}, 403},
		{"update: a raise within what it has left", budgeted, "update", child, map[string]any{"budget_units": 20}, 200},
		{"update: tighten an unbudgeted key", budgeted, "update", evalOnly, map[string]any{"budget_units": 5000}, 200},
		{"update: its own label", budgeted, "update", self, map[string]any{"label": "b2"}, 200},
		// rotate
		{"rotate: scope superset target", keysOnly, "rotate", allScopes, nil, 403},
		{"rotate: test key, live target", testAll, "rotate", evalOnly, nil, 404},
		{"rotate: live key, test target", root, "rotate", testEval, nil, 403},
		{"rotate: budgeted, unbudgeted target", budgeted, "rotate", evalOnly, nil, 403},
		{"rotate: budgeted, a key it handed its budget", budgeted, "rotate", child, nil, 201},
		{"rotate: budgeted, a budgeted key it did not budget", budgeted, "rotate", rootBudgeted, nil, 403},
		{"rotate: scope subset target", keysEval, "rotate", evalOnly, nil, 201},
		{"rotate: test key, test target", testAll, "rotate", testEval, nil, 201},
		// revoke
		{"revoke: scope superset target", keysOnly, "revoke", allScopes, nil, 403},
		{"revoke: test key, live target", testAll, "revoke", evalOnly, nil, 404},
		{"revoke: live key, test target", root, "revoke", testEval, nil, 403},
		{"revoke: scope subset target", keysEval, "revoke", evalOnly, nil, 204},
		{"revoke: test key, test target", testAll, "revoke", testEval, nil, 204},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := tc.target()
			var r response
			switch tc.op {
			case "create":
				r = e.do("POST", "/v1/keys", tc.actor, tc.body)
			case "update":
				r = e.do("PATCH", "/v1/keys/"+id, tc.actor, tc.body)
			case "rotate":
				r = e.do("POST", "/v1/keys/"+id+"/rotate", tc.actor, nil)
			case "revoke":
				r = e.do("DELETE", "/v1/keys/"+id, tc.actor, nil)
			}
			if tc.status >= 400 {
				wantProblem(t, r, tc.status, "fix_request")
				if strings.Contains(r.Raw, "ce_live_") || strings.Contains(r.Raw, "ce_test_") {
					t.Fatalf("a refusal carries a secret: %s", r.Raw)
				}
				return
			}
			if r.Status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.Status, tc.status, r.Raw)
			}
		})
	}
}

// A budgeted key's handovers come out of its own budget: a key budgeted at one eval
// that hands it to a key it creates has nothing left to hand a second key (before,
// five keys it made spent five evals), nor to spend itself; what the two spend never
// passes what it was given, a raise it gives a key comes out of it too, and the
// actor's event says where its budget went.
func TestABudgetedKeyHandsOverItsOwnBudget(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	root, _ := e.signup("handover@example.com")
	r := e.do("GET", "/v1/price?endpoint=eval&depth=6", root, nil)
	if r.Status != 200 {
		t.Fatalf("price: %d %s", r.Status, r.Raw)
	}
	price := int64(r.Body["units"].(float64))
	budgeted, budgetedID := e.createKey(root, map[string]any{"label": "b", "scopes": []string{"eval", "keys:write"}, "budget_units": price})

	var children []string
	var childIDs []string
	for i := range 5 {
		r := e.do("POST", "/v1/keys", budgeted, map[string]any{"label": fmt.Sprint("c", i), "scopes": []string{"eval"}, "budget_units": price})
		switch r.Status {
		case 201:
			children, childIDs = append(children, r.Body["api_key"].(string)), append(childIDs, r.Body["key_id"].(string))
		default:
			wantProblem(t, r, 403, "fix_request")
		}
	}
	if len(children) != 1 {
		t.Fatalf("a key budgeted at one eval made %d keys budgeted at one eval each", len(children))
	}
	if got := e.keyRecord(root, budgetedID, "")["budget_units"]; got != 0.0 {
		t.Fatalf("the creator's budget after handing it all over: %v, want 0", got)
	}
	if got := e.keyRecord(root, childIDs[0], "")["budget_from"]; got != budgetedID {
		t.Fatalf("the key it budgeted shows budget_from %v, want %s", got, budgetedID)
	}
	var to string
	var units int64
	if err := e.pool.QueryRow(ctx, `SELECT payload->'handover'->>'to', (payload->'handover'->>'units')::bigint FROM events
		WHERE stream_id = $1 AND event_type = 'KeyUpdated'`, domain.KeyStream(budgetedID)).Scan(&to, &units); err != nil || to != childIDs[0] || units != price {
		t.Fatalf("the creator's KeyUpdated hands over %d units to %q (%v), want %d to %s", units, to, err, price, childIDs[0])
	}

	// spend: every key tries a fresh position; one eval's worth goes through in all
	fens := jobFENs(4)
	evalEach := func(fen string) (ok int) {
		for _, key := range append([]string{budgeted}, children...) {
			switch r := e.do("POST", "/v1/eval", key, evalBody(fen, `"depth":6`)); r.Status {
			case 200:
				ok++
			default:
				wantProblem(t, r, 402, "raise_budget")
			}
		}
		return ok
	}
	if n := evalEach(fens[0]) + evalEach(fens[1]); n != 1 {
		t.Fatalf("a budget of one eval paid for %d", n)
	}

	// the budgeted key rotates the key it budgeted, not one the account's root budgeted
	r = e.do("POST", "/v1/keys/"+childIDs[0]+"/rotate", budgeted, nil)
	if r.Status != 201 {
		t.Fatalf("rotate the key it budgeted: %d %s", r.Status, r.Raw)
	}
	children[0] = r.Body["api_key"].(string)
	_, rootMade := e.createKey(root, map[string]any{"label": "r", "scopes": []string{"eval"}, "budget_units": 0})
	wantProblem(t, e.do("POST", "/v1/keys/"+rootMade+"/rotate", budgeted, nil), 403, "fix_request")
	if got := e.keyRecord(root, rootMade, "")["budget_from"]; got != nil {
		t.Fatalf("a key the root made shows budget_from %v, want null", got)
	}

	// given one more eval, it raises its child by one: the raise comes out of it
	if r := e.do("PATCH", "/v1/keys/"+budgetedID, root, map[string]any{"budget_units": price}); r.Status != 200 {
		t.Fatalf("raise the creator: %d %s", r.Status, r.Raw)
	}
	if r := e.do("PATCH", "/v1/keys/"+childIDs[0], budgeted, map[string]any{"budget_units": 2 * price}); r.Status != 200 {
		t.Fatalf("raise the child: %d %s", r.Status, r.Raw)
	}
	if got := e.keyRecord(root, budgetedID, "")["budget_units"]; got != 0.0 {
		t.Fatalf("the creator's budget after handing its raise over: %v, want 0", got)
	}
	if n := evalEach(fens[2]) + evalEach(fens[3]); n != 1 {
		t.Fatalf("a raise of one eval paid for %d", n)
	}
	if err := e.meter.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var spent int64
	if err := e.pool.QueryRow(ctx, `SELECT sum(spent_units) FROM key_balances WHERE key_id = ANY($1)`,
		append([]string{budgetedID}, childIDs...)).Scan(&spent); err != nil || spent > 2*price {
		t.Fatalf("the creator and its key spent %d units (%v) of the %d it was given", spent, err, 2*price)
	}
}

// What a budgeted key hands over leaves what its calls hold: the units this server's
// lease reserved for its next calls stay its own, so with them the creator and its key
// still fit in the creator's budget (spent + held never passes it), and its next calls,
// at once, are served from them rather than refused.
func TestAHandoverLeavesWhatItsCallsHold(t *testing.T) {
	e := newEnv(t, withLeaseIdle(time.Minute)) // the lease stays until the calls after the handover
	ctx := context.Background()
	root, _ := e.signup("held@example.com")
	budgeted, budgetedID := e.createKey(root, map[string]any{"label": "b", "scopes": []string{"eval", "keys:write"}, "budget_units": 1000})
	e.spend(budgeted, budgetedID)
	balance := func() (spent, held, budget int64) {
		t.Helper()
		if err := e.pool.QueryRow(ctx, `SELECT spent_units, held_units, budget_units FROM key_balances WHERE key_id = $1`, budgetedID).
			Scan(&spent, &held, &budget); err != nil {
			t.Fatal(err)
		}
		return spent, held, budget
	}
	spent, held, _ := balance()
	if held == 0 {
		t.Fatal("a key that just made a call holds no lease")
	}
	wantProblem(t, e.do("POST", "/v1/keys", budgeted, map[string]any{"scopes": []string{"eval"}, "budget_units": 1000 - spent}), 403, "fix_request")
	e.createKey(budgeted, map[string]any{"scopes": []string{"eval"}, "budget_units": 1000 - spent - held})
	// its next calls, at once, within what its lease held: the stale lease is given
	// back before a new one is taken, and the calls meanwhile wait for it
	fens := jobFENs(5)[1:]
	answers := make(chan response, len(fens))
	for _, fen := range fens {
		go func() { answers <- e.do("POST", "/v1/eval", budgeted, evalBody(fen, `"depth":6`)) }()
	}
	for range fens {
		if r := <-answers; r.Status != 200 {
			t.Fatalf("a call within what its lease held: %d %s", r.Status, r.Raw)
		}
	}
	if err := e.meter.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if s, h, budget := balance(); s+h > budget || budget != spent+held {
		t.Fatalf("spent %d and held %d of a budget of %d, want a budget of %d (what it had spent and held)", s, h, budget, spent+held)
	}
}

// The case: a key holding only keys:write rotated a key with every scope and
// received its secret.
func TestKeysWriteOnlyCannotRotateAStrongerKey(t *testing.T) {
	e := newEnv(t)
	root, rootID := e.signup("climb@example.com")
	weak, _ := e.createKey(root, map[string]any{"scopes": []string{"keys:write"}})
	before := e.keyRecord(root, rootID, "")

	r := e.do("POST", "/v1/keys/"+rootID+"/rotate", weak, nil)
	wantProblem(t, r, 403, "fix_request")
	if _, ok := r.Body["api_key"]; ok || strings.Contains(r.Raw, "ce_live_") {
		t.Fatalf("the refusal hands out a secret: %s", r.Raw)
	}
	if s := e.probe(root); s != 200 {
		t.Fatalf("the stronger key's secret stopped working: %d", s)
	}
	if after := e.keyRecord(root, rootID, ""); !reflect.DeepEqual(before, after) {
		t.Fatalf("the stronger key changed:\n%v\n%v", before, after)
	}
}

// Test and live are two worlds: a test key cannot see, read or cancel a live job, nor
// see live usage or keys; a live key cannot see a test job either.
func TestTestKeySeesNothingLive(t *testing.T) {
	e := newEnv(t)
	live, liveID := e.signup("worlds@example.com")
	test, testID := e.createKey(live, map[string]any{"env": "test", "label": "t"})

	submit := func(key string) string {
		t.Helper()
		r := e.do("POST", "/v1/batch", key, map[string]any{"fens": jobFENs(1), "depth": 6})
		if r.Status != 202 {
			t.Fatalf("batch: %d %s", r.Status, r.Raw)
		}
		return r.Body["job_id"].(string)
	}
	liveJob, testJob := submit(live), submit(test)
	e.waitJob(live, liveJob, finished)
	e.waitJob(test, testJob, finished)
	e.caughtUp()

	for _, tc := range []struct {
		key, job string
	}{{test, liveJob}, {live, testJob}} {
		for _, req := range []struct{ method, path string }{
			{"GET", "/v1/jobs/" + tc.job},
			{"GET", "/v1/jobs/" + tc.job + "/result"},
			{"GET", "/v1/jobs/" + tc.job + "/events"},
			{"DELETE", "/v1/jobs/" + tc.job},
		} {
			r := e.do(req.method, req.path, tc.key, nil)
			wantProblem(t, r, 404, "fix_request")
			missing := e.do(req.method, strings.Replace(req.path, tc.job, "job_doesnotexist", 1), tc.key, nil)
			if r.Body["title"] != missing.Body["title"] || strings.ReplaceAll(r.Body["detail"].(string), tc.job, "") !=
				strings.ReplaceAll(missing.Body["detail"].(string), "job_doesnotexist", "") {
				t.Fatalf("%s %s: another env's job is told apart from a missing one:\n%s\n%s", req.method, req.path, r.Raw, missing.Raw)
			}
		}
	}
	if j := e.do("GET", "/v1/jobs/"+liveJob, live, nil); j.Status != 200 || j.Body["state"] != "succeeded" {
		t.Fatalf("the live job, to its own key: %d %s", j.Status, j.Raw)
	}

	usage := e.do("GET", "/v1/usage?group_by=key,env", test, nil)
	if usage.Status != 200 || strings.Contains(usage.Raw, liveID) || strings.Contains(usage.Raw, `"live"`) {
		t.Fatalf("a test key sees live usage: %s", usage.Raw)
	}
	me := e.do("GET", "/v1/me", test, nil)
	if me.Status != 200 || strings.Contains(me.Raw, liveID) || me.Body["keys"].(map[string]any)["total"] != float64(1) {
		t.Fatalf("a test key's /me shows live keys: %s", me.Raw)
	}
	if list := e.do("GET", "/v1/keys", test, nil); strings.Contains(list.Raw, liveID) || !strings.Contains(list.Raw, testID) {
		t.Fatalf("a test key's list: %s", list.Raw)
	}
	wantProblem(t, e.do("GET", "/v1/keys?env=live", test, nil), 403, "fix_request")
	if list := e.do("GET", "/v1/keys", live, nil); strings.Contains(list.Raw, testID) {
		t.Fatalf("a live key's list shows test keys unless asked: %s", list.Raw)
	}
	if list := e.do("GET", "/v1/keys?env=test", live, nil); !strings.Contains(list.Raw, testID) || strings.Contains(list.Raw, liveID) {
		t.Fatalf("a live key's list of test keys: %s", list.Raw)
	}
}

// Every key answer shows the record GET /keys shows: spend and last use included.
func TestKeyAnswersAreTheListedRecord(t *testing.T) {
	e := newEnv(t)
	root, _ := e.signup("record@example.com")
	key, id := e.createKey(root, map[string]any{"label": "used", "scopes": []string{"eval"}, "budget_units": 5000})
	e.spend(key, id)
	e.spend(key, id)

	same := func(what string, r response) {
		t.Helper()
		delete(r.Body, "api_key")
		// GET /keys reads the keys projection, which the change's answer waits for at
		// most a second: on a loaded machine give it longer
		deadline := time.Now().Add(10 * time.Second)
		for {
			listed := e.keyRecord(root, id, "")
			if listed["spent_units"].(float64) <= 0 || listed["last_used_at"] == nil {
				t.Fatalf("listed record without its use: %v", listed)
			}
			if reflect.DeepEqual(r.Body, listed) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s answers\n%v\nGET /keys lists\n%v", what, r.Body, listed)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	patched := e.do("PATCH", "/v1/keys/"+id, root, map[string]any{"label": "used-2"})
	if patched.Status != 200 {
		t.Fatalf("patch: %d %s", patched.Status, patched.Raw)
	}
	same("PATCH", patched)
	rotated := e.do("POST", "/v1/keys/"+id+"/rotate", root, nil)
	if rotated.Status != 201 {
		t.Fatalf("rotate: %d %s", rotated.Status, rotated.Raw)
	}
	same("rotate", rotated)
}
