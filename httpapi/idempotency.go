package httpapi

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"io"
	"net/http"

	"chessd/domain"
	"chessd/ledger"
)

// Idempotency-Key (any POST, IETF draft semantics; the rule lives in ledger): the key is
// claimed before the request's answer; a retry with the same key and request within 24
// hours gets the first answer again and changes nothing (Idempotent-Replayed: true); the
// same key with another request is 422; a retry while the first still runs is 409 with
// Retry-After. A costed call's answer is stored with its charge.

// idempotencyRequest reads the request's Idempotency-Key and body (which stays
// readable): nil without the header.
func idempotencyRequest(r *http.Request, scope string) (*ledger.Stored, error) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		return nil, nil
	}
	if err := checkIdempotencyKey(key); err != nil {
		return nil, err
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, decodeReadError(err)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	h := sha256.New()
	h.Write([]byte(r.Method + " " + r.URL.Path + "\n"))
	h.Write(body)
	return &ledger.Stored{Scope: scope, Key: key, RequestHash: h.Sum(nil)}, nil
}

// claim takes the request's Idempotency-Key, if any. done means the request was
// answered here (the first answer replayed, or a refusal); otherwise st, when not nil,
// is claimed and its answer must be stored or the claim given back.
func (s *Server) claim(w http.ResponseWriter, r *http.Request, scope string) (st *ledger.Stored, done bool) {
	st, err := idempotencyRequest(r, scope)
	if err != nil {
		s.writeError(w, r, err)
		return nil, true
	}
	if st == nil {
		return nil, false
	}
	first, err := s.meter.Claim(r.Context(), *st)
	if err != nil {
		s.writeError(w, r, err)
		return nil, true
	}
	if first != nil {
		s.replay(w, *first)
		return nil, true
	}
	st.Owner = s.meter.Owner()
	return st, false
}

// replay answers a repeated Idempotency-Key with the first answer, and its Location
// when the first answer made something (a job, a dispute): only the body is stored,
// and it names what was made.
func (s *Server) replay(w http.ResponseWriter, first ledger.Stored) {
	if loc := s.locationOf(first.Status, first.Response); loc != "" {
		w.Header().Set("Location", loc)
	}
	w.Header().Set("Idempotent-Replayed", "true")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(first.Status)
	w.Write(first.Response) //nolint:errcheck // the client went away
}

// keep stores the answer of a claimed key, or gives the claim back when the answer is
// an error: a retry runs afresh (after raising a budget, say). Secrets are stored
// redacted: they are shown once.
func (s *Server) keep(r *http.Request, st *ledger.Stored, status int, body []byte) {
	if st == nil {
		return
	}
	if status >= 400 {
		s.meter.Unclaim(r.Context(), *st)
		return
	}
	st.Status, st.Response = status, redactSecrets(body)
	if err := s.meter.Store(r.Context(), *st); err != nil {
		s.logger.WarnContext(r.Context(), "store idempotent response", "err", err)
	}
}

// shownOnce are the answer fields that carry a secret (a key's, a webhook's signing
// secret), with what a replay says in their place: a stored answer is a copy of the
// database, which must not hold a usable secret.
var shownOnce = map[string]string{
	"api_key": "(shown once; rotate the key, or ask for a new one by mail (POST /v1/recover), to get a new secret)",
	"secret":  "(shown once; delete the webhook and create it again to get a new secret)",
}

// redactSecrets is body with every shownOnce field replaced.
func redactSecrets(body []byte) []byte {
	var m map[string]any
	if json.Unmarshal(body, &m) != nil {
		return body
	}
	changed := false
	for field, text := range shownOnce {
		if _, ok := m[field]; ok {
			m[field], changed = text, true
		}
	}
	if !changed {
		return body
	}
	out, err := json.Marshal(m)
	if err != nil {
		return body
	}
	return out
}

// withClaim answers a replay or a conflict of the request's Idempotency-Key, or runs h
// with the key claimed (st nil without one). h stores the key's answer or gives it back
// (keep, keepError, a job's submission). A panic in h gives it back: else this server
// would renew a claim nobody answers, and retries be told to wait for as long as it
// lives. (Storing after a give-back stores nothing: both act on a running claim.)
func (s *Server) withClaim(w http.ResponseWriter, r *http.Request, scope string, h func(st *ledger.Stored)) {
	st, done := s.claim(w, r, scope)
	if done {
		return
	}
	returned := false
	defer func() {
		if !returned && st != nil {
			s.meter.Unclaim(r.Context(), *st)
		}
	}()
	h(st)
	returned = true
}

// idempotent wraps a POST handler that moves no money: replays and conflicts are
// answered before it runs, and its response is kept after.
func (s *Server) idempotent(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		scope := "ip:" + s.clientIP(r).String()
		if k := principal(r.Context()); k != nil {
			scope = k.ID()
		}
		s.withClaim(w, r, scope, func(st *ledger.Stored) {
			if st == nil {
				h(w, r)
				return
			}
			rec := &bodyRecorder{ResponseWriter: w, status: http.StatusOK}
			h(rec, r)
			s.keep(r, st, rec.status, rec.body.Bytes())
		})
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

// checkIdempotencyKey applies the header's rule: it is stored (and put in event
// metadata), so 1 to 255 printable ASCII characters, which excludes every control.
func checkIdempotencyKey(key string) error {
	if key == "" || len(key) > 255 || !printable(key) {
		return domain.Invalid("Idempotency-Key", "must be 1 to 255 printable ASCII characters")
	}
	return nil
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// locationOf is the Location of a stored first answer: a job accepted (202 with its
// job_id) or a dispute opened (201 with its dispute_id); "" for anything else.
func (s *Server) locationOf(status int, body []byte) string {
	var made struct {
		JobID     string `json:"job_id"`
		DisputeID string `json:"dispute_id"`
	}
	if json.Unmarshal(body, &made) != nil {
		return ""
	}
	switch {
	case status == http.StatusAccepted && made.JobID != "":
		return s.baseURL + "/jobs/" + made.JobID
	case status == http.StatusCreated && made.DisputeID != "":
		return s.baseURL + "/disputes/" + made.DisputeID
	}
	return ""
}
