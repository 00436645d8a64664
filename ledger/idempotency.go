package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"chessd/eventstore"
)

// Idempotency-Key (IETF draft semantics), one rule for every POST: a key is claimed,
// durably, before the request's answer; the answer is stored with the claim (for a
// costed call, in the group commit that charges it); a retry at any server gets the
// stored answer and is charged nothing; the same key with another request is refused
// (422), and while the first request still runs, a retry is told to wait (409). A claim
// whose server died expires (MeterConfig.LeaseTTL) and a retry takes it over; so does
// one its server will not answer (a failed Store or Unclaim, a call forgiven, a Claim
// whose caller saw an error): a server renews only the claims it still means to answer.

// Claim takes st's key for this request. It returns nil, nil when claimed: the caller
// must later Store an answer, Settle with it, or Unclaim. It returns the first answer
// when the key was used for this very request and answered already. A *Refusal
// (ErrIdempotencyMismatch, ErrIdempotencyRunning) otherwise.
func (m *Meter) Claim(ctx context.Context, st Stored) (*Stored, error) {
	var outcome string
	var status *int32
	var response []byte
	err := m.pool.QueryRow(ctx, `SELECT outcome, status, response FROM meter_claim($1, $2, $3, $4, $5)`,
		st.Scope, st.Key, st.RequestHash, m.owner, m.cfg.LeaseTTL).Scan(&outcome, &status, &response)
	if err != nil {
		return nil, fmt.Errorf("claim Idempotency-Key: %w", err)
	}
	switch outcome {
	case "claimed":
		m.mu.Lock()
		m.claimGen++
		m.claims[claimKey{st.Scope, st.Key}] = m.claimGen // renewed until answered or given back
		m.mu.Unlock()
		return nil, nil // st is claimed; its Owner is m.Owner()
	case "done":
		first := st
		first.Status, first.Response = int(*status), response
		return &first, nil
	}
	return nil, refusal(outcome)
}

// Answered looks st's key up without claiming it, for a request refused before it
// claims its key (a budget, an allowance or a plan's caps that a retry of an answered
// call meets no longer): the first answer when the key was used for this very request
// and answered, a *Refusal when it was used for another request or its first request
// still runs, as Claim would say; nil, nil when it is unused, expired or was given
// back, and the refusal stands.
func (m *Meter) Answered(ctx context.Context, st Stored) (*Stored, error) {
	var outcome string
	var status *int32
	var response []byte
	err := m.pool.QueryRow(ctx, `SELECT coalesce(CASE WHEN request_hash <> $3 THEN 'idempotency_mismatch'
			WHEN state = 'done' THEN 'done'
			WHEN expires_at >= now() THEN 'idempotency_running' END, ''), status, response
		FROM idempotency
		WHERE scope = $1 AND idem_key = $2 -- an answer is kept 24 hours (meter_claim)
			AND NOT (state = 'done' AND created_at < now() - interval '24 hours')`,
		st.Scope, st.Key, st.RequestHash).Scan(&outcome, &status, &response)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("look up Idempotency-Key: %w", err)
	case outcome == "done":
		first := st
		first.Status, first.Response = int(*status), response
		return &first, nil
	case outcome == "":
		return nil, nil // a claim nobody renews: a retry takes it over
	}
	return nil, refusal(outcome)
}

// storeAnswer is the one statement that stores a claimed key's answer: only its owner's
// claim takes it (a claim that expired and was taken over belongs to the retry).
const storeAnswer = `UPDATE idempotency SET state = 'done', status = $3, response = $4, expires_at = NULL
	WHERE scope = $1 AND idem_key = $2 AND owner = $5 AND state = 'running'`

// Store records the answer of a claimed key (requests that move no money; costed calls
// store theirs with the charge, Answered.Idempotency).
func (m *Meter) Store(ctx context.Context, st Stored) error {
	defer m.unclaimed(st) // stored, or nobody will: it expires
	st.Owner = m.owner
	_, err := StoreAnswer(ctx, m.pool, st)
	return err
}

// StoreAnswer stores st's answer in the caller's transaction (a job's submission, with
// its events), under the claim of st.Owner. False: the claim is not st.Owner's any more.
func StoreAnswer(ctx context.Context, q eventstore.Querier, st Stored) (bool, error) {
	tag, err := q.Exec(ctx, storeAnswer, st.Scope, st.Key, st.Status, st.Response, st.Owner)
	if err != nil {
		return false, fmt.Errorf("store idempotent answer: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// Unclaim gives a claimed key back when its request produced no answer to keep (an
// error): a retry runs afresh.
func (m *Meter) Unclaim(ctx context.Context, st Stored) {
	defer m.unclaimed(st) // given back, or it expires
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := m.pool.Exec(ctx, `DELETE FROM idempotency WHERE scope = $1 AND idem_key = $2 AND owner = $3 AND state = 'running'`,
		st.Scope, st.Key, m.owner); err != nil {
		m.logger.Warn("give back Idempotency-Key (it will expire)", "err", err)
	}
}

// claimKey names an Idempotency-Key claim.
type claimKey struct{ scope, key string }

// unclaimed stops renewing st's claim: this server will not answer it any more.
func (m *Meter) unclaimed(st Stored) {
	m.mu.Lock()
	delete(m.claims, claimKey{st.Scope, st.Key})
	m.mu.Unlock()
}
