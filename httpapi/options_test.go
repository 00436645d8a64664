package httpapi_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"chessd/engine"
)

// The operator's Hash cap (CHESSD_ENGINE_MAX_HASH_MB) is what GET /engines advertises as
// hash_mb's max and what the validation refuses above: a request over it is the
// ordinary 400 naming options.hash_mb, before any price is reserved or any engine
// taken; not a 400 from the engine, with no errors and the engine's own words.
func TestHashCapIsTheOperators(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cat, err := engine.Open(ctx, engine.Config{PoolSize: 1, QueueWait: 20 * time.Second, MaxHashMB: 64,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	e := newEnv(t, withCatalog(cat), withWorkers(0))

	r := e.do("GET", "/v1/engines", "", nil)
	if r.Status != 200 {
		t.Fatalf("%d %s", r.Status, r.Raw)
	}
	hashMax := func(opts any) float64 {
		for _, o := range opts.([]any) {
			if o := o.(map[string]any); o["name"] == "hash_mb" {
				return o["max"].(float64)
			}
		}
		t.Fatalf("no hash_mb in %v", opts)
		return 0
	}
	if got := hashMax(r.Body["options"]); got != 64 {
		t.Errorf("GET /engines advertises hash_mb max %v under a cap of 64", got)
	}
	for _, v := range r.Body["versions"].([]any) {
		for _, p := range v.(map[string]any)["paths"].([]any) {
			if got := hashMax(p.(map[string]any)["options"]); got > 64 {
				t.Errorf("%s %s advertises hash_mb max %v under a cap of 64", v.(map[string]any)["id"], p.(map[string]any)["path"], got)
			}
		}
	}

	key, keyID := e.signupProID("hash-cap@example.com")
	before := e.searches(t)
	r = e.do("POST", "/v1/eval", key, evalBody(faultFEN, `"depth":4,"options":{"hash_mb":128}`))
	wantProblem(t, r, 400, "fix_request")
	if errs, _ := r.Body["errors"].([]any); len(errs) != 1 || errs[0].(map[string]any)["field"] != "options.hash_mb" ||
		!strings.Contains(errs[0].(map[string]any)["reason"].(string), "from 1 to 64") {
		t.Fatalf("errors do not name options.hash_mb with its range 1 to 64: %s", r.Raw)
	}
	if strings.Contains(r.Raw, "engine:") {
		t.Fatalf("the answer carries the engine's words: %s", r.Raw)
	}
	if n := e.searches(t); n != before {
		t.Fatalf("a refused request reached the engine (%d searches, was %d)", n, before)
	}
	e.caughtUp()
	if n := e.charges(keyID, ""); n != 0 {
		t.Fatalf("a refused request was charged %d times", n)
	}

	r = e.do("POST", "/v1/eval", key, evalBody(faultFEN, `"depth":4,"options":{"hash_mb":64}`))
	if r.Status != 200 {
		t.Fatalf("hash_mb 64 at the cap: %d %s", r.Status, r.Raw)
	}
}
