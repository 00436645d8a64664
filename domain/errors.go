// Package domain holds the service's events, aggregates and their invariants. It knows
// nothing of SQL or HTTP: commands load aggregates from events, call their methods, and
// append the events those methods return.
package domain

import (
	"errors"
	"fmt"
)

// Code classifies an error for the client; httpapi maps each code to a status and a
// next_action in one table.
type Code string

const (
	CodeInvalid          Code = "invalid"           // the request is wrong: fix it
	CodeTooLarge         Code = "too_large"         // the body is over the limit
	CodeNoCredential     Code = "no_credential"     // a key is needed and none was sent
	CodeBadCredential    Code = "bad_credential"    // unknown, malformed, revoked or rotated-out key
	CodeScope            Code = "scope"             // the key lacks the scope
	CodeVerifyEmail      Code = "verify_email"      // needs a verified e-mail address
	CodeNotFound         Code = "not_found"         // unknown id, or another account's
	CodeConflict         Code = "conflict"          // the state does not allow it
	CodeUpgrade          Code = "upgrade"           // above the plan's caps
	CodeBudget           Code = "budget"            // the key's budget would be exceeded
	CodeKeylessExhausted Code = "keyless_exhausted" // the keyless allowance is used up
	CodeRateLimited      Code = "rate_limited"
	CodeNotEnabled       Code = "not_enabled" // e.g. paid subscriptions
	CodeUnavailable      Code = "unavailable" // engines saturated or crashed
	CodeInternal         Code = "internal"
	// CodeIdempotencyMismatch: an Idempotency-Key reused with another request.
	CodeIdempotencyMismatch Code = "idempotency_mismatch"
	// CodeInProgress: a request with the same Idempotency-Key is still running.
	CodeInProgress Code = "in_progress"
)

// FieldError names one invalid field of a request. Max, when set, is the largest
// value the field may have for this caller (a plan's or the keyless cap): a client
// can ask again within it without reading the reason.
type FieldError struct {
	Field  string `json:"field"`
	Reason string `json:"reason"`
	Max    *int   `json:"max,omitempty"`
}

// Error is an error the client is told about.
type Error struct {
	Code    Code
	Message string
	Fields  []FieldError
}

func (e *Error) Error() string { return e.Message }

// Errorf makes an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// AboveCap is the FieldError of a field whose value is above its cap max.
func AboveCap(field, reason string, max int) FieldError {
	return FieldError{Field: field, Reason: reason, Max: &max}
}

// Invalid is a 400-class error about one field.
func Invalid(field, reason string) *Error {
	return &Error{Code: CodeInvalid, Message: field + ": " + reason, Fields: []FieldError{{Field: field, Reason: reason}}}
}

// ErrorCode is the code of err, CodeInternal for anything that is not an *Error.
func ErrorCode(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// Problems collects field errors so a client learns every mistake at once.
type Problems []FieldError

// Add records a problem with field.
func (p *Problems) Add(field, reason string) {
	*p = append(*p, FieldError{Field: field, Reason: reason})
}

// Err is nil when nothing was added, else one CodeInvalid error listing every field.
func (p Problems) Err() error {
	if len(p) == 0 {
		return nil
	}
	msg := p[0].Field + ": " + p[0].Reason
	if len(p) > 1 {
		msg = fmt.Sprintf("%s (and %d more)", msg, len(p)-1)
	}
	return &Error{Code: CodeInvalid, Message: msg, Fields: p}
}
