package domain

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"time"

	"github.com/shopspring/decimal"
)

// Env separates real traffic from testing: a test key's calls go to the test book.
type Env struct{ name string }

var (
	EnvLive = Env{"live"}
	EnvTest = Env{"test"}
)

func (e Env) String() string { return e.name }

// ParseEnv accepts live and test.
func ParseEnv(s string) (Env, bool) {
	switch s {
	case "live":
		return EnvLive, true
	case "test":
		return EnvTest, true
	}
	return Env{}, false
}

// Scope names what a key may do.
type Scope string

const (
	ScopeEval      Scope = "eval"       // eval, bestmove, price, validate, legal-moves
	ScopeJobs      Scope = "jobs"       // analyze, batch, jobs
	ScopeUsageRead Scope = "usage:read" // me, usage
	ScopeKeysWrite Scope = "keys:write" // keys
	ScopeBilling   Scope = "billing"    // billing
)

// AllScopes is what a signup key holds, in a stable order.
var AllScopes = []Scope{ScopeEval, ScopeJobs, ScopeUsageRead, ScopeKeysWrite, ScopeBilling}

// ParseScopes checks names and returns them sorted in AllScopes order, without repeats.
func ParseScopes(names []string) ([]Scope, error) {
	seen := map[Scope]bool{}
	for _, n := range names {
		s := Scope(n)
		if !slices.Contains(AllScopes, s) {
			return nil, Invalid("scopes", "unknown scope "+quote(n)+" (known: eval, jobs, usage:read, keys:write, billing)")
		}
		seen[s] = true
	}
	var out []Scope
	for _, s := range AllScopes {
		if seen[s] {
			out = append(out, s)
		}
	}
	return out, nil
}

func quote(s string) string {
	if len(s) > 40 {
		s = s[:40] + "…"
	}
	return `"` + strings.ToValidUTF8(s, "?") + `"`
}

// Key lifecycle events.
type KeyCreated struct {
	KeyID       string           `json:"key_id"`
	AccountID   string           `json:"account_id"`
	Label       string           `json:"label"`
	Scopes      []Scope          `json:"scopes"`
	Env         string           `json:"env"`
	BudgetUnits *int64           `json:"budget_units"`
	BudgetUSD   *decimal.Decimal `json:"budget_usd"`
	// BudgetPeriod: "" (events before periods) is PeriodTotal.
	BudgetPeriod BudgetPeriod `json:"budget_period,omitempty"`
	Prefix       string       `json:"prefix"`
	SecretHash   string       `json:"secret_hash"` // hex HMAC-SHA-256 of the secret
	CreatedAt    time.Time    `json:"created_at"`
	// BudgetFrom is the key that handed this one its budget out of its own (a budgeted
	// key of the same env), or empty.
	BudgetFrom string `json:"budget_from,omitempty"`
}

// KeyUpdated carries the key's settings after the change, whole.
type KeyUpdated struct {
	Label       string           `json:"label"`
	Scopes      []Scope          `json:"scopes"`
	BudgetUnits *int64           `json:"budget_units"`
	BudgetUSD   *decimal.Decimal `json:"budget_usd"`
	// BudgetPeriod: "" (events before periods) is PeriodTotal.
	BudgetPeriod BudgetPeriod `json:"budget_period,omitempty"`
	UpdatedAt    time.Time    `json:"updated_at"`
	// BudgetFrom is the key whose handover gave this one its budget (see KeyCreated):
	// kept by a change that loosens nothing, or by that key's own raise; emptied by a
	// raise of any other key (then no one budgeted key paid for all of it).
	BudgetFrom string `json:"budget_from,omitempty"`
	// Handover, when set, says why the budgets fell: the key handed that much of them
	// to another key (HandOut). Nil for a change asked for by a client.
	Handover *Handover `json:"handover,omitempty"`
}

// Handover is budget a key hands to another key of its env: a new key's budget, or
// what a PATCH raises a key's budget by. A budgeted key's handovers come out of its
// own budget, so what it and every key it hands budget to can spend together never
// passes what it had. Nil fields: nothing of that kind (the key has no budget of it).
type Handover struct {
	To    string           `json:"to"`
	Units *int64           `json:"units,omitempty"`
	USD   *decimal.Decimal `json:"usd,omitempty"`
}

