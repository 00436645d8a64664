package domain

import (
	"strings"
	"testing"
	"time"
)

// A budget set before budgets were bounded (MaxBudgetUnits) stays until changed: a
// change of something else goes through, and a budget given in a change is bounded.
func TestBudgetsSetBeforeTheBound(t *testing.T) {
	now := time.Now()
	huge := int64(MaxBudgetUnits) * 100
	key := RehydrateKey([]Event{&KeyCreated{KeyID: "key_old", AccountID: "acct_1", Scopes: AllScopes, Env: "live", BudgetUnits: &huge}})
	acct := RehydrateAccount([]Event{
		&AccountCreated{AccountID: "acct_1", Email: "old@example.com", Plan: "free"},
		&AccountBudgetSet{Env: "live", BudgetUnits: &huge, Period: PeriodMonth, SetAt: now},
	})
	admin := testKey("key_admin", EnvLive, nil, AllScopes...)
	for _, tc := range []struct {
		name string
		do   func() error
		want string // "" when allowed
	}{
		{"key: a new label", func() error {
			_, _, err := key.Update(KeyChange{Label: ptr("renamed")}, admin, Headroom{}, now)
			return err
		}, ""},
		{"key: a new period", func() error {
			_, _, err := key.Update(KeyChange{Budget: BudgetChange{Period: PeriodDay}}, admin, Headroom{}, now)
			return err
		}, ""},
		{"key: a budget past the bound", func() error {
			_, _, err := key.Update(KeyChange{Budget: BudgetChange{Units: ptr(huge)}}, admin, Headroom{}, now)
			return err
		}, "budget_units"},
		{"account: a new period", func() error {
			_, err := acct.SetBudget(EnvLive, BudgetChange{Period: PeriodDay}, admin, now)
			return err
		}, ""},
		{"account: a budget past the bound", func() error {
			_, err := acct.SetBudget(EnvLive, BudgetChange{Units: ptr(huge)}, admin, now)
			return err
		}, "budget_units"},
	} {
		err := tc.do()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want a refusal naming %s", tc.name, err, tc.want)
		}
	}
}
