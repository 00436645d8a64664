package domain

import (
	"encoding/hex"
	"testing"
	"time"

	"github.com/shopspring/decimal"
)

func testKey(id string, env Env, units *int64, scopes ...Scope) *Key {
	return RehydrateKey([]Event{&KeyCreated{KeyID: id, AccountID: "acct_1", Scopes: scopes, Env: env.String(), BudgetUnits: units}})
}

func ptr[T any](v T) *T { return &v }

// The budget rule alone: a budgeted key gives out only budgets within what it has left,
// and what it gives comes out of its own (the handover: a new key's budget, a raise's
// difference); tightening grants nothing, the other kind of budget is not its to
// limit, and a test key made by a live key costs nothing live.
func TestBudgetRule(t *testing.T) {
	now := time.Now()
	actor := testKey("key_a", EnvLive, ptr[int64](100), AllScopes...)
	left := Headroom{Units: ptr[int64](40)}
	target := testKey("key_t", EnvLive, ptr[int64](90), ScopeEval)
	unbudgeted := testKey("key_u", EnvLive, nil, ScopeEval)
	cases := []struct {
		name   string
		key    *Key // nil: create
		set    KeySettings
		c      KeyChange
		ok     bool
		handed int64 // units taken out of the actor's budget
	}{
		{"create within", nil, KeySettings{Scopes: []Scope{ScopeEval}, Env: EnvLive, BudgetUnits: ptr[int64](40)}, KeyChange{}, true, 40},
		{"create over", nil, KeySettings{Scopes: []Scope{ScopeEval}, Env: EnvLive, BudgetUnits: ptr[int64](41)}, KeyChange{}, false, 0},
		{"create unbudgeted", nil, KeySettings{Scopes: []Scope{ScopeEval}, Env: EnvLive}, KeyChange{}, false, 0},
		{"create with a USD budget only", nil, KeySettings{Scopes: []Scope{ScopeEval}, Env: EnvLive, BudgetUSD: ptr(decimal.New(5, 0))}, KeyChange{}, false, 0},
		{"create a test key", nil, KeySettings{Scopes: []Scope{ScopeEval}, Env: EnvTest, BudgetUnits: ptr[int64](40)}, KeyChange{}, true, 0},
		{"lower above left", target, KeySettings{}, KeyChange{Budget: BudgetChange{Units: ptr[int64](80)}}, true, 0},
		{"raise within left", target, KeySettings{}, KeyChange{Budget: BudgetChange{Units: ptr[int64](130)}}, true, 40},
		{"raise past left", target, KeySettings{}, KeyChange{Budget: BudgetChange{Units: ptr[int64](131)}}, false, 0},
		{"clear", target, KeySettings{}, KeyChange{Budget: BudgetChange{ClearUnits: true}}, false, 0},
		{"budget an unbudgeted key", unbudgeted, KeySettings{}, KeyChange{Budget: BudgetChange{Units: ptr[int64](1000)}}, true, 0},
		{"label only of an unbudgeted key", unbudgeted, KeySettings{}, KeyChange{Label: ptr("x")}, true, 0},
		{"USD budget, which the actor has none of", target, KeySettings{}, KeyChange{Budget: BudgetChange{USD: ptr(decimal.New(5, 0))}}, true, 0},
		{"raise its own", actor, KeySettings{}, KeyChange{Budget: BudgetChange{Units: ptr[int64](101)}}, false, 0},
		{"lower its own", actor, KeySettings{}, KeyChange{Budget: BudgetChange{Units: ptr[int64](50)}}, true, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			var h Handover
			to := "key_n"
			if tc.key == nil {
				_, h, err = NewKey(to, "acct_1", tc.set, actor, left, "ce_live_x", []byte{1}, now)
			} else {
				to = tc.key.ID()
				_, h, err = tc.key.Update(tc.c, actor, left, now)
			}
			if (err == nil) != tc.ok {
				t.Fatalf("err %v, want ok=%v", err, tc.ok)
			}
			if err != nil && ErrorCode(err) != CodeScope {
				t.Fatalf("refused with %v, want a scope refusal", ErrorCode(err))
			}
			var handed int64
			if h.Units != nil {
				handed = *h.Units
			}
			if handed != tc.handed || h.USD != nil {
				t.Fatalf("handed over %+v, want %d units", h, tc.handed)
			}
			out := actor.HandOut(h, now)
			if tc.handed == 0 {
				if out != nil {
					t.Fatalf("nothing handed over, yet the actor's budget changes: %+v", out)
				}
				return
			}
			if h.To != to || out == nil || *out.BudgetUnits != 100-tc.handed || out.Handover.To != to || out.BudgetFrom != actor.budgetFrom {
				t.Fatalf("the actor's budget after handing %d units to %s: %+v", tc.handed, to, out)
			}
		})
	}
}

