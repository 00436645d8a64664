package httpapi

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/jackc/pgx/v5"

	"chessd/domain"
	"chessd/ledger"
)

// Idempotency-Key (any POST): a retry with the same key and the same request within 24
// hours gets the first response again and changes nothing; the same key with another
// request is 409. For costed calls the first response is stored in the transaction that
// charges it, so a call is charged at most once whatever crashes in between.

const idempotencyWindow = "24 hours"

// idempotency is the state of one request's Idempotency-Key.
type idempotency struct {
	stored *ledger.Stored // nil without a header
}

// checkIdempotency reads the header and the body. When the key was seen with the same
// request, it writes the first response and returns done; with another request, a 409.
// The body stays readable by the handler.
func (s *Server) checkIdempotency(w http.ResponseWriter, r *http.Request, scope string) (idem idempotency, done bool) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		return idem, false
	}
	if len(key) > 255 || !printable(key) {
		s.writeError(w, r, domain.Invalid("Idempotency-Key", "must be 1 to 255 printable ASCII characters"))
		return idem, true
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		s.writeError(w, r, decodeReadError(err))
		return idem, true
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	h := sha256.New()
	h.Write([]byte(r.Method + " " + r.URL.Path + "\n"))
	h.Write(body)
	stored := ledger.Stored{Scope: scope, Key: key, RequestHash: h.Sum(nil)}
	ctx := r.Context()
	if _, err := s.pool.Exec(ctx, `DELETE FROM idempotency WHERE scope = $1 AND idem_key = $2
		AND created_at < now() - interval '`+idempotencyWindow+`'`, scope, key); err != nil {
		s.writeError(w, r, err)
		return idem, true
	}
	var first ledger.Stored
	err = s.pool.QueryRow(ctx, `SELECT request_hash, status, response FROM idempotency WHERE scope = $1 AND idem_key = $2`,
		scope, key).Scan(&first.RequestHash, &first.Status, &first.Response)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return idempotency{stored: &stored}, false
	case err != nil:
		s.writeError(w, r, err)
		return idem, true
	}
	first.Scope, first.Key = scope, key
	s.replay(w, r, stored, first)
	return idem, true
}

// replayStored answers a request whose Idempotency-Key was taken by a request that
// finished meanwhile: it reads that first response and replays it.
func (s *Server) replayStored(w http.ResponseWriter, r *http.Request, now ledger.Stored) {
	var first ledger.Stored
	err := s.pool.QueryRow(r.Context(), `SELECT request_hash, status, response FROM idempotency WHERE scope = $1 AND idem_key = $2`,
		now.Scope, now.Key).Scan(&first.RequestHash, &first.Status, &first.Response)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	first.Scope, first.Key = now.Scope, now.Key
	s.replay(w, r, now, first)
}

// replay answers a repeated Idempotency-Key from the first response.
func (s *Server) replay(w http.ResponseWriter, r *http.Request, now, first ledger.Stored) {
	if !bytes.Equal(now.RequestHash, first.RequestHash) {
		s.writeError(w, r, domain.Errorf(domain.CodeConflict,
			"Idempotency-Key %q was already used with a different request; use a new key for a new request", now.Key))
		return
	}
	w.Header().Set("Idempotent-Replayed", "true")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(first.Status)
	w.Write(first.Response) //nolint:errcheck // the client went away
}

// remember stores the first response of a request that moved no money (secrets are
// stored redacted: they are shown once).
func (s *Server) remember(r *http.Request, idem idempotency, status int, body []byte) {
	if idem.stored == nil || status >= 500 {
		return
	}
	var m map[string]any
	if json.Unmarshal(body, &m) == nil {
		if _, ok := m["api_key"]; ok {
			m["api_key"] = "(shown once; rotate the key to get a new secret)"
			body, _ = json.Marshal(m)
		}
	}
	st := idem.stored
	if _, err := s.pool.Exec(r.Context(), `INSERT INTO idempotency (scope, idem_key, request_hash, status, response)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`, st.Scope, st.Key, st.RequestHash, status, body); err != nil {
		s.logger.WarnContext(r.Context(), "store idempotent response", "err", err)
	}
}

// idempotent wraps a POST handler that moves no money: replays and conflicts are
// answered before it runs, and its response is remembered after.
func (s *Server) idempotent(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		scope := "ip:" + clientIP(r).String()
		if k := principal(r.Context()); k != nil {
			scope = k.ID()
		}
		idem, done := s.checkIdempotency(w, r, scope)
		if done {
			return
		}
		if idem.stored == nil {
			h(w, r)
			return
		}
		rec := &bodyRecorder{ResponseWriter: w, status: http.StatusOK}
		h(rec, r)
		s.remember(r, idem, rec.status, rec.body.Bytes())
	}
}

type bodyRecorder struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (b *bodyRecorder) WriteHeader(code int) {
	b.status = code
	b.ResponseWriter.WriteHeader(code)
}

func (b *bodyRecorder) Write(p []byte) (int, error) {
	b.body.Write(p)
	return b.ResponseWriter.Write(p)
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
