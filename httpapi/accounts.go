package httpapi

import (
	"cmp"
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/shopspring/decimal"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/ledger"
	"chessd/projections"
)

type signupRequest struct {
	Email  string `json:"email"`
	Name   string `json:"name"`
	Agent  string `json:"agent"`
	Source string `json:"source"`
}

func (s *Server) signup(w http.ResponseWriter, r *http.Request) {
	if !s.addressLimit(w, r, "signup") {
		return
	}
	var req signupRequest
	if err := decode(r, &req, false); err != nil {
		if fieldProblems(err) { // with the problems of the fields it could read
			var more domain.Problems
			domain.CheckSignup(&more, domain.Signup(req))
			err = withProblems(err, more)
		}
		s.writeError(w, r, err)
		return
	}
	res, err := s.commands.Signup(r.Context(), domain.Signup(req), requestID(r.Context()))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	if err := projections.WaitForAccount(ctx, s.pool, res.AccountID, 1); err == nil {
		err = projections.WaitForKey(ctx, s.pool, res.KeyID, 1)
	}
	cancel()
	writeJSON(w, http.StatusCreated, map[string]any{
		"api_key": res.Secret, "key_id": res.KeyID, "plan": res.Plan.String(), "account_id": res.AccountID,
	})
}

func (s *Server) me(w http.ResponseWriter, r *http.Request) {
	key := principal(r.Context())
	ctx := r.Context()
	acct, err := projections.GetAccount(ctx, s.pool, key.AccountID())
	if domain.ErrorCode(err) == domain.CodeNotFound {
		// an account made a moment ago (its key already works: authentication reads
		// the events) that the read model has not caught up with yet
		wait, cancel := context.WithTimeout(ctx, 2*time.Second)
		if projections.WaitForAccount(wait, s.pool, key.AccountID(), 1) == nil {
			acct, err = projections.GetAccount(ctx, s.pool, key.AccountID())
		} else if ctx.Err() == nil {
			// still behind (the projections start over after a database restart): the
			// account exists, so not 404 but 503, to be retried
			err = errReadModelBehind
		}
		cancel()
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	plan := account(ctx).Plan() // from the events: current even if the read model lags
	limits := plan.Limits()
	env := key.Env().String()
	day, err := ledger.DayUse(ctx, s.pool, key.AccountID(), env, time.Now())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	spend, err := ledger.KeyBalances(ctx, s.pool, key.AccountID())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// the caller's world only: keys of its own env (test and live are two worlds)
	rows, err := projections.ListKeys(ctx, s.pool, key.AccountID(), env)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	counts := map[string]int{"active": 0, "total": len(rows)}
	keys := []map[string]any{}
	for _, row := range rows { // oldest first
		if row.Status == string(domain.StatusActive) {
			counts["active"]++
		}
		b, ok := spend[row.KeyID]
		if !ok {
			continue
		}
		k := map[string]any{"key_id": b.KeyID, "env": b.Env, "spent_units": b.SpentUnits, "spent_usd": usd(b.SpentUSD),
			"held_units": b.HeldUnits, "held_usd": usd(b.HeldUSD), "budget_period": b.Period,
			"period_start": utc(b.PeriodStart), "period_end": utc(b.PeriodEnd),
			"period_spent_units": b.PeriodUnits, "period_spent_usd": usd(b.PeriodUSD),
			"budget_units": b.BudgetUnits, "budget_usd": nil, "remaining_units": b.RemainingUnits(), "remaining_usd": nil}
		if b.BudgetUSD != nil {
			k["budget_usd"] = usd(*b.BudgetUSD)
			k["remaining_usd"] = usd(*b.RemainingUSD())
		}
		keys = append(keys, k)
	}
	budget, err := ledger.AccountBudgetOf(ctx, s.pool, key.AccountID(), env)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"budget":         accountBudgetView(env, budget),
		"account_id":     acct.AccountID,
		"email":          account(ctx).Email(),
		"name":           acct.Name,
		"email_verified": account(ctx).Verified(), // from the events, as the plan: a verification just made shows
		"timezone":       account(ctx).Timezone(),
		"plan":           plan.String(),
		"caps":           limits,
		"today": map[string]any{"env": env, "units": day.Units, "held_units": day.HeldUnits, "allowance_units": limits.UnitsPerDay,
			"remaining_units": day.Remaining(limits.UnitsPerDay)},
		"created_at": acct.CreatedAt,
		"keys":       counts,
		"key":        map[string]any{"key_id": key.ID(), "env": key.Env().String(), "scopes": key.Scopes()},
		"key_spend":  keys,
	})
}