// Within checks that h still fits in left, what its key has left to hand over read
// again under its balance's lock: a lease its calls took since the decision may have
// shrunk it.
func (h Handover) Within(left Headroom) error {
	if h.Units != nil && left.Units != nil && *h.Units > *left.Units {
		return Errorf(CodeScope, "budget_units: this key has %d units left, so it cannot hand a key more", *left.Units)
	}
	if h.USD != nil && left.USD != nil && h.USD.GreaterThan(*left.USD) {
		return Errorf(CodeScope, "budget_usd: this key has $%s left, so it cannot hand a key more", left.USD.StringFixed(6))
	}
	return nil
}

// empty says nothing is handed over.
func (h Handover) empty() bool {
	return (h.Units == nil || *h.Units == 0) && (h.USD == nil || h.USD.IsZero())
}

type KeyRotated struct {
	Prefix     string    `json:"prefix"`
	SecretHash string    `json:"secret_hash"`
	OldHash    string    `json:"old_hash"`
	OldExpires time.Time `json:"old_expires_at"` // the old secret works until then
	RotatedAt  time.Time `json:"rotated_at"`
	// BudgetFrom is the key's budget_from after the rotation: kept when the key that
	// handed over its budget rotated it, emptied by any other key's rotation (the new
	// secret went elsewhere, so that key no longer takes it back).
	BudgetFrom string `json:"budget_from,omitempty"`
}

type KeyRevoked struct {
	RevokedAt time.Time `json:"revoked_at"`
}

func (*KeyCreated) EventType() string { return "KeyCreated" }
func (*KeyUpdated) EventType() string { return "KeyUpdated" }
func (*KeyRotated) EventType() string { return "KeyRotated" }
func (*KeyRevoked) EventType() string { return "KeyRevoked" }

// KeyStatus is active or revoked; revoked is terminal.
type KeyStatus string

const (
	StatusActive  KeyStatus = "active"
	StatusRevoked KeyStatus = "revoked"
)

// Secret is one secret hash a key accepts, until Expires when it is set.
type Secret struct {
	Hash    []byte
	Expires time.Time // zero: the current secret
}

// Key is the API key aggregate.
type Key struct {
	id, accountID, label, prefix string
	scopes                       []Scope
	env                          Env
	budgetUnits                  *int64
	budgetUSD                    *decimal.Decimal
	budgetPeriod                 BudgetPeriod
	budgetFrom                   string // the key that handed over the budget, if any
	status                       KeyStatus
	secrets                      []Secret
	createdAt                    time.Time
	rotatedAt, revokedAt         *time.Time
	version                      int64
}

func (k *Key) ID() string                      { return k.id }
func (k *Key) AccountID() string               { return k.accountID }
func (k *Key) Label() string                   { return k.label }
func (k *Key) Prefix() string                  { return k.prefix }
func (k *Key) Scopes() []Scope                 { return slices.Clone(k.scopes) }
func (k *Key) Env() Env                        { return k.env }
func (k *Key) BudgetUnits() *int64             { return k.budgetUnits }
func (k *Key) BudgetUSD() *decimal.Decimal     { return k.budgetUSD }
func (k *Key) BudgetPeriod() BudgetPeriod      { return k.budgetPeriod.orTotal() }
func (k *Key) BudgetFrom() string              { return k.budgetFrom }
func (k *Key) Status() KeyStatus               { return k.status }
func (k *Key) CreatedAt() time.Time            { return k.createdAt }
func (k *Key) RotatedAt() *time.Time           { return k.rotatedAt }
func (k *Key) RevokedAt() *time.Time           { return k.revokedAt }
func (k *Key) Version() int64                  { return k.version }
func (k *Key) HasScope(s Scope) bool           { return slices.Contains(k.scopes, s) }
func (k *Key) Secrets() []Secret               { return slices.Clone(k.secrets) }
func (k *Key) Exists() bool                    { return k.version > 0 }
func (k *Key) BelongsTo(accountID string) bool { return k.Exists() && k.accountID == accountID }

// HashSecret is the only form in which a secret is stored: HMAC-SHA-256 under the
// server's pepper, so a stolen table cannot be tried offline without the pepper too.
func HashSecret(pepper []byte, secret string) []byte {
	m := hmac.New(sha256.New, pepper)
	m.Write([]byte(secret))
	return m.Sum(nil)
}