// Where a key's budget came from decides who may rotate it: a budgeted key rotates
// itself and the keys it handed their budgets to, and a key another key raised is no
// longer its alone.
func TestRotationByABudgetedKeyNeedsItsHandover(t *testing.T) {
	now := time.Now()
	actor := testKey("key_a", EnvLive, ptr[int64](100), AllScopes...)
	left := Headroom{Units: ptr[int64](40)}
	other := testKey("key_o", EnvLive, ptr[int64](500), AllScopes...)
	root := testKey("key_r", EnvLive, nil, AllScopes...)
	created := func(by *Key, budget int64) *Key {
		t.Helper()
		e, _, err := NewKey("key_c", "acct_1", KeySettings{Scopes: []Scope{ScopeEval}, Env: EnvLive, BudgetUnits: ptr(budget)}, by, Headroom{Units: by.budgetUnits}, "ce_live_x", []byte{1}, now)
		if err != nil {
			t.Fatal(err)
		}
		return RehydrateKey([]Event{e})
	}
	updated := func(k, by *Key, units int64) *Key {
		t.Helper()
		e, _, err := k.Update(KeyChange{Budget: BudgetChange{Units: ptr(units)}}, by, Headroom{Units: by.budgetUnits}, now)
		if err != nil {
			t.Fatal(err)
		}
		return RehydrateKey([]Event{&KeyCreated{KeyID: k.id, AccountID: k.accountID, Scopes: k.scopes, Env: k.env.String(),
			BudgetUnits: k.budgetUnits, BudgetFrom: k.budgetFrom}, e})
	}
	rotated := func(k, by *Key) *Key {
		t.Helper()
		e, err := k.Rotate(by, Headroom{Units: by.budgetUnits}, "ce_live_z", []byte{3}, 0, now)
		if err != nil {
			t.Fatal(err)
		}
		k.Apply(e)
		return k
	}
	cases := []struct {
		name string
		key  *Key
		ok   bool
	}{
		{"itself", actor, true},
		{"a key it handed its budget, rotated by it before", rotated(created(actor, 30), actor), true},
		{"the same, rotated by a key without a budget", rotated(created(actor, 30), root), false},
		{"the same, rotated by itself", rotated(created(actor, 30), created(actor, 30)), false},
		{"a key it handed its budget", created(actor, 30), true},
		{"the same, lowered by another key", updated(created(actor, 30), root, 10), true},
		{"the same, raised by itself", updated(created(actor, 30), actor, 50), true},
		{"the same, raised by a key without a budget", updated(created(actor, 30), root, 50), false},
		{"the same, raised by another budgeted key", updated(created(actor, 30), other, 50), false},
		{"a key made by a key without a budget", created(root, 30), false},
		{"a key another budgeted key handed its budget", created(other, 30), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.key.Rotate(actor, left, "ce_live_y", []byte{2}, 0, now)
			if (err == nil) != tc.ok {
				t.Fatalf("err %v, want ok=%v", err, tc.ok)
			}
		})
	}
	// with nothing left it still rotates what it budgeted: that power came out of it
	// when it had it, and the key's secret has been its holder's since
	if _, err := created(actor, 30).Rotate(actor, Headroom{Units: ptr[int64](0)}, "ce_live_y", []byte{2}, 0, now); err != nil {
		t.Fatalf("a key cut to nothing rotating the key it budgeted: %v", err)
	}
}

