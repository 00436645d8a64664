package projections

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"chessd/domain"
	"chessd/eventstore"
)

// JobSummary is a job as GET /jobs lists it, from the jobs read model: what a list
// needs; GET /jobs/{id} has the whole job.
type JobSummary struct {
	JobHead
	KeyID string    `json:"key_id"` // the key that submitted it
	Error *JobError `json:"error"`  // why it failed; null unless it did
}

// JobCursor continues a list of jobs after the one it names (newest first): its
// creation time and id.
type JobCursor = domain.PageCursor

// DecodeJobCursor reads a cursor of the jobs list; anything else is a 400 naming `cursor`.
func DecodeJobCursor(s string) (JobCursor, error) { return domain.DecodePageCursor(s, "job_") }

// ListJobs returns up to limit of accountID's jobs in env (those its keys of that env
// submitted), newest first, after the cursor when given, in state when it is not
// empty; next is set when more follow. It reads the read model: a job submitted a
// moment ago appears once the jobs projection has applied it.
func ListJobs(ctx context.Context, q eventstore.Querier, accountID, env, state string, after *JobCursor, limit int) (jobs []JobSummary, next *JobCursor, err error) {
	var afterAt *time.Time
	var afterID string
	if after != nil {
		afterAt, afterID = &after.At, after.ID
	}
	rows, err := q.Query(ctx, `SELECT `+jobHeadColumns+`, j.key_id, j.error_code, j.error_message
		FROM jobs j JOIN api_keys k ON k.key_id = j.key_id
		WHERE j.account_id = $1 AND k.env = $2 AND ($3 = '' OR j.state = $3)
		  AND ($4::timestamptz IS NULL OR (j.created_at, j.job_id) < ($4, $5))
		ORDER BY j.created_at DESC, j.job_id DESC LIMIT $6`, accountID, env, state, afterAt, afterID, limit+1)
	if err != nil {
		return nil, nil, fmt.Errorf("list jobs: %w", err)
	}
	jobs, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (JobSummary, error) {
		var j JobSummary
		var code, message *string
		err := r.Scan(append(j.JobHead.fields(), &j.KeyID, &code, &message)...)
		if code != nil {
			j.Error = &JobError{Code: domain.Code(*code)}
			if message != nil {
				j.Error.Message = *message
			}
		}
		return j, err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("list jobs: %w", err)
	}
	if len(jobs) > limit {
		jobs = jobs[:limit]
		last := jobs[limit-1]
		next = &JobCursor{At: last.CreatedAt, ID: last.ID}
	}
	return jobs, next, nil
}

// ReadJobHead returns a job's head as the read model has it, nil when the jobs
// projection has not applied its submission (yet). It reads one row: cheap enough to
// follow a job on every notification of its stream (JobStreamTopic).
func ReadJobHead(ctx context.Context, q eventstore.Querier, jobID string) (*JobHead, error) {
	var j JobHead
	err := q.QueryRow(ctx, `SELECT `+jobHeadColumns+` FROM jobs j WHERE j.job_id = $1`, jobID).Scan(j.fields()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("job %s: %w", jobID, err)
	}
	return &j, nil
}

// jobHeadColumns are a JobHead's columns of the jobs table (as j), in fields' order.
const jobHeadColumns = `j.job_id, j.kind, j.state, j.created_at, j.started_at, j.finished_at,
	j.positions_total, j.positions_done, j.cost_units, j.cost_usd::text`

// fields are where a row of jobHeadColumns is scanned.
func (h *JobHead) fields() []any {
	return []any{&h.ID, &h.Kind, &h.State, &h.CreatedAt, &h.StartedAt, &h.FinishedAt,
		&h.PositionsTotal, &h.PositionsDone, &h.CostUnits, &h.CostUSD}
}