// KeySettings are the settable fields of a key.
type KeySettings struct {
	Label       string
	Scopes      []Scope
	Env         Env
	BudgetUnits *int64
	BudgetUSD   *decimal.Decimal
	Period      BudgetPeriod // "" is PeriodTotal
}

// MaxActiveKeys bounds the keys an account holds in each env, revoked ones aside: keys
// are free to make, and every key may call the endpoints that manage the account at
// the plan's rate (its own bucket), so without a bound one account could multiply
// that rate without end.
const MaxActiveKeys = 100

// BudgetPeriod is how long a key's budgets last before they start again: the key's
// whole life, or each calendar day or month of the account's time zone.
type BudgetPeriod string

const (
	PeriodTotal BudgetPeriod = "total"
	PeriodMonth BudgetPeriod = "month"
	PeriodDay   BudgetPeriod = "day"
)

// ParseBudgetPeriod reads a period as the API writes it.
func ParseBudgetPeriod(s string) (BudgetPeriod, bool) {
	switch p := BudgetPeriod(s); p {
	case PeriodTotal, PeriodMonth, PeriodDay:
		return p, true
	}
	return "", false
}

func (p BudgetPeriod) orTotal() BudgetPeriod {
	if p == "" {
		return PeriodTotal
	}
	return p
}

// reach orders periods by what one budget amount lets a key spend over time: a budget
// that starts again each day reaches furthest.
func (p BudgetPeriod) reach() int {
	switch p {
	case PeriodDay:
		return 2
	case PeriodMonth:
		return 1
	}
	return 0
}

// MaxBudgetUnits is the largest units budget: what the largest USD budget ($10^9)
// buys at $0.00001 a unit. Without a bound a budget near 2^63 overflowed the
// percentages of the budget alerts, in a check that runs for every account at once.
const MaxBudgetUnits = 100_000_000_000_000

// ValidateBudgets checks the budget values a client may set.
func ValidateBudgets(p *Problems, units *int64, usd *decimal.Decimal) {
	if units != nil && *units < 0 {
		p.Add("budget_units", "must be 0 or more")
	} else if units != nil && *units > MaxBudgetUnits {
		p.Add("budget_units", "must be at most 100000000000000")
	}
	if usd != nil {
		if usd.IsNegative() {
			p.Add("budget_usd", "must be 0 or more")
		} else if usd.Exponent() < -6 && !usd.Equal(usd.Round(6)) {
			p.Add("budget_usd", "has more than 6 decimal places")
		} else if usd.GreaterThan(decimal.New(1, 9)) {
			p.Add("budget_usd", "must be at most 1000000000")
		}
	}
}

func validatePeriod(p *Problems, period BudgetPeriod) {
	if _, ok := ParseBudgetPeriod(string(period)); !ok {
		p.Add("budget_period", "must be total, month or day")
	}
}

func validateLabel(p *Problems, label string) {
	CheckText(p, "label", label, MaxLabelLength)
}

// CheckKeyFields checks the label (nil: none given) and budgets a client asks a key to
// have, as NewKey and Update do, so that a handler can name their problems with those
// it finds itself (a period, an env, scopes) in one refusal.
func CheckKeyFields(p *Problems, label *string, units *int64, usd *decimal.Decimal) {
	if label != nil {
		validateLabel(p, *label)
	}
	ValidateBudgets(p, units, usd)
}

// Headroom is what a key has left to hand over, per kind: its budget less what it
// spent and what its calls and jobs hold (never below 0); nil where it has no budget of
// that kind. Commands read it in their own transaction (ledger.KeyHeadroom) and hand
// it in.
type Headroom struct {
	Units *int64
	USD   *decimal.Decimal
}

// Sees tells whether k may know that target exists: a key of its own account, and for a
// test key a test key (test and live are two worlds; a live key lists test keys when
// asked, so it sees them, though it manages only live ones). Anything else is reported
// exactly like a missing key.
func (k *Key) Sees(target *Key) bool {
	return target.BelongsTo(k.accountID) && (k.env == EnvLive || target.env == EnvTest)
}

