package domain

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/mail"
	"strings"
	"time"

	"github.com/shopspring/decimal"
)

// Plan is a closed set: free, hobby, pro.
type Plan struct{ name string }

var (
	PlanFree  = Plan{"free"}
	PlanHobby = Plan{"hobby"}
	PlanPro   = Plan{"pro"}
)

func (p Plan) String() string { return p.name }

// ParsePlan accepts only the known plan names.
func ParsePlan(s string) (Plan, bool) {
	for _, p := range []Plan{PlanFree, PlanHobby, PlanPro} {
		if p.name == s {
			return p, true
		}
	}
	return Plan{}, false
}

// AccountCreated: someone signed up.
type AccountCreated struct {
	AccountID string    `json:"account_id"`
	Email     string    `json:"email"`
	Name      string    `json:"name"`
	Agent     string    `json:"agent"`
	Source    string    `json:"source"`
	Plan      string    `json:"plan"`
	CreatedAt time.Time `json:"created_at"`
}

// EmailClaimed reserves an e-mail address for one account.
type EmailClaimed struct {
	AccountID string `json:"account_id"`
}

// EmailVerified: the account's owner proved they read mail at its address (they gave
// back the token the verification message carried).
type EmailVerified struct {
	Email      string    `json:"email"`
	VerifiedAt time.Time `json:"verified_at"`
}

// TimezoneSet: the account's calendar (budgets by period start again at its
// midnights) is now this IANA zone.
type TimezoneSet struct {
	Timezone string    `json:"timezone"`
	SetAt    time.Time `json:"set_at"`
}

func (*TimezoneSet) EventType() string { return "TimezoneSet" }

// AccountBudgetSet: what all the account's keys of one env may spend together, per
// period (nil: no budget of that kind).
type AccountBudgetSet struct {
	Env         string           `json:"env"`
	BudgetUnits *int64           `json:"budget_units"`
	BudgetUSD   *decimal.Decimal `json:"budget_usd"`
	Period      BudgetPeriod     `json:"budget_period"`
	SetAt       time.Time        `json:"set_at"`
}

func (*AccountBudgetSet) EventType() string { return "AccountBudgetSet" }

// AccountBudget is the account's budget in one env (nil: none of that kind).
type AccountBudget struct {
	Units  *int64
	USD    *decimal.Decimal
	Period BudgetPeriod
}

// Budget is the account's budget in env; a month is the period until one is chosen.
func (a *Account) Budget(env Env) AccountBudget {
	if b, ok := a.budgets[env]; ok {
		return b
	}
	return AccountBudget{Period: PeriodMonth}
}

// SetBudget changes the account's budget in env. Only a key without a budget of its
// own may (a budgeted key could otherwise lift the cap on every other key); the caller
// checks the scope.
func (a *Account) SetBudget(env Env, c BudgetChange, actor *Key, now time.Time) (*AccountBudgetSet, error) {
	b := a.Budget(env)
	b.Units, b.USD, b.Period = c.apply(b.Units, b.USD, b.Period)
	var p Problems
	ValidateBudgets(&p, c.Units, c.USD) // the budgets given (Key.Update says why)
	validatePeriod(&p, b.Period)
	if err := p.Err(); err != nil {
		return nil, err
	}
	if actor != nil && (actor.budgetUnits != nil || actor.budgetUSD != nil) {
		return nil, Errorf(CodeScope, "this key has a budget of its own, so it cannot change the account's budget")
	}
	return &AccountBudgetSet{Env: env.String(), BudgetUnits: b.Units, BudgetUSD: b.USD, Period: b.Period, SetAt: now}, nil
}

// SetTimezone moves the account to zone tz; nil when it is already there. Only a live
// key without a budget of its own may: the zone's midnights start budgets by period, and
// a budgeted key that moved them an hour before each end would start its own budget
// over every hour; the zone is the whole account's, so a test key would move the live
// keys' periods (a test key changes nothing live).
func (a *Account) SetTimezone(tz string, actor *Key, now time.Time) (*TimezoneSet, error) {
	if err := ValidateTimezone(tz); err != nil {
		return nil, err
	}
	if tz == a.Timezone() {
		return nil, nil
	}
	if actor != nil && actor.Env() != EnvLive {
		return nil, Errorf(CodeScope, "the time zone is the whole account's, live keys' budget periods included; change it with a live key")
	}
	if actor != nil && (actor.budgetUnits != nil || actor.budgetUSD != nil) {
		return nil, Errorf(CodeScope, "this key has a budget of its own, so it cannot change the account's time zone")
	}
	return &TimezoneSet{Timezone: tz, SetAt: now}, nil
}

// ValidateTimezone accepts IANA zone names (and UTC), not offsets or abbreviations:
// a calendar needs the zone's daylight-saving rules.
func ValidateTimezone(tz string) error {
	if tz == "" || tz == "Local" || len(tz) > 64 {
		return Invalid("timezone", "must be an IANA time zone such as Europe/Paris or UTC")
	}
	if _, err := time.LoadLocation(tz); err != nil {
		return Invalid("timezone", "is not a known IANA time zone (for example America/New_York)")
	}
	return nil
}

