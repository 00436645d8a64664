package ledger

import (
	"time"

	"chessd/domain"
)

// The outcomes of the money path, as the SQL functions and the meter name them.
const (
	OutcomeOK           = "ok"
	OutcomeBudgetUnits  = "budget_units"
	OutcomeBudgetUSD    = "budget_usd"
	OutcomeAccountUnits = "account_budget_units"
	OutcomeAccountUSD   = "account_budget_usd"
	OutcomeAllowance    = "allowance"
	OutcomeKeyless      = "keyless"
	OutcomeBacklog      = "backlog"
	OutcomeIdemMismatch = "idempotency_mismatch"
	OutcomeIdemRunning  = "idempotency_running"
	OutcomeStopped      = "stopped"
	// OutcomeStoppedUnsettled: a call answered after its meter's final drain (its
	// answer withheld, nothing charged).
	OutcomeStoppedUnsettled = "stopped_unsettled"
)

// outcomeRow is one row of the table of outcomes: what the client is told, by domain
// code (httpapi maps codes to statuses, once), and the sentinel callers test with
// errors.Is.
type outcomeRow struct {
	code       domain.Code
	message    string
	sentinel   error
	retryAfter time.Duration
}

// outcomes is the one table of refusals of the money path.
var outcomes = map[string]outcomeRow{
	OutcomeBudgetUnits:  {domain.CodeBudget, "this call would exceed the key's units budget; raise it with PATCH /v1/keys/{id}", ErrBudget, 0},
	OutcomeBudgetUSD:    {domain.CodeBudget, "this call would exceed the key's USD budget; raise it with PATCH /v1/keys/{id}", ErrBudget, 0},
	OutcomeAccountUnits: {domain.CodeBudget, "this call would exceed the account's units budget for this period; raise it with PATCH /v1/me", ErrBudget, 0},
	OutcomeAccountUSD:   {domain.CodeBudget, "this call would exceed the account's USD budget for this period; raise it with PATCH /v1/me", ErrBudget, 0},
	OutcomeAllowance:    {domain.CodeUpgrade, "the plan's daily allowance of units is used up for today (UTC); upgrade for more", ErrAllowance, 0},
	OutcomeKeyless:      {domain.CodeKeylessExhausted, "the keyless allowance for your address is used up for today; sign up for a key (POST /v1/signup)", ErrAllowance, 0},
	OutcomeBacklog: {domain.CodeUnavailable, "charges cannot be recorded right now (the database is slow or away); nothing was charged, retry",
		ErrBacklog, time.Second},
	OutcomeIdemMismatch: {domain.CodeIdempotencyMismatch, "this Idempotency-Key was already used with a different request; use a new key for a new request",
		ErrIdempotencyMismatch, 0},
	OutcomeIdemRunning: {domain.CodeInProgress, "a request with this Idempotency-Key is still running; retry after it finished",
		ErrIdempotencyRunning, time.Second},
	OutcomeStopped: {domain.CodeUnavailable, "this server is shutting down; nothing was charged, retry", ErrStopped, time.Second},
	OutcomeStoppedUnsettled: {domain.CodeUnavailable, "this server stopped before this call's charge could be recorded; nothing was charged, retry",
		ErrStopped, time.Second},
}

// More refusals (ErrBudget and ErrAllowance are in charge.go).
var (
	ErrBacklog             = errorString("charges cannot be recorded right now")
	ErrIdempotencyMismatch = errorString("idempotency key used with another request")
	ErrIdempotencyRunning  = errorString("idempotency key in use by a running request")
)

type errorString string

func (e errorString) Error() string { return string(e) }

// Refusal is a call the money path refused: nothing was reserved or charged. It
// unwraps to its sentinel (errors.Is(err, ErrBudget)) and to the domain error the client
// is shown.
type Refusal struct {
	Outcome string
	row     outcomeRow
}

func refusal(outcome string) error {
	countRefusal(outcome)
	row, ok := outcomes[outcome]
	if !ok {
		row = outcomeRow{domain.CodeInternal, "unexpected outcome " + outcome, nil, 0}
	}
	r := &Refusal{Outcome: outcome, row: row}
	if row.retryAfter > 0 {
		return &retryLater{r}
	}
	return r
}

// retryLater is a refusal that passes: it says when to try again (Retry-After).
type retryLater struct{ r *Refusal }

func (e *retryLater) Error() string             { return e.r.Error() }
func (e *retryLater) Unwrap() error             { return e.r }
func (e *retryLater) RetryAfter() time.Duration { return e.r.row.retryAfter }

func (r *Refusal) Error() string { return r.row.message }

func (r *Refusal) Unwrap() []error {
	out := []error{&domain.Error{Code: r.row.code, Message: r.row.message}}
	if r.row.sentinel != nil {
		out = append(out, r.row.sentinel)
	}
	return out
}
