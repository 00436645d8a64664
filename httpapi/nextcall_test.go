package httpapi_test

import (
	"context"
	"fmt"
	"testing"

	"chessd/commands"
	"chessd/domain"
	"chessd/engine"
	"chessd/eventstore"
)

// searches counts the searches the default native pool has run so far.
func (e *env) searches(t *testing.T) int64 {
	t.Helper()
	pool, err := e.svc.Catalog().Pool(context.Background(), "latest", engine.PathNative)
	if err != nil {
		t.Fatal(err)
	}
	return pool.Stats().Searches
}

// A change of key, plan or account takes effect on the very next call, whichever server
// it reaches: here two API servers share one database, the change is made through one
// and the next call goes to the other, which had the key remembered from earlier calls.
func TestNextCallSeesChangesOnEveryServer(t *testing.T) {
	a := newEnv(t)
	b := newEnv(t, onPool(a.pool), withWorkers(0))
	h := commands.New(eventstore.NewStore(a.pool, nil), testPepper)
	fresh := []string{ // positions nobody else evaluates, so each would need a search
		"r1bqkb1r/pppp1ppp/2n2n2/4p3/2B1P3/5N2/PPPP1PPP/RNBQK2R w KQkq - 4 4",
		"rnbqkb1r/pp2pppp/3p1n2/8/3NP3/8/PPP2PPP/RNBQKB1R w KQkq - 1 5",
		"rnbqk2r/pppp1ppp/5n2/2b1p3/2B1P3/5N2/PPPP1PPP/RNBQK2R w KQkq - 4 4",
		"r1bqkbnr/pp1ppppp/2n5/2p5/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
	}
	patchScopes := func(scopes ...string) func(*testing.T, string, string, string) {
		return func(t *testing.T, admin, _, keyID string) {
			if r := a.do("PATCH", "/v1/keys/"+keyID, admin, map[string]any{"scopes": scopes}); r.Status != 200 {
				t.Fatalf("patch: %d %s", r.Status, r.Raw)
			}
		}
	}
	changePlan := func(plan domain.Plan) func(*testing.T, string, string, string) {
		return func(t *testing.T, _, accountID, _ string) {
			if err := h.ChangePlan(context.Background(), accountID, plan, "test"); err != nil {
				t.Fatal(err)
			}
		}
	}
	revoke := func(t *testing.T, admin, _, keyID string) {
		if r := a.do("DELETE", "/v1/keys/"+keyID, admin, nil); r.Status != 204 {
			t.Fatalf("revoke: %d %s", r.Status, r.Raw)
		}
	}
	cheap := map[string]any{"fen": cheapFEN, "depth": 4}
	cheapWide := map[string]any{"fen": cheapFEN, "depth": 4, "multipv": 5} // above the free plan's multipv cap
	tests := []struct {
		name          string
		scopes        []string
		pro           bool // the account starts on the pro plan
		before        map[string]any
		beforeStatus  int
		change        func(t *testing.T, admin, accountID, keyID string)
		after         map[string]any // a refused one would need a search: refused before it?
		afterStatus   int
		afterNextStep string
	}{
		{"plan raised lifts the cap", []string{"eval"}, false, cheapWide, 402, changePlan(domain.PlanPro), cheapWide, 200, ""},
		{"scope added by PATCH", []string{"usage:read"}, false, cheap, 403, patchScopes("eval", "usage:read"), cheap, 200, ""},
		{"scope removed by PATCH", []string{"eval", "usage:read"}, false, cheap, 200, patchScopes("usage:read"),
			map[string]any{"fen": fresh[0], "depth": 18}, 403, "fix_request"},
		{"revoked", []string{"eval"}, false, cheap, 200, revoke,
			map[string]any{"fen": fresh[1], "depth": 18}, 401, "fix_request"},
		{"plan lowered", []string{"eval"}, true, cheapWide, 200, changePlan(domain.PlanFree),
			map[string]any{"fen": fresh[2], "depth": 18, "multipv": 5}, 402, "upgrade"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := a.do("POST", "/v1/signup", "", map[string]string{"email": fmt.Sprintf("nextcall-%d@example.com", i)})
			if r.Status != 201 {
				t.Fatalf("signup: %d %s", r.Status, r.Raw)
			}
			admin, accountID := r.Body["api_key"].(string), r.Body["account_id"].(string)
			if tt.pro {
				changePlan(domain.PlanPro)(t, admin, accountID, "")
			}
			secret, keyID := a.createKey(admin, map[string]any{"scopes": tt.scopes})
			for range 2 { // b remembers the key and its account from these calls
				if got := b.do("POST", "/v1/eval", secret, tt.before); got.Status != tt.beforeStatus {
					t.Fatalf("before the change: %d, want %d: %s", got.Status, tt.beforeStatus, got.Raw)
				}
			}
			tt.change(t, admin, accountID, keyID)
			searches := b.searches(t)
			got := b.do("POST", "/v1/eval", secret, tt.after)
			if tt.afterStatus == 200 {
				if got.Status != 200 {
					t.Fatalf("after the change: %d %s", got.Status, got.Raw)
				}
				return
			}
			wantProblem(t, got, tt.afterStatus, tt.afterNextStep)
			if n := b.searches(t) - searches; n != 0 {
				t.Fatalf("the refused call ran %d searches first", n)
			}
		})
	}
}

