package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/postgres"
	"chessd/ratelimit"
)

// Problem is an RFC 9457 problem document with our next_action.
type Problem struct {
	Type       string              `json:"type"`
	Title      string              `json:"title"`
	Status     int                 `json:"status"`
	Detail     string              `json:"detail"`
	NextAction string              `json:"next_action"`
	Instance   string              `json:"instance,omitempty"`
	RequestID  string              `json:"request_id,omitempty"`
	Errors     []domain.FieldError `json:"errors,omitempty"`
}

// problemKind is one row of the table that maps a condition to what the client sees.
type problemKind struct {
	slug, title string
	status      int
	next        string
	about       string
}

// problemKinds is the one table from error code to status and next_action
// (decisions.md, Errors).
var problemKinds = map[domain.Code]problemKind{
	domain.CodeInvalid:             {"invalid-request", "Invalid request", 400, "fix_request", "The request is malformed or a value is out of range; `errors` names each field."},
	domain.CodeTooLarge:            {"body-too-large", "Request body too large", 413, "fix_request", "The body is over the size limit; send less."},
	domain.CodeNoCredential:        {"credential-required", "API key required", 401, "sign_up", "This endpoint needs `Authorization: Bearer <key>`; POST /v1/signup gives one."},
	domain.CodeBadCredential:       {"invalid-credential", "Invalid API key", 401, "fix_request", "The key is unknown, malformed, revoked or rotated out."},
	domain.CodeScope:               {"missing-scope", "Scope missing", 403, "fix_request", "The key does not hold the scope this endpoint needs."},
	domain.CodeVerifyEmail:         {"email-unverified", "E-mail address not verified", 403, "verify_email", "Verify the account's e-mail address first."},
	domain.CodeNotFound:            {"not-found", "Not found", 404, "fix_request", "No such resource on this account."},
	domain.CodeConflict:            {"conflict", "Conflict", 409, "fix_request", "The resource's state does not allow this."},
	domain.CodeUpgrade:             {"plan-limit", "Plan limit", 402, "upgrade", "The request is above the plan's caps."},
	domain.CodeBudget:              {"budget-exceeded", "Budget exceeded", 402, "raise_budget", "The key's budget would be exceeded; raise it with PATCH /v1/keys/{id}."},
	domain.CodeKeylessExhausted:    {"keyless-allowance-exhausted", "Keyless allowance used up", 402, "sign_up", "Calls without a key are limited per address; sign up for a key."},
	domain.CodeRateLimited:         {"rate-limited", "Too many requests", 429, "retry_after", "Slow down; Retry-After says when."},
	domain.CodeNotEnabled:          {"not-enabled", "Not enabled", 409, "contact", "This is not enabled yet; contact us."},
	domain.CodeUnavailable:         {"engine-unavailable", "Engine unavailable", 503, "retry_after", "The engines are busy or restarting; retry after Retry-After seconds."},
	domain.CodeInternal:            {"internal-error", "Internal error", 500, "contact", "Something unexpected happened; contact us with the request id."},
	codeMethodNotAllowed:           {"method-not-allowed", "Method not allowed", 405, "fix_request", "The path exists, but not with this method; see Allow."},
	domain.CodeIdempotencyMismatch: {"idempotency-key-reused", "Idempotency-Key reused", 422, "fix_request", "This Idempotency-Key was used with a different request; use a new key for a new request."},
	domain.CodeInProgress:          {"request-in-progress", "Request in progress", 409, "retry_after", "A request with this Idempotency-Key is still running; retry after Retry-After seconds to get its answer."},
	codeHeadersTooLarge:            {"headers-too-large", "Request headers too large", 431, "fix_request", "The request line and headers are over 32768 bytes; send less."},
	codeNotImplemented:             {"not-implemented", "Not implemented", 501, "fix_request", "The request uses an HTTP feature this server does not implement (a Transfer-Encoding other than chunked)."},
	codeHTTPVersion:                {"http-version-not-supported", "HTTP version not supported", 505, "fix_request", "Use HTTP/1.0 or HTTP/1.1."},
	codeExpectation:                {"expectation-failed", "Expectation failed", 417, "fix_request", "The only Expect this server meets is 100-continue."},
	codeDatabaseUnavailable:        {"service-unavailable", "Service unavailable", 503, "retry_after", "The database is out of reach for a moment (or just back, and the read models still catching up); retry after Retry-After seconds. A costed call answered so was not charged, unless the detail says its charge's outcome is not known yet."},
}

const (
	codeMethodNotAllowed    domain.Code = "method_not_allowed"
	codeDatabaseUnavailable domain.Code = "database_unavailable"
)

// statusClientClosed is what the log and the metrics record for a request whose client
// left before its answer.
const statusClientClosed = 499

// databaseRetryAfter is what a client is told to wait when the database is away: about
// what a restart or a failover takes.
const databaseRetryAfter = 2 * time.Second

