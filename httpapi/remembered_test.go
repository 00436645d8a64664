package httpapi_test

import (
	"context"
	"testing"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
)

// Costed calls authenticate from memory; the charge checks the key and account have not
// changed since. Whatever changes between two calls takes effect on the second one,
// which is answered as a database lookup would answer it and charged only if allowed.
func TestRememberedKeySeesEveryChange(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name   string
		change func(t *testing.T, key, accountID, keyID string) (next string) // returns the secret to call with next
		status int
		action string
	}{
		{"revoked", func(t *testing.T, key, _, keyID string) string {
			if r := e.do("DELETE", "/v1/keys/"+keyID, key, nil); r.Status != 204 {
				t.Fatalf("revoke: %d %s", r.Status, r.Raw)
			}
			return key
		}, 401, "fix_request"},
		{"rotated without grace", func(t *testing.T, key, _, keyID string) string {
			if r := e.do("POST", "/v1/keys/"+keyID+"/rotate", key, map[string]any{"grace_seconds": 0}); r.Status != 200 && r.Status != 201 {
				t.Fatalf("rotate: %d %s", r.Status, r.Raw)
			}
			return key
		}, 401, "fix_request"},
		{"budget spent", func(t *testing.T, key, _, keyID string) string {
			if r := e.do("PATCH", "/v1/keys/"+keyID, key, map[string]any{"budget_units": 1}); r.Status != 200 {
				t.Fatalf("patch: %d %s", r.Status, r.Raw)
			}
			return key
		}, 402, "raise_budget"},
		{"plan lowered below the call's multipv", func(t *testing.T, key, accountID, _ string) string {
			h := commands.New(eventstore.NewStore(e.pool, nil), testPepper)
			if err := h.ChangePlan(context.Background(), accountID, domain.PlanFree, "test"); err != nil {
				t.Fatal(err)
			}
			return key
		}, 402, "upgrade"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.do("POST", "/v1/signup", "", map[string]string{"email": "remembered-" + tt.name[:4] + "@example.com"})
			if r.Status != 201 {
				t.Fatalf("signup: %d %s", r.Status, r.Raw)
			}
			key, accountID := r.Body["api_key"].(string), r.Body["account_id"].(string)
			h := commands.New(eventstore.NewStore(e.pool, nil), testPepper)
			if err := h.ChangePlan(context.Background(), accountID, domain.PlanPro, "test"); err != nil {
				t.Fatal(err)
			}
			// a key of its own, so that the account's first key can manage it
			secret, keyID := e.createKey(key, map[string]any{"scopes": []string{"eval"}})
			body := map[string]any{"fen": cheapFEN, "depth": 6, "multipv": 4}
			for range 2 { // fresh, then cached: both remembered
				if r := e.do("POST", "/v1/eval", secret, body); r.Status != 200 {
					t.Fatalf("eval before the change: %d %s", r.Status, r.Raw)
				}
			}
			next := tt.change(t, key, accountID, keyID)
			if next == key {
				next = secret
			}
			wantProblem(t, e.do("POST", "/v1/eval", next, body), tt.status, tt.action)
			if events, rows, _ := e.charged(keyID); events != 2 || rows != 2 {
				t.Fatalf("charges after the refused call: %d events, %d rows; want 2", events, rows)
			}
		})
	}
}
