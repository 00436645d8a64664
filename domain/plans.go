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
// the field and its cap (FieldError.Max).
func (l PlanLimits) CheckCaps(plan Plan, depth, multipv, movetimeMS int) error {
	above := func(field string, asked, limit int) error {
		reason := fmt.Sprintf("above the %s plan's cap of %d", plan, limit)
		return &Error{Code: CodeUpgrade, Message: fmt.Sprintf("%s %d is %s", field, asked, reason), Fields: []FieldError{AboveCap(field, reason, limit)}}
	}
	switch {
	case depth > l.MaxDepth:
		return above("depth", depth, l.MaxDepth)
	case multipv > l.MaxMultiPV:
		return above("multipv", multipv, l.MaxMultiPV)
	case movetimeMS > l.MaxMoveTimeMS:
		return above("movetime_ms", movetimeMS, l.MaxMoveTimeMS)
	}
	return nil
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
