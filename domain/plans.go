package domain

import "fmt"

// PlanLimits are a plan's caps (decisions.md: one table in code, shown in GET /me).
type PlanLimits struct {
	MaxDepth          int   `json:"max_depth"`
	MaxMultiPV        int   `json:"max_multipv"`
	MaxMoveTimeMS     int   `json:"max_movetime_ms"`
	UnitsPerDay       int64 `json:"units_per_day"`
	RequestsPerMinute int   `json:"requests_per_minute"`
}

// planLimits is the plan table.
var planLimits = map[Plan]PlanLimits{
	PlanFree:  {MaxDepth: 20, MaxMultiPV: 3, MaxMoveTimeMS: 10000, UnitsPerDay: 20000, RequestsPerMinute: 120},
	PlanHobby: {MaxDepth: 26, MaxMultiPV: 5, MaxMoveTimeMS: 30000, UnitsPerDay: 200000, RequestsPerMinute: 600},
	PlanPro:   {MaxDepth: 30, MaxMultiPV: 10, MaxMoveTimeMS: 60000, UnitsPerDay: 2000000, RequestsPerMinute: 3000},
}

// Limits is the plan's row of the table.
func (p Plan) Limits() PlanLimits { return planLimits[p] }

// CheckCaps refuses a request above the plan's caps (402 upgrade). The refusal names
// each field above its cap, with the cap (FieldError.Max), so that one retry within
// them all succeeds.
func (l PlanLimits) CheckCaps(plan Plan, depth, multipv, movetimeMS int) error {
	if depth <= l.MaxDepth && multipv <= l.MaxMultiPV && movetimeMS <= l.MaxMoveTimeMS {
		return nil
	}
	e := &Error{Code: CodeUpgrade}
	for _, c := range []struct {
		field        string
		asked, limit int
	}{{"depth", depth, l.MaxDepth}, {"multipv", multipv, l.MaxMultiPV}, {"movetime_ms", movetimeMS, l.MaxMoveTimeMS}} {
		if c.asked <= c.limit {
			continue
		}
		reason := fmt.Sprintf("above the %s plan's cap of %d", plan, c.limit)
		if e.Message == "" {
			e.Message = fmt.Sprintf("%s %d is %s", c.field, c.asked, reason)
		}
		e.Fields = append(e.Fields, AboveCap(c.field, reason, c.limit))
	}
	if len(e.Fields) > 1 {
		e.Message = fmt.Sprintf("%s (and %d more)", e.Message, len(e.Fields)-1)
	}
	return e
}

// PlanChanged moves an account to another plan (an operator's act while paid
// subscriptions are not enabled).
type PlanChanged struct {
	Plan   string `json:"plan"`
	Reason string `json:"reason"`
}

func (*PlanChanged) EventType() string { return "PlanChanged" }

func init() { RegisterEvent("PlanChanged", func() Event { return &PlanChanged{} }) }

// ChangePlan returns the event that moves a to plan.
func (a *Account) ChangePlan(plan Plan, reason string) (*PlanChanged, error) {
	if a.version == 0 {
		return nil, Errorf(CodeNotFound, "no such account")
	}
	if a.plan == plan {
		return nil, Errorf(CodeConflict, "account %s is already on the %s plan", a.id, plan)
	}
	return &PlanChanged{Plan: plan.String(), Reason: fmt.Sprintf("%.200s", reason)}, nil
}
