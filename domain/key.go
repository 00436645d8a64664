package domain

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

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
	Prefix      string           `json:"prefix"`
	SecretHash  string           `json:"secret_hash"` // hex HMAC-SHA-256 of the secret
	CreatedAt   time.Time        `json:"created_at"`
}

// KeyUpdated carries the key's settings after the change, whole.
type KeyUpdated struct {
	Label       string           `json:"label"`
	Scopes      []Scope          `json:"scopes"`
	BudgetUnits *int64           `json:"budget_units"`
	BudgetUSD   *decimal.Decimal `json:"budget_usd"`
	UpdatedAt   time.Time        `json:"updated_at"`
}

type KeyRotated struct {
	Prefix     string    `json:"prefix"`
	SecretHash string    `json:"secret_hash"`
	OldHash    string    `json:"old_hash"`
	OldExpires time.Time `json:"old_expires_at"` // the old secret works until then
	RotatedAt  time.Time `json:"rotated_at"`
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
}

// ValidateBudgets checks the budget values a client may set.
func ValidateBudgets(p *Problems, units *int64, usd *decimal.Decimal) {
	if units != nil && *units < 0 {
		p.Add("budget_units", "must be 0 or more")
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

func validateLabel(p *Problems, label string) {
	if utf8.RuneCountInString(label) > 100 {
		p.Add("label", "is longer than 100 characters")
	}
	if !utf8.ValidString(label) {
		p.Add("label", "is not valid UTF-8")
	}
}

// grantable checks that actor may hand out scopes and manage a key of env.
func grantable(actor *Key, scopes []Scope, env Env) error {
	if actor == nil {
		return nil // signup: the account's first key holds everything
	}
	if actor.env == EnvTest && env != EnvTest {
		return Errorf(CodeScope, "a test key can manage only test keys")
	}
	for _, s := range scopes {
		if !actor.HasScope(s) {
			return Errorf(CodeScope, "this key cannot grant the scope %q, which it does not hold", s)
		}
	}
	return nil
}

// NewKey checks a new key's settings against the acting key (nil at signup) and returns
// its first event.
func NewKey(id, accountID string, s KeySettings, actor *Key, prefix string, secretHash []byte, now time.Time) (*KeyCreated, error) {
	var p Problems
	validateLabel(&p, s.Label)
	ValidateBudgets(&p, s.BudgetUnits, s.BudgetUSD)
	if err := p.Err(); err != nil {
		return nil, err
	}
	if err := grantable(actor, s.Scopes, s.Env); err != nil {
		return nil, err
	}
	return &KeyCreated{
		KeyID: id, AccountID: accountID, Label: s.Label, Scopes: s.Scopes, Env: s.Env.String(),
		BudgetUnits: s.BudgetUnits, BudgetUSD: s.BudgetUSD, Prefix: prefix,
		SecretHash: hex.EncodeToString(secretHash), CreatedAt: now,
	}, nil
}

// KeyChange is a PATCH: nil fields stay as they are; Clear* sets a budget to none.
type KeyChange struct {
	Label            *string
	Scopes           []Scope // nil: unchanged
	BudgetUnits      *int64
	BudgetUSD        *decimal.Decimal
	ClearBudgetUnits bool
	ClearBudgetUSD   bool
}

// Update applies a change. A budget below what is already spent is allowed: it blocks
// further costed calls.
func (k *Key) Update(c KeyChange, actor *Key, now time.Time) (*KeyUpdated, error) {
	if k.status == StatusRevoked {
		return nil, Errorf(CodeConflict, "key %s is revoked; a revoked key cannot change", k.id)
	}
	if err := grantable(actor, c.Scopes, k.env); err != nil {
		return nil, err
	}
	e := &KeyUpdated{Label: k.label, Scopes: k.scopes, BudgetUnits: k.budgetUnits, BudgetUSD: k.budgetUSD, UpdatedAt: now}
	if c.Label != nil {
		e.Label = *c.Label
	}
	if c.Scopes != nil {
		e.Scopes = c.Scopes
	}
	switch {
	case c.ClearBudgetUnits:
		e.BudgetUnits = nil
	case c.BudgetUnits != nil:
		e.BudgetUnits = c.BudgetUnits
	}
	switch {
	case c.ClearBudgetUSD:
		e.BudgetUSD = nil
	case c.BudgetUSD != nil:
		e.BudgetUSD = c.BudgetUSD
	}
	var p Problems
	validateLabel(&p, e.Label)
	ValidateBudgets(&p, e.BudgetUnits, e.BudgetUSD)
	return e, p.Err()
}

// MaxRotationGrace bounds how long a rotated-out secret may keep working.
const MaxRotationGrace = 24 * time.Hour

// Rotate gives the key a new secret. The old one stops at once, or after grace.
// Spend and budget carry over: they belong to the key, not to the secret.
func (k *Key) Rotate(actor *Key, prefix string, secretHash []byte, grace time.Duration, now time.Time) (*KeyRotated, error) {
	if k.status == StatusRevoked {
		return nil, Errorf(CodeConflict, "key %s is revoked; a revoked key cannot be rotated", k.id)
	}
	if grace < 0 || grace > MaxRotationGrace {
		return nil, Invalid("grace_seconds", "must be from 0 to 86400")
	}
	if err := grantable(actor, nil, k.env); err != nil {
		return nil, err
	}
	var current []byte
	for _, s := range k.secrets {
		if s.Expires.IsZero() {
			current = s.Hash
		}
	}
	return &KeyRotated{
		Prefix: prefix, SecretHash: hex.EncodeToString(secretHash), OldHash: hex.EncodeToString(current),
		OldExpires: now.Add(grace), RotatedAt: now,
	}, nil
}

// Revoke ends the key for good. Revoking a revoked key is refused, so a DELETE retried
// after success reports what happened instead of silently succeeding twice.
func (k *Key) Revoke(actor *Key, now time.Time) (*KeyRevoked, error) {
	if k.status == StatusRevoked {
		return nil, Errorf(CodeConflict, "key %s is already revoked", k.id)
	}
	if err := grantable(actor, nil, k.env); err != nil {
		return nil, err
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
		k.scopes, k.budgetUnits, k.budgetUSD = e.Scopes, e.BudgetUnits, e.BudgetUSD
		k.env, _ = ParseEnv(e.Env)
		k.status, k.createdAt = StatusActive, e.CreatedAt
		k.secrets = []Secret{{Hash: unhex(e.SecretHash)}}
	case *KeyUpdated:
		k.label, k.scopes, k.budgetUnits, k.budgetUSD = e.Label, e.Scopes, e.BudgetUnits, e.BudgetUSD
	case *KeyRotated:
		var kept []Secret
		for _, s := range k.secrets {
			if s.Expires.IsZero() {
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