func (*AccountCreated) EventType() string { return "AccountCreated" }
func (*EmailClaimed) EventType() string   { return "EmailClaimed" }
func (*EmailVerified) EventType() string  { return "EmailVerified" }

func init() {
	RegisterEvent("EmailVerified", func() Event { return &EmailVerified{} })
	RegisterEvent("TimezoneSet", func() Event { return &TimezoneSet{} })
	RegisterEvent("AccountBudgetSet", func() Event { return &AccountBudgetSet{} })
}

// Verify marks the account's address verified at now; nil when it already is (a
// second verification changes nothing).
func (a *Account) Verify(now time.Time) *EmailVerified {
	if a.verified {
		return nil
	}
	return &EmailVerified{Email: a.email, VerifiedAt: now}
}

// Signup is what a new account starts from.
type Signup struct {
	Email, Name, Agent, Source string
}

// Account is the account aggregate.
type Account struct {
	id       string
	email    string
	plan     Plan
	verified bool
	timezone string // "" is UTC
	budgets  map[Env]AccountBudget
	version  int64
}

func (a *Account) ID() string     { return a.id }
func (a *Account) Email() string  { return a.email }
func (a *Account) Plan() Plan     { return a.plan }
func (a *Account) Version() int64 { return a.version }
func (a *Account) Verified() bool { return a.verified }

// Timezone is the account's IANA zone: its calendar for budgets by period.
func (a *Account) Timezone() string {
	if a.timezone == "" {
		return "UTC"
	}
	return a.timezone
}
func (a *Account) Exists() bool { return a.version > 0 }

// NormalizeEmail validates an address and returns its canonical form (trimmed, lower
// case) used for uniqueness.
func NormalizeEmail(s string) (string, error) {
	if reason := TextProblem(s, false); reason != "" {
		return "", Invalid("email", reason)
	}
	s = strings.TrimSpace(s)
	if s == "" {
		return "", Invalid("email", "is required")
	}
	if len(s) > MaxEmailLength {
		return "", Invalid("email", fmt.Sprintf("is longer than %d bytes", MaxEmailLength))
	}
	addr, err := mail.ParseAddress(s)
	if err != nil || addr.Address != s || !strings.Contains(s[strings.LastIndexByte(s, '@')+1:], ".") {
		return "", Invalid("email", "is not an e-mail address (expected name@example.com)")
	}
	// Some letters grow when lower-cased (Ⱥ is 2 bytes, ⱥ 3): the stored form is what
	// must fit.
	lower := strings.ToLower(s)
	if len(lower) > MaxEmailLength {
		return "", Invalid("email", fmt.Sprintf("is longer than %d bytes", MaxEmailLength))
	}
	return lower, nil
}

// EmailHash names the stream that claims an address without putting the address in it.
func EmailHash(normalized string) string {
	sum := sha256.Sum256([]byte(normalized))
	return hex.EncodeToString(sum[:])
}

// CheckSignup adds the problems of a signup's fields to p, as NewAccount finds them,
// so that a handler can name them with those of the body (an unknown field, a wrong
// type) in one refusal.
func CheckSignup(p *Problems, s Signup) {
	if _, err := NormalizeEmail(s.Email); err != nil {
		*p = append(*p, err.(*Error).Fields...)
	}
	for _, f := range []struct{ name, v string }{{"name", s.Name}, {"agent", s.Agent}, {"source", s.Source}} {
		CheckText(p, f.name, f.v, MaxNameLength)
	}
}

// NewAccount validates a signup and returns the account's first event.
func NewAccount(id string, s Signup, now time.Time) (*AccountCreated, error) {
	var p Problems
	CheckSignup(&p, s)
	if err := p.Err(); err != nil {
		return nil, err
	}
	email, _ := NormalizeEmail(s.Email) // valid: checked above
	return &AccountCreated{
		AccountID: id, Email: email, Name: strings.TrimSpace(s.Name), Agent: s.Agent, Source: s.Source,
		Plan: PlanFree.String(), CreatedAt: now,
	}, nil
}

// RehydrateAccount rebuilds an account from its stored events. It applies facts and
// checks nothing: they were checked when they happened.
func RehydrateAccount(events []Event) *Account {
	a := &Account{}
	for _, e := range events {
		a.apply(e)
	}
	return a
}

// Apply folds one more event into the account.
func (a *Account) Apply(e Event) { a.apply(e) }

func (a *Account) apply(e Event) {
	a.version++
	switch e := e.(type) {
	case *AccountCreated:
		a.id, a.email = e.AccountID, e.Email
		a.plan, _ = ParsePlan(e.Plan)
	case *PlanChanged:
		a.plan, _ = ParsePlan(e.Plan)
	case *EmailVerified:
		a.verified = true
	case *TimezoneSet:
		a.timezone = e.Timezone
	case *AccountBudgetSet:
		env, _ := ParseEnv(e.Env)
		if a.budgets == nil {
			a.budgets = map[Env]AccountBudget{}
		}
		a.budgets[env] = AccountBudget{Units: e.BudgetUnits, USD: e.BudgetUSD, Period: e.Period}
	}
}
