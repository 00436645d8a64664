package httpapi

import (
	"errors"
	"net/http"

	"chessd/domain"
	"chessd/domain/position"
)

type positionRequest struct {
	FEN      *string `json:"fen"`
	Chess960 bool    `json:"chess960"`
}

// decodePosition reads a body naming one position. A refusal of the body names the
// FEN too when it is missing, or, when parse (legal-moves: a bad FEN is a 400 there,
// an answer for validate), when it does not parse.
func (s *Server) decodePosition(r *http.Request, parse bool) (positionRequest, error) {
	var req positionRequest
	if err := decode(r, &req, false); err != nil {
		if fieldProblems(err) { // with the problems of the fields it could read
			var more domain.Problems
			switch {
			case req.FEN == nil:
				more.Add("fen", "is required")
			case parse:
				if _, perr := position.Parse(*req.FEN, req.Chess960); perr != nil {
					more.Add("fen", reason(perr))
				}
			}
			err = withProblems(err, more)
		}
		return req, err
	}
	if req.FEN == nil {
		return req, domain.Invalid("fen", "is required")
	}
	return req, nil
}

// positionError makes a client error of a position.Error, keeping its field and reason.
func positionError(err error, field string) error {
	var pe *position.Error
	if errors.As(err, &pe) {
		if field == "" {
			field = pe.Field
		}
		return domain.Invalid(field, pe.Reason)
	}
	return err
}

func (s *Server) validate(w http.ResponseWriter, r *http.Request) {
	req, err := s.decodePosition(r, false)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	pos, err := position.Parse(*req.FEN, req.Chess960)
	if err != nil {
		var pe *position.Error
		if !errors.As(err, &pe) {
			s.writeError(w, r, err)
			return
		}
		// Asking whether a FEN is valid is the point here: "no" is an answer, not an error.
		writeJSON(w, http.StatusOK, map[string]any{
			"valid": false, "reason": pe.Reason, "code": pe.Code,
			"errors": []domain.FieldError{{Field: "fen", Reason: pe.Reason}},
		})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"valid": true, "fen": pos.FEN(), "normalized_fen": pos.Normalized(), "chess960": pos.Chess960(),
		"side_to_move": pos.SideToMove().String(), "in_check": pos.InCheck(), "status": pos.Status().String(),
		"legal_moves": len(pos.LegalMoves()),
	})
}

type moveJSON struct {
	UCI string `json:"uci"`
	SAN string `json:"san"`
}

func (s *Server) legalMoves(w http.ResponseWriter, r *http.Request) {
	req, err := s.decodePosition(r, true)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	pos, err := position.Parse(*req.FEN, req.Chess960)
	if err != nil {
		s.writeError(w, r, positionError(err, "fen"))
		return
	}
	moves := pos.LegalMoves()
	out := make([]moveJSON, len(moves))
	for i, m := range moves {
		out[i] = moveJSON{UCI: m.UCI, SAN: m.SAN}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"fen": pos.FEN(), "chess960": pos.Chess960(), "side_to_move": pos.SideToMove().String(),
		"status": pos.Status().String(), "in_check": pos.InCheck(), "count": len(out), "moves": out,
	})
}