// Periods in the budget rule: a budget that starts again more often reaches further, so
// a budgeted key gives none that starts again more often than its own, and changing a
// key to a longer reach is a grant even at the same amount.
func TestBudgetPeriodRule(t *testing.T) {
	now := time.Now()
	monthly := RehydrateKey([]Event{&KeyCreated{KeyID: "key_m", AccountID: "acct_1", Scopes: AllScopes, Env: "live",
		BudgetUnits: ptr[int64](100), BudgetPeriod: PeriodMonth}})
	left := Headroom{Units: ptr[int64](40)}
	monthTarget := RehydrateKey([]Event{&KeyCreated{KeyID: "key_t", AccountID: "acct_1", Scopes: []Scope{ScopeEval}, Env: "live",
		BudgetUnits: ptr[int64](30), BudgetPeriod: PeriodMonth}})
	dayTarget := RehydrateKey([]Event{&KeyCreated{KeyID: "key_d", AccountID: "acct_1", Scopes: []Scope{ScopeEval}, Env: "live",
		BudgetUnits: ptr[int64](90), BudgetPeriod: PeriodDay}})
	smallDay := RehydrateKey([]Event{&KeyCreated{KeyID: "key_s", AccountID: "acct_1", Scopes: []Scope{ScopeEval}, Env: "live",
		BudgetUnits: ptr[int64](10), BudgetPeriod: PeriodDay}})
	create := func(p BudgetPeriod, units int64) KeySettings {
		return KeySettings{Scopes: []Scope{ScopeEval}, Env: EnvLive, BudgetUnits: ptr(units), Period: p}
	}
	cases := []struct {
		name string
		key  *Key
		set  KeySettings
		c    KeyChange
		ok   bool
	}{
		{"create per month within", nil, create(PeriodMonth, 40), KeyChange{}, true},
		{"create for life within", nil, create(PeriodTotal, 40), KeyChange{}, true},
		{"create per day", nil, create(PeriodDay, 1), KeyChange{}, false},
		{"month to day, same amount", monthTarget, KeySettings{}, KeyChange{Budget: BudgetChange{Period: PeriodDay}}, false},
		{"month to total", monthTarget, KeySettings{}, KeyChange{Budget: BudgetChange{Period: PeriodTotal}}, true},
		{"day to month, lower", dayTarget, KeySettings{}, KeyChange{Budget: BudgetChange{Period: PeriodMonth, Units: ptr[int64](50)}}, true},
		{"lower a daily key", dayTarget, KeySettings{}, KeyChange{Budget: BudgetChange{Units: ptr[int64](80)}}, true},
		{"raise a daily key within left", smallDay, KeySettings{}, KeyChange{Budget: BudgetChange{Units: ptr[int64](20)}}, false},
		{"an unknown period", monthTarget, KeySettings{}, KeyChange{Budget: BudgetChange{Period: "week"}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.key == nil {
				_, _, err = NewKey("key_n", "acct_1", tc.set, monthly, left, "ce_live_x", []byte{1}, now)
			} else {
				_, _, err = tc.key.Update(tc.c, monthly, left, now)
			}
			if (err == nil) != tc.ok {
				t.Fatalf("err %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// A rotation ends every secret still working by its grace at the latest: one with no
// grace after a leak also stops a secret an earlier rotation's longer grace kept.
func TestRotationEndsEverySecretByItsGrace(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	secret := func(i int) []byte { return []byte{byte(i), 1, 2, 3} }
	rotate := func(i int, at time.Time, grace time.Duration) Event {
		return &KeyRotated{Prefix: "p", SecretHash: hex.EncodeToString(secret(i)), OldExpires: at.Add(grace), RotatedAt: at}
	}
	created := &KeyCreated{KeyID: "key_1", AccountID: "acc_1", Label: "k", Prefix: "p", Env: "live", SecretHash: hex.EncodeToString(secret(0)), CreatedAt: t0}
	for _, c := range []struct {
		name  string
		later []Event
		at    time.Time
		works []bool // secrets 0, 1, 2 at at
	}{
		{"a day's grace", []Event{rotate(1, t0, 24*time.Hour)},
			t0.Add(time.Hour), []bool{true, true, false}},
		{"then none: the leaked secret stops too", []Event{rotate(1, t0, 24*time.Hour), rotate(2, t0.Add(time.Hour), 0)},
			t0.Add(time.Hour + time.Second), []bool{false, false, true}},
		{"then an hour: both end within it", []Event{rotate(1, t0, 24*time.Hour), rotate(2, t0.Add(time.Hour), time.Hour)},
			t0.Add(2*time.Hour + time.Second), []bool{false, false, true}},
		{"then two days: the first keeps its own day, not more", []Event{rotate(1, t0, 24*time.Hour), rotate(2, t0.Add(time.Hour), 48*time.Hour)},
			t0.Add(25 * time.Hour), []bool{false, true, true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := RehydrateKey(append([]Event{created}, c.later...))
			for i, want := range c.works {
				if err := k.Authenticate(secret(i), c.at); (err == nil) != want {
					t.Errorf("secret %d at %v: %v, want working %v", i, c.at.Sub(t0), err, want)
				}
			}
		})
	}
}