// updateMe changes the account's settings: its time zone (the calendar of budgets by
// period) and its budget in the calling key's env. Fields are taken one by one, so that
// an absent budget (unchanged) and a null one (removed) can be told apart.
func (s *Server) updateMe(w http.ResponseWriter, r *http.Request) {
	change, err := decodePatch(r, meFields, accountChangeOf)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	a, err := s.commands.UpdateAccount(r.Context(), s.actor(r), change)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if box, _ := r.Context().Value(ctxPrincipal).(*principalBox); box != nil {
		box.account = a // the answer shows the account as it is now
	}
	s.me(w, r)
}

// decodePatch reads a PATCH body as its members (a member left out is a field left
// as it is; null, where allowed, removes) and makes them a change with changeOf,
// refusing with every problem at once: the decoder's, with those of the members it
// could read, or a body naming no field (fields lists the ones there are).
func decodePatch[C any](r *http.Request, fields string, changeOf func(map[string]json.RawMessage) (C, domain.Problems)) (C, error) {
	var raw map[string]json.RawMessage
	err := decode(r, &raw, false)
	if err != nil && !fieldProblems(err) {
		var none C
		return none, err
	}
	c, p := changeOf(raw)
	if err != nil {
		return c, withProblems(err, p)
	}
	if len(raw) == 0 {
		p.Add("body", "names no field to change ("+fields+")")
	}
	return c, p.Err()
}

// accountChangeOf reads a PATCH /me body's members into the change, with every problem
// of its fields, in patchOrder.
func accountChangeOf(raw map[string]json.RawMessage) (commands.AccountChange, domain.Problems) {
	var change commands.AccountChange
	var budget domain.BudgetChange
	var p domain.Problems
	for _, name := range patchOrder(raw, meFields) {
		v := raw[name]
		switch name {
		case "timezone":
			if err := json.Unmarshal(v, &change.Timezone); err != nil || change.Timezone == nil {
				p.Add("timezone", "must be an IANA time zone name"+notNull(v))
			} else if err := domain.ValidateTimezone(*change.Timezone); err != nil {
				p = append(p, err.(*domain.Error).Fields...)
			}
		default:
			if !budgetField(&p, name, v, &budget) {
				p.Add(name, "is not a field that can be changed ("+meFields+")")
				continue
			}
			change.Budget = &budget
		}
	}
	// The zone (above) and the budgets given are checked here too, as UpdateAccount
	// checks them, so that they are named with the other fields' problems.
	domain.ValidateBudgets(&p, budget.Units, budget.USD)
	return change, p
}

// notNull ends the reason a PATCH member v is refused for when v is null, which no
// member but a budget takes (to remove it): said as a body read into a struct says it.
func notNull(v json.RawMessage) string {
	if string(v) == "null" {
		return ", not null"
	}
	return ""
}

// patchOrder is the names of a PATCH body's members in a fixed order, so that its
// problems are listed the same way every time (a map's order is random): the fields
// that can be changed in the order fields (the documentation's) lists them, then any
// other names, sorted.
func patchOrder(raw map[string]json.RawMessage, fields string) []string {
	known := strings.Split(fields, ", ")
	rank := func(name string) int {
		if i := slices.Index(known, name); i >= 0 {
			return i
		}
		return len(known)
	}
	names := slices.Collect(maps.Keys(raw))
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(cmp.Compare(rank(a), rank(b)), strings.Compare(a, b)) })
	return names
}

const meFields = "timezone, budget_units, budget_usd, budget_period"

