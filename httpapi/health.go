package httpapi

import (
	"context"
	"net/http"
	"time"

	"chessd/domain"
	"chessd/postgres"
)

// healthz says the process is up; it touches nothing else.
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz says whether the server can do its work: PostgreSQL answers and every
// migration is applied.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	checks := map[string]string{"postgres": "ok", "migrations": "ok"}
	ready := true
	if err := s.pool.Ping(ctx); err != nil {
		checks["postgres"], ready = "unreachable", false
	} else if pending, err := postgres.Pending(ctx, s.pool); err != nil {
		checks["migrations"], ready = "unknown", false
	} else if len(pending) > 0 {
		checks["migrations"], ready = "pending", false
	}
	if !ready {
		s.writeError(w, r, domain.Errorf(domain.CodeUnavailable, "not ready: postgres %s, migrations %s", checks["postgres"], checks["migrations"]))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "checks": checks})
}