// grantable checks that actor, with left to spend, may create a key of env holding
// scopes, or give a key the budgets of b, and returns what that hands over of actor's
// budget (To left for the caller): no key hands out a scope, an env or a budget it
// does not hold itself. A live key may create test keys: test mode grants no live
// power, and otherwise no test key could ever exist.
func grantable(actor *Key, left Headroom, scopes []Scope, env Env, b budgetChange) (granted, error) {
	if actor == nil {
		return granted{}, nil // signup: the account's first key holds everything
	}
	if actor.env == EnvTest && env != EnvTest {
		return granted{}, Errorf(CodeScope, "a test key can manage only test keys")
	}
	for _, s := range scopes {
		if !actor.HasScope(s) {
			return granted{}, Errorf(CodeScope, "this key cannot grant the scope %q, which it does not hold", s)
		}
	}
	if b.afterPeriod != b.beforePeriod {
		// a budget that starts again on other days is granted anew
		b.setUnits = b.setUnits || b.afterUnits != nil
		b.setUSD = b.setUSD || b.afterUSD != nil
	}
	var g granted
	units := grant{field: "budget_units", left: decimalOf(left.Units), isNew: b.isNew, before: decimalOf(b.beforeUnits),
		after: decimalOf(b.afterUnits), beforePeriod: b.beforePeriod, afterPeriod: b.afterPeriod, actorPeriod: actor.BudgetPeriod()}
	usd := units
	usd.field, usd.left, usd.before, usd.after = "budget_usd", left.USD, b.beforeUSD, b.afterUSD
	if b.setUnits {
		handed, err := units.fits()
		if err != nil {
			return granted{}, err
		}
		if handed != nil {
			n := handed.IntPart()
			g.handover.Units = &n
		}
		g.loosens = !units.tightens()
	}
	if b.setUSD {
		handed, err := usd.fits()
		if err != nil {
			return granted{}, err
		}
		g.handover.USD = handed
		g.loosens = g.loosens || !usd.tightens()
	}
	return g, nil
}

// granted is what a create or PATCH grants: whether it gives a budget anything looser
// than it had, and what of that comes out of the actor's budgets (To left empty).
type granted struct {
	loosens  bool
	handover Handover
}

// budgetChange is what a create or PATCH does to a key's budgets (nil: no budget).
type budgetChange struct {
	isNew                   bool
	setUnits, setUSD        bool // the request sets this budget
	beforeUnits, afterUnits *int64
	beforeUSD, afterUSD     *decimal.Decimal
	beforePeriod            BudgetPeriod
	afterPeriod             BudgetPeriod
}

func decimalOf(v *int64) *decimal.Decimal {
	if v == nil {
		return nil
	}
	d := decimal.NewFromInt(*v)
	return &d
}

// grant is one kind of budget a key would get (after, per afterPeriod; nil: none),
// against what the actor has left of that kind (nil: it has no budget of that kind,
// so any budget is its to give) per its own period.
type grant struct {
	field                                  string
	left                                   *decimal.Decimal
	isNew                                  bool
	before, after                          *decimal.Decimal
	beforePeriod, afterPeriod, actorPeriod BudgetPeriod
}

// fits checks g and returns what it hands over of the actor's budget (nil: nothing).
// Tightening an existing key's budget (after no looser than before, over a period that
// reaches no further) grants nothing and is always allowed. Anything else hands over
// the whole budget (a new key's, or one that starts again on other days) or, for a
// raise, the difference, which must fit within left, for a budget that starts again
// no more often than the actor's own.
func (g grant) fits() (*decimal.Decimal, error) {
	if g.left == nil || g.tightens() {
		return nil, nil
	}
	have := g.left.String() + " units"
	if g.field == "budget_usd" {
		have = "$" + g.left.StringFixed(6)
	}
	if g.after == nil {
		return nil, Errorf(CodeScope, "%s: this key is budgeted (%s left), so it cannot give a key no budget", g.field, have)
	}
	handed := *g.after
	if !g.isNew && g.afterPeriod == g.beforePeriod {
		handed = g.after.Sub(*g.before) // a raise: before is set, or this were a tightening
	}
	if handed.GreaterThan(*g.left) {
		return nil, Errorf(CodeScope, "%s: this key has %s left, so it cannot hand a key more", g.field, have)
	}
	if g.afterPeriod.reach() > g.actorPeriod.reach() {
		return nil, Errorf(CodeScope, "%s: this key's budget is per %s, so it cannot give a budget that starts again each %s",
			g.field, g.actorPeriod, g.afterPeriod)
	}
	return &handed, nil
}