// accountBudgetView is the account's budget in env as /me shows it: the period's
// bounds and spend only when there is a budget.
func accountBudgetView(env string, b ledger.AccountBudget) map[string]any {
	v := map[string]any{"env": env, "budget_units": b.BudgetUnits, "budget_usd": nil, "budget_period": b.Period,
		"period_start": utc(b.PeriodStart), "period_end": utc(b.PeriodEnd), "period_spent_units": nil, "period_spent_usd": nil,
		"held_units": b.HeldUnits, "remaining_units": b.RemainingUnits(), "remaining_usd": nil}
	if b.BudgetUSD != nil {
		v["budget_usd"], v["remaining_usd"] = usd(*b.BudgetUSD), usd(*b.RemainingUSD())
	}
	if b.BudgetUnits != nil || b.BudgetUSD != nil {
		v["period_spent_units"], v["period_spent_usd"] = b.PeriodUnits, usd(b.PeriodUSD)
	}
	return v
}

// keyRecord is the JSON form of a key (decisions.md, Keys).
type keyRecord struct {
	KeyID       string   `json:"key_id"`
	Label       string   `json:"label"`
	Scopes      []string `json:"scopes"`
	Env         string   `json:"env"`
	BudgetUnits *int64   `json:"budget_units"`
	BudgetUSD   *string  `json:"budget_usd"`
	SpentUnits  int64    `json:"spent_units"`
	SpentUSD    string   `json:"spent_usd"`
	Period      string   `json:"budget_period"`
	// BudgetFrom: the key that handed this one its budget out of its own (null: none)
	BudgetFrom *string `json:"budget_from"`
	// the current period: its bounds (null for "total") and what it spent, which the
	// budgets cap
	PeriodStart      *time.Time `json:"period_start"`
	PeriodEnd        *time.Time `json:"period_end"`
	PeriodSpentUnits int64      `json:"period_spent_units"`
	PeriodSpentUSD   string     `json:"period_spent_usd"`
	Status           string     `json:"status"`
	Prefix           string     `json:"prefix"`
	CreatedAt        time.Time  `json:"created_at"`
	LastUsedAt       *time.Time `json:"last_used_at"`
	RotatedAt        *time.Time `json:"rotated_at"`
	RevokedAt        *time.Time `json:"revoked_at"`
	APIKey           string     `json:"api_key,omitempty"` // only when a secret is issued
}

func usd(d decimal.Decimal) string { return d.StringFixed(6) }

// keyRecords renders keys the one way every key answer shows them (GET /keys, POST,
// PATCH, rotate): settings from the key, spend and last use from key_balances, read
// after the command committed. Times are UTC, as the read model's would be.
func (s *Server) keyRecords(ctx context.Context, accountID string, keys ...projections.KeyRow) ([]keyRecord, error) {
	spend, err := ledger.KeyBalances(ctx, s.pool, accountID)
	if err != nil {
		return nil, err
	}
	out := make([]keyRecord, 0, len(keys))
	for _, k := range keys {
		rec := keyRecord{
			KeyID: k.KeyID, Label: k.Label, Scopes: k.Scopes, Env: k.Env, BudgetUnits: k.BudgetUnits,
			SpentUSD: usd(decimal.Zero), Period: k.Period, BudgetFrom: k.BudgetFrom, PeriodSpentUSD: usd(decimal.Zero), Status: k.Status, Prefix: k.Prefix, CreatedAt: k.CreatedAt.UTC(),
			RotatedAt: utc(k.RotatedAt), RevokedAt: utc(k.RevokedAt),
		}
		if rec.Scopes == nil {
			rec.Scopes = []string{}
		}
		if k.BudgetUSD != nil {
			v := usd(*k.BudgetUSD)
			rec.BudgetUSD = &v
		}
		if b, ok := spend[k.KeyID]; ok {
			rec.SpentUnits, rec.SpentUSD, rec.LastUsedAt = b.SpentUnits, usd(b.SpentUSD), utc(b.LastUsedAt)
			rec.PeriodStart, rec.PeriodEnd = utc(b.PeriodStart), utc(b.PeriodEnd)
			rec.PeriodSpentUnits, rec.PeriodSpentUSD = b.PeriodUnits, usd(b.PeriodUSD)
		}
		out = append(out, rec)
	}
	return out, nil
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// writeKey answers a key command with the key's record, and its new secret if any.
func (s *Server) writeKey(w http.ResponseWriter, r *http.Request, status int, k *domain.Key, secret string) {
	recs, err := s.keyRecords(r.Context(), k.AccountID(), projections.KeyRowFrom(k))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	recs[0].APIKey = secret
	writeJSON(w, status, recs[0])
}

// listKeys shows the keys of the caller's env: a test key sees only test keys; a live
// key sees live keys, or test keys with env=test.
func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) {
	key := principal(r.Context())
	env, err := envOnly(r, "keys")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	rows, err := projections.ListKeys(r.Context(), s.pool, key.AccountID(), env.String())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out, err := s.keyRecords(r.Context(), key.AccountID(), rows...)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"keys": out})
}

