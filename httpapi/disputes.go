package httpapi

import (
	"fmt"
	"net/http"
	"time"
	"unicode/utf8"

	"chessd/domain"
	"chessd/ledger"
)

// maxDisputeReason bounds a dispute's reason, in characters.
const maxDisputeReason = 2000

type disputeRequest struct {
	ChargeIDs []string `json:"charge_ids"`
	Reason    string   `json:"reason" text:"multiline"`
}

// openDispute answers POST /disputes: the account questions some of its charges.
func (s *Server) openDispute(w http.ResponseWriter, r *http.Request) {
	var req disputeRequest
	if err := decode(r, &req, false); err != nil {
		if fieldProblems(err) { // with the problems of the fields it could read
			err = withProblems(err, disputeProblems(req))
		}
		s.writeError(w, r, err)
		return
	}
	if err := disputeProblems(req).Err(); err != nil {
		s.writeError(w, r, err)
		return
	}
	d, err := s.commands.OpenDispute(r.Context(), s.actor(r), req.ChargeIDs, req.Reason)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	rows, _, err := ledger.Disputes(r.Context(), s.pool, ledger.DisputeQuery{AccountID: d.AccountID, Env: d.Env, ID: d.DisputeID})
	if err != nil || len(rows) != 1 {
		s.writeError(w, r, fmt.Errorf("read dispute %s back: %v (%d rows)", d.DisputeID, err, len(rows)))
		return
	}
	w.Header().Set("Location", s.baseURL+"/disputes/"+d.DisputeID)
	writeJSON(w, http.StatusCreated, s.disputeRecord(rows[0]))
}

// disputeProblems are those of a POST /disputes body's fields: its bounds, and what
// ledger.OpenDispute checks (so that both are named in one refusal).
func disputeProblems(req disputeRequest) domain.Problems {
	var p domain.Problems
	if n := utf8.RuneCountInString(req.Reason); n > maxDisputeReason {
		p.Add("reason", fmt.Sprintf("is %d characters; at most %d", n, maxDisputeReason))
	}
	for _, id := range req.ChargeIDs {
		if len(id) > 64 {
			p.Add("charge_ids", "holds an id longer than 64 bytes: not a charge id")
			break
		}
	}
	ledger.CheckDispute(&p, req.ChargeIDs, req.Reason)
	return p
}

// Disputes' list: GET /disputes.
const (
	defaultDisputesLimit = 100
	maxDisputesLimit     = 1000
)

// listDisputes answers GET /disputes[?state=open|accepted|rejected]: the account's
// disputes in the key's env (or env=test for a live key), newest first, a page at a time.
func (s *Server) listDisputes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	key := principal(r.Context())
	var p domain.Problems
	state := ""
	pg := page{limit: defaultDisputesLimit}
	le := listEnvOf(key)
	eachParam(q, func(name, v string) {
		switch {
		case name == "state":
			switch v {
			case ledger.DisputeOpen, ledger.DisputeAccepted, ledger.DisputeRejected:
			default:
				p.Add("state", "must be open, accepted or rejected")
			}
			state = v
		case pg.read(&p, name, v, maxDisputesLimit, "dsp_"):
		default:
			le.read(&p, name, v)
		}
	})
	if err := p.Err(); err != nil {
		s.writeError(w, r, err)
		return
	}
	env, err := le.show("disputes")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	rows, next, err := ledger.Disputes(r.Context(), s.pool, ledger.DisputeQuery{
		AccountID: key.AccountID(), Env: env.String(), State: state, After: pg.after, Limit: pg.limit})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]map[string]any, 0, len(rows))
	for _, d := range rows {
		out = append(out, s.disputeRecord(d))
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, map[string]any{"disputes": out, "next_cursor": s.nextPage(w, "/disputes", q, next)})
}

// getDispute answers GET /disputes/{id}: the account's own, in its key's env; 404 else.
func (s *Server) getDispute(w http.ResponseWriter, r *http.Request) {
	key := principal(r.Context())
	id := pathVar(r, "id")
	rows, _, err := ledger.Disputes(r.Context(), s.pool, ledger.DisputeQuery{AccountID: key.AccountID(), Env: key.Env().String(), ID: id})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if len(rows) == 0 {
		s.writeError(w, r, domain.Errorf(domain.CodeNotFound, "no dispute %q on this account", id))
		return
	}
	writeJSON(w, http.StatusOK, s.disputeRecord(rows[0]))
}

func (s *Server) disputeRecord(d ledger.DisputeRow) map[string]any {
	m := map[string]any{
		"dispute_id": d.ID, "state": d.State, "env": d.Env, "opened_by_key": d.KeyID, "charge_ids": d.ChargeIDs,
		"reason": d.Reason, "opened_at": d.OpenedAt.UTC().Format(time.RFC3339Nano), "resolved_at": nil, "resolution": nil,
		"credit_ids": d.CreditIDs, "links": map[string]string{"self": s.baseURL + "/disputes/" + d.ID},
	}
	if d.ResolvedAt != nil {
		m["resolved_at"] = d.ResolvedAt.UTC().Format(time.RFC3339Nano)
	}
	if d.Resolution != nil {
		m["resolution"] = *d.Resolution
	}
	return m
}
