package projections

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"chessd/domain"
	"chessd/eventstore"
)

// Jobs maintains the jobs read model and the job event stream that GET
// /jobs/{id}/events serves: per job, numbered events of kinds state, position,
// progress and end.
type Jobs struct{}

func (Jobs) Name() string     { return "jobs_v1" }
func (Jobs) Topic() string    { return "jobs" }
func (Jobs) Tables() []string { return []string{"jobs", "job_stream"} }

// JobStreamTopic is what the jobs projection announces (eventstore.NotifyChannel) when it
// adds to a job's event stream: GET /jobs/{id}/events waits for it instead of polling.
func JobStreamTopic(jobID string) string { return "job_stream:" + jobID }

// JobRecord is the job as clients see it (decisions.md, Jobs).
type JobRecord struct {
	ID             string         `json:"job_id"`
	Kind           string         `json:"kind"`
	State          string         `json:"state"`
	CreatedAt      time.Time      `json:"created_at"`
	StartedAt      *time.Time     `json:"started_at"`
	FinishedAt     *time.Time     `json:"finished_at"`
	PositionsTotal int            `json:"positions_total"`
	PositionsDone  int            `json:"positions_done"`
	CostUnits      int64          `json:"cost_units"`
	CostUSD        string         `json:"cost_usd"`
	HoldUnits      int64          `json:"hold_units"`
	Error          *JobError      `json:"error"`
	Spec           domain.JobSpec `json:"spec"`
}

// JobError is a failed job's problem, in brief.
type JobError struct {
	Code    domain.Code `json:"code"`
	Message string      `json:"message"`
}

// RecordOf renders a job aggregate.
func RecordOf(j *domain.Job) JobRecord {
	r := JobRecord{
		ID: j.ID(), Kind: j.Kind(), State: j.State().String(), CreatedAt: j.SubmittedAt(), StartedAt: j.StartedAt(),
		FinishedAt: j.FinishedAt(), PositionsTotal: len(j.Positions()), PositionsDone: j.Done(),
		CostUnits: j.CostUnits(), CostUSD: j.CostUSD().StringFixed(6), HoldUnits: j.HoldUnits(), Spec: j.Spec(),
	}
	if f := j.Failure(); f != nil {
		r.Error = &JobError{Code: f.Code, Message: f.Message}
	}
	return r
}

func (p Jobs) Apply(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	jobID := strings.TrimPrefix(e.StreamID, "job-")
	var current int64
	err := tx.QueryRow(ctx, `SELECT version FROM jobs WHERE job_id = $1 FOR UPDATE`, jobID).Scan(&current)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	return applyInStreamOrder(ctx, tx, e, current, func(e eventstore.Event) error { return p.apply(ctx, tx, jobID, e) })
}