type createKeyRequest struct {
	Label       string    `json:"label"`
	Scopes      *[]string `json:"scopes"`
	BudgetUnits *int64    `json:"budget_units"`
	BudgetUSD   *usdInput `json:"budget_usd"`
	Period      *string   `json:"budget_period"`
	Env         *string   `json:"env"`
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request) {
	actor := principal(r.Context())
	var req createKeyRequest
	if err := decode(r, &req, true); err != nil {
		if fieldProblems(err) { // with the problems of the fields it could read
			_, more := newKeySettings(actor, req)
			err = withProblems(err, more)
		}
		s.writeError(w, r, err)
		return
	}
	set, p := newKeySettings(actor, req)
	if err := p.Err(); err != nil {
		s.writeError(w, r, err)
		return
	}
	k, secret, err := s.commands.CreateKey(r.Context(), s.actor(r), set)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.settle(r.Context(), k)
	s.writeKey(w, r, http.StatusCreated, k, secret)
}

// newKeySettings reads a POST /keys body made by actor, with every problem of its
// fields: the period, env and scopes, and the label and budgets the domain checks
// again (domain.NewKey), so that one refusal names them all.
func newKeySettings(actor *domain.Key, req createKeyRequest) (domain.KeySettings, domain.Problems) {
	set := domain.KeySettings{Label: req.Label, BudgetUnits: req.BudgetUnits, BudgetUSD: req.BudgetUSD.decimalOf(), Env: actor.Env()}
	var p domain.Problems
	if req.Period != nil {
		set.Period = parsePeriod(&p, *req.Period)
	}
	if req.Env != nil {
		env, ok := domain.ParseEnv(*req.Env)
		if !ok {
			p.Add("env", "must be live or test")
		}
		set.Env = env
	}
	set.Scopes = actor.Scopes()
	if req.Scopes != nil {
		scopes, err := domain.ParseScopes(*req.Scopes)
		if err != nil {
			p = append(p, err.(*domain.Error).Fields...)
		} else if len(scopes) == 0 {
			p.Add("scopes", "must name at least one scope")
		}
		set.Scopes = scopes
	}
	domain.CheckKeyFields(&p, &set.Label, set.BudgetUnits, set.BudgetUSD)
	return set, p
}

// settle gives the keys projection a moment to catch up with a change, so that the
// client's next GET /keys shows it: the key changed and, for a budgeted acting key,
// the acting key too, whose budget a handover lowers in the same transaction.
// Correctness never depends on it: authentication reads the events themselves.
func (s *Server) settle(ctx context.Context, k *domain.Key) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := projections.WaitForKey(ctx, s.pool, k.ID(), k.Version()); err != nil {
		s.logger.WarnContext(ctx, "keys projection behind", "key_id", k.ID(), "err", err)
	}
	by := principal(ctx)
	if by == nil || by.ID() == k.ID() || by.BudgetUnits() == nil && by.BudgetUSD() == nil {
		return
	}
	v, err := eventstore.StreamVersion(ctx, s.pool, domain.KeyStream(by.ID()))
	if err == nil {
		err = projections.WaitForKey(ctx, s.pool, by.ID(), v)
	}
	if err != nil {
		s.logger.WarnContext(ctx, "keys projection behind", "key_id", by.ID(), "err", err)
	}
}

// updateKey takes a PATCH body field by field, so that an absent field (unchanged) and
// a null budget (cleared) can be told apart.
func (s *Server) updateKey(w http.ResponseWriter, r *http.Request) {
	c, err := decodePatch(r, keyFields, keyChangeOf)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	k, err := s.commands.UpdateKey(r.Context(), s.actor(r), pathVar(r, "id"), c)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.settle(r.Context(), k)
	s.writeKey(w, r, http.StatusOK, k, "")
}

