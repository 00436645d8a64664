package httpapi

import (
	"net/http"

	"chessd/domain"
)

type verifyEmailRequest struct {
	Token *string `json:"token"`
}

// verifyEmail answers POST /verify-email: the token from the verification message
// verifies its account's address. No key is needed: the token is the proof.
func (s *Server) verifyEmail(w http.ResponseWriter, r *http.Request) {
	var req verifyEmailRequest
	if err := decode(r, &req, false); err != nil {
		if fieldProblems(err) { // with the problems of the fields it could read
			err = withProblems(err, tokenProblems(req.Token, "verification"))
		}
		s.writeError(w, r, err)
		return
	}
	if err := tokenProblems(req.Token, "verification").Err(); err != nil {
		s.writeError(w, r, err)
		return
	}
	a, err := s.commands.VerifyEmail(r.Context(), *req.Token, requestID(r.Context()))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"account_id": a.ID(), "email": a.Email(), "email_verified": a.Verified()})
}

// tokenProblems are those of a body bringing the token of a message (kind:
// verification, recovery).
func tokenProblems(token *string, kind string) domain.Problems {
	var p domain.Problems
	if token == nil || *token == "" {
		p.Add("token", "is required: the token from the "+kind+" message")
	}
	return p
}

// resendVerification answers POST /me/verify-email: a new verification message.
func (s *Server) resendVerification(w http.ResponseWriter, r *http.Request) {
	if err := s.commands.ResendVerification(r.Context(), s.actor(r)); err != nil {
		s.writeError(w, r, err)
		return
	}
	a := account(r.Context())
	writeJSON(w, http.StatusAccepted, map[string]any{"email": a.Email(), "email_verified": false, "sent": true})
}

// verified refuses (403 verify_email) an account whose address is not verified yet.
func verified(r *http.Request) error {
	if a := account(r.Context()); a == nil || !a.Verified() {
		return domain.Errorf(domain.CodeVerifyEmail,
			"verify the account's e-mail address first: use the token of the verification message (POST /v1/verify-email), or ask for a new one (POST /v1/me/verify-email)")
	}
	return nil
}