// apply moves the jobs row and appends the SSE events, from the job as it stands after
// e (jobAt: one event folded into the job this projection left at e's predecessor).
func (Jobs) apply(ctx context.Context, tx pgx.Tx, jobID string, e eventstore.Event) error {
	last, err := domain.Decode(e.Type, e.SchemaVersion, e.Payload)
	if err != nil {
		return err
	}
	j, err := jobAt(ctx, tx, e, last)
	if err != nil {
		return err
	}
	rec := RecordOf(j)
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO jobs (job_id, account_id, key_id, kind, state, positions_total, positions_done, cost_units, cost_usd,
			created_at, started_at, finished_at, version)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
		ON CONFLICT (job_id) DO UPDATE SET state = excluded.state, positions_done = excluded.positions_done,
			cost_units = excluded.cost_units, cost_usd = excluded.cost_usd, started_at = excluded.started_at,
			finished_at = excluded.finished_at, version = excluded.version`,
		jobID, j.AccountID(), j.KeyID(), j.Kind(), rec.State, rec.PositionsTotal, rec.PositionsDone, rec.CostUnits,
		decimal.RequireFromString(rec.CostUSD), rec.CreatedAt, rec.StartedAt, rec.FinishedAt, e.Version)
	emit := func(kind string, data any) error {
		body, err := json.Marshal(data)
		if err != nil {
			return err
		}
		b.Queue(`INSERT INTO job_stream (job_id, seq, version, kind, data)
			SELECT $1, coalesce(max(seq), 0) + 1, $2, $3, $4 FROM job_stream WHERE job_id = $1`, jobID, e.Version, kind, body)
		// the job's open event streams wake at this transaction's commit (PostgreSQL
		// folds a transaction's equal notifications into one)
		eventstore.QueueNotify(b, JobStreamTopic(jobID))
		return nil
	}
	switch ev := last.(type) {
	case *domain.JobSubmitted, *domain.JobStarted:
		err = emit("state", rec)
	case *domain.JobPositionAnalysed:
		if err = emit("position", PositionOf(j, ev.Index)); err == nil {
			err = emit("progress", map[string]int{"done": rec.PositionsDone, "total": rec.PositionsTotal})
		}
	case *domain.JobSucceeded, *domain.JobFailed, *domain.JobCancelled:
		if err = emit("state", rec); err == nil {
			err = emit("end", rec)
		}
	}
	if err != nil {
		return err
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	folds.keep(e.StreamID, j, last)
	return nil
}

// folds keeps, per job, the aggregate this process's jobs projection last applied, so
// that the next event costs one fold, not a reload of the job's whole stream. An entry
// is used only when it stands at the event's predecessor: one left ahead by a
// transaction that rolled back, or by another runner, is reloaded from the events.
var folds = &jobFolds{jobs: map[string]*domain.Job{}}

type jobFolds struct {
	mu   sync.Mutex
	jobs map[string]*domain.Job // stream id -> aggregate
}

// maxFolds bounds the jobs kept; past it, all are forgotten (and reloaded when needed).
const maxFolds = 10_000

// take removes and returns stream's aggregate if it stands at version.
func (f *jobFolds) take(stream string, version int64) *domain.Job {
	f.mu.Lock()
	defer f.mu.Unlock()
	j, ok := f.jobs[stream]
	delete(f.jobs, stream) // one user at a time
	if !ok || j.Version() != version {
		return nil
	}
	return j
}

// keep stores j after its event last was applied; a finished job is forgotten.
func (f *jobFolds) keep(stream string, j *domain.Job, last domain.Event) {
	switch last.(type) {
	case *domain.JobSucceeded, *domain.JobFailed, *domain.JobCancelled:
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.jobs) >= maxFolds {
		clear(f.jobs)
	}
	f.jobs[stream] = j
}

// jobAt is the job as it stands after e (whose decoded form is d).
func jobAt(ctx context.Context, tx pgx.Tx, e eventstore.Event, d domain.Event) (*domain.Job, error) {
	if j := folds.take(e.StreamID, e.Version-1); j != nil {
		j.Apply(d)
		return j, nil
	}
	evs, err := eventstore.Load(ctx, tx, e.StreamID)
	if err != nil {
		return nil, err
	}
	var folded []domain.Event
	for _, s := range evs {
		if s.Version > e.Version {
			break
		}
		if s.Version == e.Version {
			folded = append(folded, d)
			break
		}
		ev, err := domain.Decode(s.Type, s.SchemaVersion, s.Payload)
		if err != nil {
			return nil, err
		}
		folded = append(folded, ev)
	}
	return domain.RehydrateJob(folded), nil
}

// PositionResult is one position of a job's result.
type PositionResult struct {
	Index   int             `json:"index"`
	FEN     string          `json:"fen"`
	Ply     int             `json:"ply,omitempty"`
	Move    string          `json:"move,omitempty"`
	MoveSAN string          `json:"move_san,omitempty"`
	Status  string          `json:"status"` // done | pending
	Result  json.RawMessage `json:"-"`
	Units   int64           `json:"cost_units"`
	Cached  bool            `json:"cached"`
}

// MarshalJSON inlines the analysis (eval, bestmove, pvs, depth, nodes...) beside the
// position's facts.
func (p PositionResult) MarshalJSON() ([]byte, error) {
	type plain PositionResult
	head, err := json.Marshal(plain(p))
	if err != nil || len(p.Result) < 2 {
		return head, err
	}
	var analysisFields map[string]json.RawMessage
	if err := json.Unmarshal(p.Result, &analysisFields); err != nil {
		return nil, err
	}
	for _, k := range []string{"fen", "cached"} { // the position's own
		delete(analysisFields, k)
	}
	if len(analysisFields) == 0 {
		return head, nil
	}
	rest, err := json.Marshal(analysisFields)
	if err != nil {
		return nil, err
	}
	return append(append(head[:len(head)-1], ','), rest[1:]...), nil
}

// PositionOf renders position i of a job.
func PositionOf(j *domain.Job, i int) PositionResult {
	p := j.Positions()[i]
	out := PositionResult{Index: i, FEN: p.FEN, Ply: p.Ply, Move: p.Move, MoveSAN: p.MoveSAN, Status: "pending"}
	if r := j.Result(i); r != nil {
		out.Status, out.Result, out.Units, out.Cached = "done", r.Result, r.Units, r.Cached
	}
	return out
}