// tightens says g only tightens an existing key's budget: no looser than before, over
// a period that reaches no further (giving an unbudgeted key a budget included).
func (g grant) tightens() bool {
	return !g.isNew && g.after != nil && (g.before == nil ||
		(g.after.LessThanOrEqual(*g.before) && g.afterPeriod.reach() <= g.beforePeriod.reach()))
}

// HandOut is the event that lowers k's budgets by h, what it handed to key h.To, or nil
// when h hands nothing over. h fits within what k has left (grantable), so no budget
// falls below what k spent and holds.
func (k *Key) HandOut(h Handover, now time.Time) *KeyUpdated {
	if h.empty() {
		return nil
	}
	e := &KeyUpdated{Label: k.label, Scopes: k.scopes, BudgetUnits: k.budgetUnits, BudgetUSD: k.budgetUSD,
		BudgetPeriod: k.BudgetPeriod(), BudgetFrom: k.budgetFrom, UpdatedAt: now, Handover: &h}
	if h.Units != nil && k.budgetUnits != nil {
		v := max(0, *k.budgetUnits-*h.Units)
		e.BudgetUnits = &v
	}
	if h.USD != nil && k.budgetUSD != nil {
		v := decimal.Max(decimal.Zero, k.budgetUSD.Sub(*h.USD))
		e.BudgetUSD = &v
	}
	return e
}

// manageable checks that actor may change, rotate or revoke k: a key of its own env
// whose scopes it holds every one of. A key may act on itself (its scopes are its own),
// but grantable still keeps it from raising its own scopes or budgets.
func (k *Key) manageable(actor *Key) error {
	if actor == nil {
		return nil
	}
	if !actor.Sees(k) {
		return Errorf(CodeNotFound, "no key %q on this account", k.id)
	}
	if actor.env != k.env {
		return Errorf(CodeScope, "key %s is a %s key; a %s key manages only %s keys (use a %s key holding keys:write)",
			k.id, k.env, actor.env, actor.env, k.env)
	}
	for _, s := range k.scopes {
		if !actor.HasScope(s) {
			return Errorf(CodeScope, "key %s holds the scope %q, which this key lacks; only a key holding all of its scopes can manage it", k.id, s)
		}
	}
	return nil
}

// NewKey checks a new key's settings against the acting key (nil at signup) and what it
// has left to spend, and returns its first event.
//
// It also returns what the new key's budget hands over of the actor's own (empty for a
// key of the other env: a live key's test keys spend nothing live), which
// the actor's HandOut takes out of it.
func NewKey(id, accountID string, s KeySettings, actor *Key, left Headroom, prefix string, secretHash []byte, now time.Time) (*KeyCreated, Handover, error) {
	var p Problems
	validateLabel(&p, s.Label)
	ValidateBudgets(&p, s.BudgetUnits, s.BudgetUSD)
	validatePeriod(&p, s.Period.orTotal())
	if err := p.Err(); err != nil {
		return nil, Handover{}, err
	}
	b := budgetChange{isNew: true, setUnits: true, setUSD: true, afterUnits: s.BudgetUnits, afterUSD: s.BudgetUSD,
		beforePeriod: s.Period.orTotal(), afterPeriod: s.Period.orTotal()}
	g, err := grantable(actor, left, s.Scopes, s.Env, b)
	if err != nil {
		return nil, Handover{}, err
	}
	e := &KeyCreated{
		KeyID: id, AccountID: accountID, Label: s.Label, Scopes: s.Scopes, Env: s.Env.String(),
		BudgetUnits: s.BudgetUnits, BudgetUSD: s.BudgetUSD, BudgetPeriod: s.Period.orTotal(), Prefix: prefix,
		SecretHash: hex.EncodeToString(secretHash), CreatedAt: now,
	}
	if actor == nil || actor.env != s.Env || left.Units == nil && left.USD == nil {
		return e, Handover{}, nil
	}
	e.BudgetFrom = actor.id // a budgeted key's: within what it had, and paid for
	if g.handover.empty() {
		return e, Handover{}, nil
	}
	g.handover.To = id
	return e, g.handover, nil
}

// KeyChange is a PATCH: nil fields stay as they are.
type KeyChange struct {
	Label  *string
	Scopes []Scope // nil: unchanged
	Budget BudgetChange
}

