package httpapi

import (
	"context"
	"net/http"
	"time"

	"chessd/domain"
	"chessd/postgres"
	"chessd/projections"
)

// healthz says the process is up; it touches nothing else.
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz says whether the server can do its work: PostgreSQL answers, every migration
// is applied and none is newer than this binary (during a rolling upgrade, the old
// servers step aside once a new one has migrated).
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	checks := map[string]string{"postgres": "ok", "migrations": "ok"}
	ready := true
	if err := s.pool.Ping(ctx); err != nil {
		checks["postgres"], ready = "unreachable", false
	} else if pending, newer, err := postgres.Compare(ctx, s.pool); err != nil {
		checks["migrations"], ready = "unknown", false
	} else if len(pending) > 0 {
		checks["migrations"], ready = "pending", false
	} else if len(newer) > 0 { // a newer chessd migrated the database: this one steps aside
		checks["migrations"], ready = "newer", false
	}
	if !ready {
		s.writeError(w, r, domain.Errorf(domain.CodeUnavailable, "not ready: postgres %s, migrations %s", checks["postgres"], checks["migrations"]))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "checks": checks})
}

// healthCheck is one line of GET /health.
type healthCheck struct {
	Status  string   `json:"status"`
	Pending []string `json:"pending,omitempty"` // migrations not applied
	Newer   []string `json:"newer,omitempty"`   // applied migrations this binary does not know
}

// projectionHealth is a projection's line of GET /health.
type projectionHealth struct {
	State string `json:"status"` // ok | degraded (events set aside)
	projections.Status
}

// health is the operator's view: PostgreSQL, migrations, and each projection's lag
// (events of its topic not processed yet) and set-aside events. "degraded" (200) means
// the service answers but something needs an operator: an event set aside, a migration
// pending. PostgreSQL out of reach is a 503 problem.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	unavailable := func(what string, err error) {
		s.logger.WarnContext(ctx, "health: "+what, "err", err)
		s.writeError(w, r, domain.Errorf(domain.CodeUnavailable, "unavailable: %s", what))
	}
	if err := s.pool.Ping(ctx); err != nil {
		unavailable("PostgreSQL is unreachable", err)
		return
	}
	status := "ok"
	migrations := healthCheck{Status: "ok"}
	pending, newer, err := postgres.Compare(ctx, s.pool)
	if err != nil {
		unavailable("PostgreSQL does not answer", err)
		return
	}
	switch {
	case len(pending) > 0:
		migrations, status = healthCheck{Status: "pending", Pending: pending}, "degraded"
	case len(newer) > 0:
		migrations, status = healthCheck{Status: "newer", Newer: newer}, "degraded"
	}
	head, sts, err := projections.Statuses(ctx, s.pool, projections.All())
	if err != nil {
		unavailable("PostgreSQL does not answer", err)
		return
	}
	byName := make(map[string]projectionHealth, len(sts))
	for _, st := range sts {
		ph := projectionHealth{State: "ok", Status: st}
		if st.SetAside > 0 {
			ph.State, status = "degraded", "degraded"
		}
		byName[st.Name] = ph
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"status": status,
		"head":   head,
		"checks": map[string]any{"postgres": healthCheck{Status: "ok"}, "migrations": migrations, "projections": byName},
	})
}