// databaseProblem classifies, in one place, the errors that mean the database is away
// rather than that something went wrong: they answer 503 retry_after, never 500. ok is
// false for every other error.
func databaseProblem(err error) (detail string, ok bool) {
	var unsure *eventstore.UncertainCommitError
	switch {
	case errors.As(err, &unsure):
		return "the database went away while this request was being committed and has not said yet whether it was; " +
			"retry with the same Idempotency-Key: you get the first answer if it was committed, and it is charged once", true
	case errors.Is(err, eventstore.ErrNotCommitted):
		return "the database connection failed while this request was being committed; it was not committed (nothing was done or charged), retry", true
	case postgres.IsUnavailable(err):
		return "the database is out of reach for a moment; retry", true
	case errors.Is(err, errReadModelBehind):
		return "this account's read model is still catching up with its events (after a database restart, say); retry", true
	}
	return "", false
}

// errReadModelBehind: what a request reads of its own account is not in the read model
// yet, though its key works (authentication reads the events).
var errReadModelBehind = errors.New("the read model is behind")

// retryAfterer is an error that knows when to try again.
type retryAfterer interface{ RetryAfter() time.Duration }

// retryAfterSeconds is a wait in Retry-After's whole seconds, rounded up (at least 1):
// a client that waits what it is told is not refused again.
func retryAfterSeconds(d time.Duration) int {
	return max(1, int((d+time.Second-1)/time.Second))
}

// writeError answers err as problem+json. Unexpected errors are logged with the request
// id and reported without internals.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		// The client went away: nobody reads an answer, and it is not the server's
		// failure (no 500 in the metrics, no error in the log). 499, as nginx says.
		s.logger.DebugContext(r.Context(), "client went away", "request_id", requestID(r.Context()), "err", err)
		w.WriteHeader(statusClientClosed)
		return
	}
	code := domain.ErrorCode(err)
	dbDetail, dbAway := "", false
	if code == domain.CodeInternal {
		dbDetail, dbAway = databaseProblem(err)
		if dbAway {
			code = codeDatabaseUnavailable
		}
	}
	code, kind := kindOf(code)
	p := s.problemOf(kind)
	p.Instance, p.RequestID = r.URL.Path, requestID(r.Context())
	var de *domain.Error
	if dbAway {
		p.Detail = dbDetail
		s.logger.WarnContext(r.Context(), "database unavailable", "request_id", p.RequestID, "err", err)
	} else if code == domain.CodeInternal || !errors.As(err, &de) {
		p.Detail = "unexpected error; quote request id " + p.RequestID
		s.logger.ErrorContext(r.Context(), "request failed", "request_id", p.RequestID, "err", err)
	} else {
		p.Detail, p.Errors = de.Message, de.Fields
	}
	// A 401 says how to authenticate (RFC 9110 §11.6.1, RFC 6750 §3): with a bearer
	// token, and when one was sent and refused, that it was the token.
	switch code {
	case domain.CodeNoCredential:
		w.Header().Set("WWW-Authenticate", "Bearer")
	case domain.CodeBadCredential:
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
	}
	if code == domain.CodeRateLimited {
		// A 429's RateLimit fields are the refusing policy's; a refusal by no limiter
		// policy (the verification mail's, the streams') drops those of the rate limit
		// the request passed, which would say there is room.
		var rl *rateLimited
		if errors.As(err, &rl) {
			ratelimit.SetHeaders(w.Header(), rl.d)
		} else {
			w.Header().Del("RateLimit")
			w.Header().Del("RateLimit-Policy")
		}
	}
	var ra retryAfterer
	switch {
	case dbAway:
		w.Header().Set("Retry-After", strconv.Itoa(int(databaseRetryAfter/time.Second)))
	case errors.As(err, &ra):
		w.Header().Set("Retry-After", strconv.Itoa(retryAfterSeconds(ra.RetryAfter())))
	case kind.next == "retry_after":
		w.Header().Set("Retry-After", "1")
	}
	writeProblem(w, p)
}

// kindOf is code's row of problemKinds; a code the table lacks is an internal error.
func kindOf(code domain.Code) (domain.Code, problemKind) {
	if kind, ok := problemKinds[code]; ok {
		return code, kind
	}
	return domain.CodeInternal, problemKinds[domain.CodeInternal]
}

// problemOf is the problem of kind, without detail: its type, title, status and
// next_action. Every problem the API shows starts here, an answer's (writeError) and a
// failed job's error (jobProblemOf).
func (s *Server) problemOf(kind problemKind) Problem {
	return Problem{Type: s.problemType(kind.slug), Title: kind.title, Status: kind.status, NextAction: kind.next}
}

func writeProblem(w http.ResponseWriter, p Problem) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	json.NewEncoder(w).Encode(p) //nolint:errcheck // the client went away
}

func (s *Server) problemType(slug string) string { return s.baseURL + "/problems/" + slug }

// problemPage serves the document a problem's type URI points at.
func (s *Server) problemPage(w http.ResponseWriter, r *http.Request) {
	slug := pathVar(r, "slug")
	for _, k := range problemKinds {
		if k.slug == slug {
			writeJSON(w, http.StatusOK, map[string]any{
				"type": s.problemType(k.slug), "title": k.title, "status": k.status,
				"next_action": k.next, "description": k.about,
			})
			return
		}
	}
	s.writeError(w, r, domain.Errorf(domain.CodeNotFound, "no problem type %q", slug))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v) //nolint:errcheck // the client went away
}
