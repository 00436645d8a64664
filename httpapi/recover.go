package httpapi

import (
	"context"
	"net/http"
	"time"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/projections"
	"chessd/webhook"
)

type recoverRequest struct {
	Email *string `json:"email"`
}

// requestRecovery answers POST /recover: a message with a recovery token goes to the
// address if an account holds it. The answer is the same either way; who holds an
// address is not this endpoint's to tell.
func (s *Server) requestRecovery(w http.ResponseWriter, r *http.Request) {
	if !s.addressLimit(w, r, "recover") {
		return
	}
	var req recoverRequest
	if err := decode(r, &req, false); err != nil {
		if fieldProblems(err) { // with the problems of the fields it could read
			var more domain.Problems
			if req.Email == nil {
				more.Add("email", "is required: the account's address")
			} else if _, eerr := domain.NormalizeEmail(*req.Email); eerr != nil {
				more = append(more, eerr.(*domain.Error).Fields...)
			}
			err = withProblems(err, more)
		}
		s.writeError(w, r, err)
		return
	}
	if req.Email == nil {
		s.writeError(w, r, domain.Invalid("email", "is required: the account's address"))
		return
	}
	if err := s.commands.RequestRecovery(r.Context(), *req.Email); err != nil {
		s.writeError(w, r, err)
		return
	}
	email, _ := domain.NormalizeEmail(*req.Email) // valid: RequestRecovery checked it
	writeJSON(w, http.StatusAccepted, map[string]any{"email": email})
}

type recoverKeyRequest struct {
	Token        *string `json:"token"`
	RevokeOthers bool    `json:"revoke_other_keys"`
}

// recoverKey answers POST /recover/confirm: the token from the recovery message issues
// a new key, shown once, as signup's; revoke_other_keys revokes every other key.
func (s *Server) recoverKey(w http.ResponseWriter, r *http.Request) {
	var req recoverKeyRequest
	if err := decode(r, &req, false); err != nil {
		if fieldProblems(err) { // with the problems of the fields it could read
			err = withProblems(err, tokenProblems(req.Token, "recovery"))
		}
		s.writeError(w, r, err)
		return
	}
	if err := tokenProblems(req.Token, "recovery").Err(); err != nil {
		s.writeError(w, r, err)
		return
	}
	var deleted []string
	takeover := func(ctx context.Context, q eventstore.Querier, accountID string) (err error) {
		deleted, err = webhook.DeleteAll(ctx, q, accountID) // set again if the transaction runs again
		return err
	}
	res, err := s.commands.RecoverKey(r.Context(), *req.Token, req.RevokeOthers, takeover, requestID(r.Context()))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	projections.WaitForKey(ctx, s.pool, res.KeyID, 1) //nolint:errcheck // the key works at once; the list may lag
	cancel()
	writeJSON(w, http.StatusCreated, map[string]any{
		"api_key": res.Secret, "key_id": res.KeyID, "plan": res.Plan.String(), "account_id": res.AccountID,
		"revoked_key_ids": nonNil(res.Revoked), "deleted_webhook_ids": nonNil(deleted),
	})
}

// nonNil answers ids, or an empty list for none: a list field is never null.
func nonNil(ids []string) []string {
	if ids == nil {
		return []string{}
	}
	return ids
}
