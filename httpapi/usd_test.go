package httpapi_test

import (
	"fmt"
	"testing"
)

// A USD amount is a JSON number or a string of digits with at most 6 decimals, as the
// OpenAPI document's USDInput says, on every endpoint that takes one: the decimal
// decoder alone also read "1e3" as 1000 and "-0" as a zero budget.
func TestUSDInputAsDocumented(t *testing.T) {
	e := newEnv(t)
	key, _ := e.signup("usd@example.com")
	_, id := e.createKey(key, map[string]any{"label": "usd"})
	endpoints := []struct{ method, path string }{{"POST", "/v1/keys"}, {"PATCH", "/v1/keys/" + id}, {"PATCH", "/v1/me"}}
	cases := []struct {
		value string // the JSON value of budget_usd
		want  string // the budget set; "": refused naming budget_usd
	}{
		{`"5"`, "5.000000"},
		{`"5.50"`, "5.500000"},
		{`"0.000001"`, "0.000001"},
		{`7`, "7.000000"},
		{`2.25`, "2.250000"},
		{`"1e3"`, ""},
		{`"1E2"`, ""},
		{`"5e-1"`, ""},
		{`"+5"`, ""},
		{`".5"`, ""},
		{`"5."`, ""},
		{`"-0"`, ""},
		{`" 5"`, ""},
		{`"0.0000001"`, ""},
		{`"five"`, ""},
		{`true`, ""},
	}
	for _, ep := range endpoints {
		for _, c := range cases {
			t.Run(fmt.Sprintf("%s %s %s", ep.method, ep.path, c.value), func(t *testing.T) {
				body := fmt.Sprintf(`{"label":"usd","budget_usd":%s}`, c.value)
				if ep.path == "/v1/me" {
					body = fmt.Sprintf(`{"budget_usd":%s}`, c.value)
				}
				r := e.do(ep.method, ep.path, key, body)
				if c.want == "" {
					wantProblem(t, r, 400, "fix_request")
					if !namesField(r, "budget_usd") {
						t.Fatalf("the refusal does not name budget_usd: %s", r.Raw)
					}
					return
				}
				if r.Status/100 != 2 {
					t.Fatalf("%d %s", r.Status, r.Raw)
				}
				got := r.Body["budget_usd"]
				if b, ok := r.Body["budget"].(map[string]any); ok { // PATCH /me: the account's
					got = b["budget_usd"]
				}
				if got != c.want {
					t.Fatalf("budget_usd %v, want %s", got, c.want)
				}
			})
		}
	}
}

// namesField says whether a problem's errors name field.
func namesField(r response, field string) bool {
	errs, _ := r.Body["errors"].([]any)
	for _, x := range errs {
		if m, _ := x.(map[string]any); m["field"] == field {
			return true
		}
	}
	return false
}