// keyChangeOf reads a PATCH /keys/{id} body's members into the change, with every
// problem of its fields, in patchOrder.
func keyChangeOf(raw map[string]json.RawMessage) (domain.KeyChange, domain.Problems) {
	var c domain.KeyChange
	var p domain.Problems
	for _, name := range patchOrder(raw, keyFields) {
		v := raw[name]
		isNull := string(v) == "null"
		switch name {
		case "label":
			var label string
			if err := json.Unmarshal(v, &label); err != nil || isNull {
				p.Add("label", "must be a string"+notNull(v))
				continue
			}
			c.Label = &label
		case "scopes":
			var names []string
			if v[0] != '[' {
				p.Add("scopes", "must be an array of scope names")
				continue
			}
			before := len(p)
			if decodeValue(&p, "scopes", v, reflect.ValueOf(&names).Elem(), false); len(p) > before {
				continue // each element it could not read named by its index, as on POST /keys
			}
			scopes, err := domain.ParseScopes(names)
			if err != nil {
				p = append(p, err.(*domain.Error).Fields...)
			} else if len(scopes) == 0 {
				p.Add("scopes", "must name at least one scope")
			}
			c.Scopes = scopes
		default:
			if !budgetField(&p, name, v, &c.Budget) {
				p.Add(name, "is not a field that can be changed ("+keyFields+")")
			}
		}
	}
	// The label and budgets given are checked here too, as Update checks them, so that
	// they are named with the other fields' problems.
	domain.CheckKeyFields(&p, c.Label, c.Budget.Units, c.Budget.USD)
	return c, p
}

const keyFields = "label, scopes, budget_units, budget_usd, budget_period"

// budgetField takes one budget field of a PATCH body (budget_units, budget_usd: null
// removes the budget; budget_period) into c; false when name is not one.
func budgetField(p *domain.Problems, name string, v json.RawMessage, c *domain.BudgetChange) bool {
	isNull := string(v) == "null"
	switch name {
	case "budget_units":
		if isNull {
			c.ClearUnits = true
		} else if err := json.Unmarshal(v, &c.Units); err != nil {
			p.Add("budget_units", "must be an integer or null")
		}
	case "budget_usd":
		if isNull {
			c.ClearUSD = true
		} else {
			var u *usdInput
			if err := json.Unmarshal(v, &u); err != nil {
				p.Add("budget_usd", string(errUSDText)+", or null")
			}
			c.USD = u.decimalOf()
		}
	case "budget_period":
		var period string
		if err := json.Unmarshal(v, &period); err != nil || isNull {
			p.Add("budget_period", "must be total, month or day"+notNull(v))
			return true
		}
		c.Period = parsePeriod(p, period)
	default:
		return false
	}
	return true
}

func parsePeriod(p *domain.Problems, s string) domain.BudgetPeriod {
	period, ok := domain.ParseBudgetPeriod(s)
	if !ok {
		p.Add("budget_period", "must be total, month or day")
	}
	return period
}

func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request) {
	k, err := s.commands.RevokeKey(r.Context(), s.actor(r), pathVar(r, "id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.settle(r.Context(), k)
	w.WriteHeader(http.StatusNoContent)
}

type rotateRequest struct {
	GraceSeconds int64 `json:"grace_seconds"`
}

// rotateProblems are those of a rotation body's fields.
func rotateProblems(req rotateRequest) domain.Problems {
	var p domain.Problems
	if req.GraceSeconds < 0 || req.GraceSeconds > int64(domain.MaxRotationGrace/time.Second) {
		p.Add("grace_seconds", "must be from 0 to 86400")
	}
	return p
}

func (s *Server) rotateKey(w http.ResponseWriter, r *http.Request) {
	var req rotateRequest
	if err := decode(r, &req, true); err != nil {
		if fieldProblems(err) { // with the problems of the fields it could read
			err = withProblems(err, rotateProblems(req))
		}
		s.writeError(w, r, err)
		return
	}
	if err := rotateProblems(req).Err(); err != nil {
		s.writeError(w, r, err)
		return
	}
	k, secret, err := s.commands.RotateKey(r.Context(), s.actor(r), pathVar(r, "id"), time.Duration(req.GraceSeconds)*time.Second)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.settle(r.Context(), k)
	s.writeKey(w, r, http.StatusCreated, k, secret)
}