// A cached answer echoes the FEN of its own request, not of the request that filled the
// cache (same position and halfmove clock, another fullmove number).
func TestCachedAnswerEchoesItsOwnFEN(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("echo@example.com")
	first := "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"
	second := "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 17"
	for _, tc := range []struct {
		fen    string
		cached bool
	}{{first, false}, {second, true}, {first, true}} {
		for _, path := range []string{"/v1/eval", "/v1/bestmove"} {
			r := e.do("POST", path, key, map[string]any{"fen": tc.fen, "depth": 5})
			if r.Status != 200 {
				t.Fatalf("%s %s: %d %s", path, tc.fen, r.Status, r.Raw)
			}
			if path == "/v1/eval" && r.Body["fen"] != tc.fen {
				t.Fatalf("%s answered fen %v for a request of %s", path, r.Body["fen"], tc.fen)
			}
			if tc.cached && r.Body["cached"] != true {
				t.Fatalf("%s %s: not cached", path, tc.fen)
			}
		}
	}
}

// Every costed answer says what was charged and what the call costs: a keyless call is
// charged nothing.
func TestCostedAnswersSayWhatWasCharged(t *testing.T) {
	e := newEnv(t)
	key, keyID := e.signup("charged@example.com")
	body := map[string]any{"fen": cheapFEN, "depth": 6}
	price := e.do("GET", "/v1/price?endpoint=eval&depth=6", key, nil)
	if price.Status != 200 {
		t.Fatalf("price: %d %s", price.Status, price.Raw)
	}
	tests := []struct {
		name, path, key string
		cached          bool
		charged         bool
	}{
		{"keyless fresh", "/v1/eval", "", false, false},
		{"keyless cached", "/v1/bestmove", "", true, false},
		{"keyed cached", "/v1/eval", key, true, true},
		{"keyed cached bestmove", "/v1/bestmove", key, true, true},
	}
	var charged float64
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.do("POST", tt.path, tt.key, body)
			if r.Status != 200 {
				t.Fatalf("%d %s", r.Status, r.Raw)
			}
			want := price.Body["units"]
			if tt.cached {
				want = price.Body["cached_units"]
			}
			if r.Body["price_units"] != want {
				t.Fatalf("price_units %v, want %v", r.Body["price_units"], want)
			}
			cost := want
			if !tt.charged {
				cost = float64(0)
			}
			if r.Body["cost_units"] != cost {
				t.Fatalf("cost_units %v, want %v (charged: %v)", r.Body["cost_units"], cost, tt.charged)
			}
			if tt.charged {
				charged += cost.(float64)
			}
		})
	}
	if _, _, spent := e.charged(keyID); float64(spent) != charged {
		t.Fatalf("the ledger charged %d units, the answers said %v", spent, charged)
	}
}
