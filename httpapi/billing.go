package httpapi

import (
	"context"
	"net/http"
	"strings"

	"chessd/domain"
)

// BillingProvider is the payment provider behind checkout. None is enabled yet; a
// real one plugs in through Deps.Billing.
type BillingProvider interface {
	// Checkout returns the address where the account pays for plan.
	Checkout(ctx context.Context, accountID string, plan domain.Plan) (string, error)
}

type billingDisabled struct{}

func (billingDisabled) Checkout(_ context.Context, _ string, plan domain.Plan) (string, error) {
	return "", domain.Errorf(domain.CodeNotEnabled,
		"paid subscriptions are not enabled yet, so the %s plan cannot be bought here; contact us to get it", plan)
}

type checkoutRequest struct {
	Plan *string `json:"plan"`
}

func (s *Server) checkout(w http.ResponseWriter, r *http.Request) {
	var req checkoutRequest
	if err := decode(r, &req, false); err != nil {
		if fieldProblems(err) { // with the problems of the fields it could read
			_, more := checkoutPlan(req)
			err = withProblems(err, more)
		}
		s.writeError(w, r, err)
		return
	}
	plan, p := checkoutPlan(req)
	if err := p.Err(); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := verified(r); err != nil { // a plan is bought by an owner who reads the account's mail
		s.writeError(w, r, err)
		return
	}
	if principal(r.Context()).Env() != domain.EnvLive { // test mode grants no live power
		s.writeError(w, r, domain.Errorf(domain.CodeScope, "a plan is the whole account's, its live keys' caps included; buy it with a live key"))
		return
	}
	url, err := s.billing.Checkout(r.Context(), principal(r.Context()).AccountID(), plan)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"checkout_url": url, "plan": plan.String()})
}

// checkoutPlan reads a POST /billing/checkout body: the plan to buy, or its problem.
func checkoutPlan(req checkoutRequest) (domain.Plan, domain.Problems) {
	var p domain.Problems
	if req.Plan == nil {
		p.Add("plan", "is required (hobby or pro)")
		return domain.PlanFree, p
	}
	plan, ok := domain.ParsePlan(*req.Plan)
	if !ok || plan == domain.PlanFree {
		p.Add("plan", "must be hobby or pro")
	}
	return plan, p
}

// portal answers the address of the account's own page: the console's Account page,
// at the root of the service (the base address without its /v1).
func (s *Server) portal(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{
		"portal_url": strings.TrimSuffix(s.baseURL, "/v1") + "/account", "account_id": principal(r.Context()).AccountID(),
	})
}