// BudgetChange is a change of budgets: nil fields stay as they are; Clear* removes a
// budget; an empty Period keeps the period.
type BudgetChange struct {
	Units      *int64
	USD        *decimal.Decimal
	ClearUnits bool
	ClearUSD   bool
	Period     BudgetPeriod
}

// apply is the budgets after the change of the budgets given.
func (c BudgetChange) apply(units *int64, usd *decimal.Decimal, period BudgetPeriod) (*int64, *decimal.Decimal, BudgetPeriod) {
	switch {
	case c.ClearUnits:
		units = nil
	case c.Units != nil:
		units = c.Units
	}
	switch {
	case c.ClearUSD:
		usd = nil
	case c.USD != nil:
		usd = c.USD
	}
	if c.Period != "" {
		period = c.Period
	}
	return units, usd, period
}

// Update applies a change made by actor, which has left to spend. A budget below what
// is already spent is allowed: it blocks further costed calls. It also returns what a
// raise hands over of the actor's own budget (for its HandOut).
func (k *Key) Update(c KeyChange, actor *Key, left Headroom, now time.Time) (*KeyUpdated, Handover, error) {
	if err := k.manageable(actor); err != nil {
		return nil, Handover{}, err
	}
	if k.status == StatusRevoked {
		return nil, Handover{}, Errorf(CodeConflict, "key %s is revoked; a revoked key cannot change", k.id)
	}
	e := &KeyUpdated{Label: k.label, Scopes: k.scopes, BudgetFrom: k.budgetFrom, UpdatedAt: now}
	e.BudgetUnits, e.BudgetUSD, e.BudgetPeriod = c.Budget.apply(k.budgetUnits, k.budgetUSD, k.BudgetPeriod())
	if c.Label != nil {
		e.Label = *c.Label
	}
	if c.Scopes != nil {
		e.Scopes = c.Scopes
	}
	var p Problems
	validateLabel(&p, e.Label)
	// the budgets given, not those kept: one set before budgets were bounded stays
	// until changed, and does not refuse a change of something else
	ValidateBudgets(&p, c.Budget.Units, c.Budget.USD)
	validatePeriod(&p, e.BudgetPeriod)
	if err := p.Err(); err != nil {
		return nil, Handover{}, err
	}
	b := budgetChange{setUnits: c.Budget.ClearUnits || c.Budget.Units != nil, setUSD: c.Budget.ClearUSD || c.Budget.USD != nil,
		beforeUnits: k.budgetUnits, afterUnits: e.BudgetUnits, beforeUSD: k.budgetUSD, afterUSD: e.BudgetUSD,
		beforePeriod: k.BudgetPeriod(), afterPeriod: e.BudgetPeriod}
	g, err := grantable(actor, left, c.Scopes, k.env, b)
	if err != nil {
		return nil, Handover{}, err
	}
	switch {
	case actor == nil || !g.loosens: // nothing granted: the budget's origin stays
	case actor.id == k.id && !g.handover.empty():
		// what it would hand over would come out of the budget it raises
		return nil, Handover{}, Errorf(CodeScope, "a key cannot raise its own budget; use a key with a larger budget, or none")
	case actor.id != k.budgetFrom:
		// raised by a key that did not give it the rest: no one budgeted key paid for
		// all of it
		e.BudgetFrom = ""
	}
	if g.handover.empty() {
		return e, Handover{}, nil
	}
	g.handover.To = k.id
	return e, g.handover, nil
}

// MaxRotationGrace bounds how long a rotated-out secret may keep working.
const MaxRotationGrace = 24 * time.Hour

