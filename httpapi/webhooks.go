package httpapi

import (
	"context"
	"net/http"
	"time"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/ledger"
	"chessd/webhook"
)

type webhookRequest struct {
	URL *string `json:"url"`
}

func (s *Server) webhookRecord(e webhook.Endpoint) map[string]any {
	return map[string]any{"id": e.ID, "url": e.URL, "env": e.Env, "created_at": e.CreatedAt.UTC().Format(time.RFC3339Nano),
		"links": map[string]string{"deliveries": s.baseURL + "/webhooks/" + e.ID + "/deliveries"}}
}

// createWebhook answers POST /webhooks: the secret is shown here once.
func (s *Server) createWebhook(w http.ResponseWriter, r *http.Request) {
	var req webhookRequest
	if err := decode(r, &req, false); err != nil {
		if fieldProblems(err) { // with the problems of the fields it could read
			err = withProblems(err, s.webhookProblems(req))
		}
		s.writeError(w, r, err)
		return
	}
	if err := s.webhookProblems(req).Err(); err != nil {
		s.writeError(w, r, err)
		return
	}
	key := principal(r.Context())
	stillActive := func(ctx context.Context, q eventstore.Querier) error {
		if ok, err := ledger.KeyActive(ctx, q, key.AccountID(), key.ID()); err != nil || ok {
			return err
		}
		return domain.Errorf(domain.CodeBadCredential, "this key was revoked while the call ran")
	}
	e, err := webhook.Create(r.Context(), s.pool, s.hooks, key.AccountID(), key.Env().String(), *req.URL, s.cfg.InsecureWebhooks, stillActive)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	rec := s.webhookRecord(*e)
	rec["secret"] = e.Secret
	writeJSON(w, http.StatusCreated, rec)
}

// webhookProblems are those of a POST /webhooks body's fields: the url, checked as
// webhook.Create checks it.
func (s *Server) webhookProblems(req webhookRequest) domain.Problems {
	var p domain.Problems
	if req.URL == nil {
		p.Add("url", "is required: the https address to deliver to")
	} else if err := webhook.CheckURL(*req.URL, s.cfg.InsecureWebhooks); err != nil {
		p = append(p, err.(*domain.Error).Fields...)
	}
	return p
}

// listWebhooks answers GET /webhooks: the account's endpoints of the key's env (or
// env=test for a live key).
func (s *Server) listWebhooks(w http.ResponseWriter, r *http.Request) {
	key := principal(r.Context())
	env, err := envOnly(r, "webhook endpoints")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	es, err := webhook.List(r.Context(), s.pool, key.AccountID(), env.String())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]map[string]any, 0, len(es))
	for _, e := range es {
		out = append(out, s.webhookRecord(e))
	}
	writeJSON(w, http.StatusOK, map[string]any{"webhooks": out})
}

func (s *Server) deleteWebhook(w http.ResponseWriter, r *http.Request) {
	key := principal(r.Context())
	if err := webhook.Delete(r.Context(), s.pool, key.AccountID(), key.Env().String(), pathVar(r, "id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// testWebhook answers POST /webhooks/{id}/test: a "ping" delivery, queued now.
func (s *Server) testWebhook(w http.ResponseWriter, r *http.Request) {
	key := principal(r.Context())
	id, err := webhook.Ping(r.Context(), s.pool, key.AccountID(), key.Env().String(), pathVar(r, "id"),
		map[string]any{"account_id": key.AccountID(), "requested_by_key": key.ID(), "at": time.Now().UTC().Format(time.RFC3339Nano)})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"delivery_id": id})
}

// webhookDeliveries answers GET /webhooks/{id}/deliveries: the newest 100, each with
// how its tries went.
func (s *Server) webhookDeliveries(w http.ResponseWriter, r *http.Request) {
	key := principal(r.Context())
	id := pathVar(r, "id")
	ds, err := webhook.Deliveries(r.Context(), s.pool, key.AccountID(), key.Env().String(), id, 100)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if len(ds) == 0 { // no deliveries, or not the account's endpoint: tell them apart
		es, err := webhook.List(r.Context(), s.pool, key.AccountID(), key.Env().String())
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		found := false
		for _, e := range es {
			found = found || e.ID == id
		}
		if !found {
			s.writeError(w, r, domain.Errorf(domain.CodeNotFound, "no webhook endpoint %q on this account", id))
			return
		}
	}
	out := make([]map[string]any, 0, len(ds))
	for _, d := range ds {
		out = append(out, deliveryRecord(d))
	}
	writeJSON(w, http.StatusOK, map[string]any{"deliveries": out})
}

// deliveryRecord is a delivery as the log shows it. Its times are UTC, as every time
// the API shows: pgx reads them in the server's zone.
func deliveryRecord(d webhook.Delivery) map[string]any {
	state := "pending"
	switch {
	case d.DeliveredAt != nil:
		state = "delivered"
	case d.FailedAt != nil:
		state = "failed"
	}
	var deliveredAt any // null until delivered
	if d.DeliveredAt != nil {
		deliveredAt = d.DeliveredAt.UTC().Format(time.RFC3339Nano)
	}
	// null once finished: the row still holds the time the last failure set, or its
	// claim's lapse, for a try that will never be made
	var nextAttemptAt any
	if state == "pending" {
		nextAttemptAt = d.NextAttemptAt.UTC().Format(time.RFC3339Nano)
	}
	return map[string]any{"delivery_id": d.ID, "type": d.EventType, "state": state, "attempts": d.Attempts,
		"created_at": d.CreatedAt.UTC().Format(time.RFC3339Nano), "delivered_at": deliveredAt, "last_status": d.LastStatus,
		"last_error": d.LastError, "next_attempt_at": nextAttemptAt, "data": d.Payload}
}