// Rotate gives the key a new secret. The old one stops at once, or after grace.
// Spend and budget carry over: they belong to the key, not to the secret. The new
// secret hands its holder what the key may still spend, so a budgeted actor (left has
// a budget) rotates only itself and keys whose budget it handed over out of its own
// (and so already paid for; their secrets were its holder's since), never one whose
// power would add to its own. A rotation by any other key ends that claim.
func (k *Key) Rotate(actor *Key, left Headroom, prefix string, secretHash []byte, grace time.Duration, now time.Time) (*KeyRotated, error) {
	if err := k.manageable(actor); err != nil {
		return nil, err
	}
	if k.status == StatusRevoked {
		return nil, Errorf(CodeConflict, "key %s is revoked; a revoked key cannot be rotated", k.id)
	}
	if grace < 0 || grace > MaxRotationGrace {
		return nil, Invalid("grace_seconds", "must be from 0 to 86400")
	}
	if actor != nil && actor.id != k.id && (left.Units != nil || left.USD != nil) && k.budgetFrom != actor.id {
		return nil, Errorf(CodeScope, "key %s's budget was not handed over by this key, which is budgeted: its secret would spend more than this key may (rotate it with the key that gave it its budget, or with one without a budget)", k.id)
	}
	var current []byte
	for _, s := range k.secrets {
		if s.Expires.IsZero() {
			current = s.Hash
		}
	}
	e := &KeyRotated{
		Prefix: prefix, SecretHash: hex.EncodeToString(secretHash), OldHash: hex.EncodeToString(current),
		OldExpires: now.Add(grace), RotatedAt: now,
	}
	if actor == nil || actor.id == k.budgetFrom {
		e.BudgetFrom = k.budgetFrom
	}
	return e, nil
}

// Revoke ends the key for good. A revoked key records nothing more (nil, nil): a DELETE
// retried after success changes nothing.
func (k *Key) Revoke(actor *Key, now time.Time) (*KeyRevoked, error) {
	if err := k.manageable(actor); err != nil {
		return nil, err
	}
	if k.status == StatusRevoked {
		return nil, nil
	}
	return &KeyRevoked{RevokedAt: now}, nil
}

// Authenticate decides whether secretHash opens this key at now. The comparison is
// constant-time.
func (k *Key) Authenticate(secretHash []byte, now time.Time) error {
	if !k.Exists() || k.status != StatusActive {
		return Errorf(CodeBadCredential, "this API key is revoked")
	}
	for _, s := range k.secrets {
		if hmac.Equal(s.Hash, secretHash) {
			if !s.Expires.IsZero() && !now.Before(s.Expires) {
				return Errorf(CodeBadCredential, "this API key's secret was rotated out; use the new secret")
			}
			return nil
		}
	}
	return Errorf(CodeBadCredential, "unknown API key")
}

// RehydrateKey rebuilds a key from its stored events without re-checking them.
func RehydrateKey(events []Event) *Key {
	k := &Key{}
	for _, e := range events {
		k.Apply(e)
	}
	return k
}

// Apply folds one event into the key.
func (k *Key) Apply(e Event) {
	k.version++
	switch e := e.(type) {
	case *KeyCreated:
		k.id, k.accountID, k.label, k.prefix = e.KeyID, e.AccountID, e.Label, e.Prefix
		k.scopes, k.budgetUnits, k.budgetUSD, k.budgetPeriod = e.Scopes, e.BudgetUnits, e.BudgetUSD, e.BudgetPeriod.orTotal()
		k.env, _ = ParseEnv(e.Env)
		k.status, k.createdAt, k.budgetFrom = StatusActive, e.CreatedAt, e.BudgetFrom
		k.secrets = []Secret{{Hash: unhex(e.SecretHash)}}
	case *KeyUpdated:
		k.label, k.scopes, k.budgetUnits, k.budgetUSD = e.Label, e.Scopes, e.BudgetUnits, e.BudgetUSD
		k.budgetPeriod, k.budgetFrom = e.BudgetPeriod.orTotal(), e.BudgetFrom
	case *KeyRotated:
		k.budgetFrom = e.BudgetFrom
		// Every secret still working ends by the rotation's grace at the latest, not only
		// the current one: a rotation with no grace, after a leak, also stops a secret
		// that an earlier rotation's longer grace kept working.
		var kept []Secret
		for _, s := range k.secrets {
			if s.Expires.IsZero() || e.OldExpires.Before(s.Expires) {
				s.Expires = e.OldExpires
			}
			if s.Expires.After(e.RotatedAt) {
				kept = append(kept, s)
			}
		}
		k.secrets = append(kept, Secret{Hash: unhex(e.SecretHash)})
		k.prefix = e.Prefix
		at := e.RotatedAt
		k.rotatedAt = &at
	case *KeyRevoked:
		k.status = StatusRevoked
		at := e.RevokedAt
		k.revokedAt = &at
	}
}

func unhex(s string) []byte {
	b, _ := hex.DecodeString(s) // written by us from bytes
	return b
}
