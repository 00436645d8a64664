package domain

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/shopspring/decimal"
)

// JobState is a closed set; see CanMove for the transitions (decisions.md, Jobs).
type JobState struct{ name string }

var (
	StateQueued    = JobState{"queued"}
	StateRunning   = JobState{"running"}
	StateSucceeded = JobState{"succeeded"}
	StateFailed    = JobState{"failed"}
	StateCancelled = JobState{"cancelled"}
)

func (s JobState) String() string { return s.name }

// ParseJobState reads a state's name.
func ParseJobState(name string) (JobState, bool) {
	for _, s := range []JobState{StateQueued, StateRunning, StateSucceeded, StateFailed, StateCancelled} {
		if s.name == name {
			return s, true
		}
	}
	return JobState{}, false
}

// Terminal states never change.
func (s JobState) Terminal() bool {
	return s == StateSucceeded || s == StateFailed || s == StateCancelled
}

// CanMove tells whether from -> to is allowed: queued -> running -> succeeded | failed |
// cancelled, and queued -> cancelled.
func CanMove(from, to JobState) bool {
	switch from {
	case StateQueued:
		return to == StateRunning || to == StateCancelled
	case StateRunning:
		return to == StateSucceeded || to == StateFailed || to == StateCancelled
	}
	return false
}

// StreamJob is the stream type of jobs: "job-<id>".
const StreamJob = "job"

func JobStream(id string) string { return "job-" + id }

// JobPosition is one position a job analyses, in input order.
type JobPosition struct {
	Index   int    `json:"index"`
	FEN     string `json:"fen"`
	Ply     int    `json:"ply,omitempty"`      // analyze: the ply about to be played here
	Move    string `json:"move,omitempty"`     // analyze: the move played (UCI)
	MoveSAN string `json:"move_san,omitempty"` // analyze: the move played (SAN)
}

// JobSpec is what a job asks of the engine for every position.
type JobSpec struct {
	Depth    int    `json:"depth"`
	MultiPV  int    `json:"multipv"`
	Engine   string `json:"engine"`
	Path     string `json:"path"`
	Chess960 bool   `json:"chess960,omitempty"`
}

// Job events.
type JobSubmitted struct {
	JobID       string          `json:"job_id"`
	AccountID   string          `json:"account_id"`
	KeyID       string          `json:"key_id"`
	Env         string          `json:"env"`
	Kind        string          `json:"kind"` // analyze | batch
	Spec        JobSpec         `json:"spec"`
	Positions   []JobPosition   `json:"positions"`
	HoldUnits   int64           `json:"hold_units"` // reserved on the key's budget
	HoldUSD     decimal.Decimal `json:"hold_usd"`
	SubmittedAt time.Time       `json:"submitted_at"`
}

type JobStarted struct {
	Worker    string    `json:"worker"`
	StartedAt time.Time `json:"started_at"`
}

// JobResumed: a worker took over positions of a running job whose worker stopped.
type JobResumed struct {
	Worker    string    `json:"worker"`
	ResumedAt time.Time `json:"resumed_at"`
}

type JobPositionAnalysed struct {
	Index    int             `json:"index"`
	Result   json.RawMessage `json:"result"`
	Cached   bool            `json:"cached"`
	Units    int64           `json:"units"`
	USD      decimal.Decimal `json:"usd"`
	ChargeID string          `json:"charge_id"`
	Worker   string          `json:"worker,omitempty"` // who analysed it (since per-position leases)
	At       time.Time       `json:"at"`
}

type JobSucceeded struct {
	FinishedAt time.Time `json:"finished_at"`
}

// JobFailed carries the problem the client sees.
type JobFailed struct {
	Code       Code      `json:"code"`
	Message    string    `json:"message"`
	FinishedAt time.Time `json:"finished_at"`
}

type JobCancelled struct {
	FinishedAt time.Time `json:"finished_at"`
}

func (*JobSubmitted) EventType() string        { return "JobSubmitted" }
func (*JobStarted) EventType() string          { return "JobStarted" }
func (*JobResumed) EventType() string          { return "JobResumed" }
func (*JobPositionAnalysed) EventType() string { return "JobPositionAnalysed" }
func (*JobSucceeded) EventType() string        { return "JobSucceeded" }
func (*JobFailed) EventType() string           { return "JobFailed" }
func (*JobCancelled) EventType() string        { return "JobCancelled" }

func init() {
	RegisterEvent("JobSubmitted", func() Event { return &JobSubmitted{} })
	RegisterEvent("JobStarted", func() Event { return &JobStarted{} })
	RegisterEvent("JobResumed", func() Event { return &JobResumed{} })
	RegisterEvent("JobPositionAnalysed", func() Event { return &JobPositionAnalysed{} })
	RegisterEvent("JobSucceeded", func() Event { return &JobSucceeded{} })
	RegisterEvent("JobFailed", func() Event { return &JobFailed{} })
	RegisterEvent("JobCancelled", func() Event { return &JobCancelled{} })
}

// Job is the job aggregate.
type Job struct {
	submitted  JobSubmitted
	state      JobState
	results    map[int]*JobPositionAnalysed
	units      int64
	usd        decimal.Decimal
	startedAt  *time.Time
	finishedAt *time.Time
	failure    *JobFailed
	worker     string
	version    int64
}

// Clone is a copy of j that applying events to leaves j as it is.
func (j *Job) Clone() *Job {
	c := *j
	c.results = make(map[int]*JobPositionAnalysed, len(j.results))
	for i, r := range j.results { // events are never changed once applied: shared
		c.results[i] = r
	}
	return &c
}

func (j *Job) ID() string                        { return j.submitted.JobID }
func (j *Job) AccountID() string                 { return j.submitted.AccountID }
func (j *Job) KeyID() string                     { return j.submitted.KeyID }
func (j *Job) Env() string                       { return j.submitted.Env }
func (j *Job) Kind() string                      { return j.submitted.Kind }
func (j *Job) Spec() JobSpec                     { return j.submitted.Spec }
func (j *Job) Positions() []JobPosition          { return j.submitted.Positions }
func (j *Job) State() JobState                   { return j.state }
func (j *Job) Version() int64                    { return j.version }
func (j *Job) Exists() bool                      { return j.version > 0 }
func (j *Job) SubmittedAt() time.Time            { return j.submitted.SubmittedAt }
func (j *Job) StartedAt() *time.Time             { return j.startedAt }
func (j *Job) FinishedAt() *time.Time            { return j.finishedAt }
func (j *Job) Failure() *JobFailed               { return j.failure }
func (j *Job) Worker() string                    { return j.worker }
func (j *Job) CostUnits() int64                  { return j.units }
func (j *Job) CostUSD() decimal.Decimal          { return j.usd }
func (j *Job) Done() int                         { return len(j.results) }
func (j *Job) HoldUnits() int64                  { return j.submitted.HoldUnits }
func (j *Job) HoldUSD() decimal.Decimal          { return j.submitted.HoldUSD }
func (j *Job) Result(i int) *JobPositionAnalysed { return j.results[i] }

// VisibleTo tells whether k may see and touch the job: one of its account's, made in
// its env (test and live are two worlds). Any other job is reported like a missing one.
func (j *Job) VisibleTo(k *Key) bool {
	return j.Exists() && j.AccountID() == k.AccountID() && j.Env() == k.Env().String()
}

// MaxJobPositions bounds a job (service-spec.md, Limits).
const MaxJobPositions = 50

// NewJob checks a submission and returns its first event.
func NewJob(s JobSubmitted) (*JobSubmitted, error) {
	if len(s.Positions) == 0 || len(s.Positions) > MaxJobPositions {
		return nil, Errorf(CodeInvalid, "a job has 1 to %d positions, not %d", MaxJobPositions, len(s.Positions))
	}
	if s.Kind != "analyze" && s.Kind != "batch" {
		return nil, fmt.Errorf("job kind %q", s.Kind)
	}
	for i, p := range s.Positions {
		if p.Index != i {
			return nil, fmt.Errorf("job position %d has index %d", i, p.Index)
		}
	}
	return &s, nil
}

func (j *Job) move(to JobState) error {
	if !CanMove(j.state, to) {
		return Errorf(CodeConflict, "job %s is %s; it cannot become %s", j.ID(), j.state, to)
	}
	return nil
}

// Start moves a queued job to running on worker.
func (j *Job) Start(worker string, now time.Time) (*JobStarted, error) {
	if err := j.move(StateRunning); err != nil {
		return nil, err
	}
	return &JobStarted{Worker: worker, StartedAt: now}, nil
}

// Resume hands a running job to another worker.
func (j *Job) Resume(worker string, now time.Time) (*JobResumed, error) {
	if j.state != StateRunning {
		return nil, Errorf(CodeConflict, "job %s is %s, not running", j.ID(), j.state)
	}
	return &JobResumed{Worker: worker, ResumedAt: now}, nil
}

// Analysed records position i's result; each position is analysed (and charged) once.
func (j *Job) Analysed(e JobPositionAnalysed) (*JobPositionAnalysed, error) {
	if j.state != StateRunning {
		return nil, Errorf(CodeConflict, "job %s is %s, not running", j.ID(), j.state)
	}
	if e.Index < 0 || e.Index >= len(j.submitted.Positions) {
		return nil, fmt.Errorf("job %s has no position %d", j.ID(), e.Index)
	}
	if j.results[e.Index] != nil {
		return nil, Errorf(CodeConflict, "job %s position %d is already analysed", j.ID(), e.Index)
	}
	return &e, nil
}

// Succeed ends a job whose every position is analysed.
func (j *Job) Succeed(now time.Time) (*JobSucceeded, error) {
	if err := j.move(StateSucceeded); err != nil {
		return nil, err
	}
	if j.Done() != len(j.submitted.Positions) {
		return nil, fmt.Errorf("job %s: %d of %d positions analysed", j.ID(), j.Done(), len(j.submitted.Positions))
	}
	return &JobSucceeded{FinishedAt: now}, nil
}

// Fail ends a job with a problem.
func (j *Job) Fail(code Code, msg string, now time.Time) (*JobFailed, error) {
	if err := j.move(StateFailed); err != nil {
		return nil, err
	}
	return &JobFailed{Code: code, Message: msg, FinishedAt: now}, nil
}

// Cancel ends a queued or running job; a finished one refuses (409).
func (j *Job) Cancel(now time.Time) (*JobCancelled, error) {
	if j.state.Terminal() {
		return nil, Errorf(CodeConflict, "job %s already %s; it cannot be cancelled", j.ID(), j.state)
	}
	if err := j.move(StateCancelled); err != nil {
		return nil, err
	}
	return &JobCancelled{FinishedAt: now}, nil
}

// RehydrateJob rebuilds a job from its events without re-checking them.
func RehydrateJob(events []Event) *Job {
	j := &Job{results: map[int]*JobPositionAnalysed{}}
	for _, e := range events {
		j.Apply(e)
	}
	return j
}

// Apply folds one event into the job.
func (j *Job) Apply(e Event) {
	j.version++
	switch e := e.(type) {
	case *JobSubmitted:
		j.submitted, j.state = *e, StateQueued
	case *JobStarted:
		j.state, j.worker = StateRunning, e.Worker
		at := e.StartedAt
		j.startedAt = &at
	case *JobResumed:
		j.worker = e.Worker
	case *JobPositionAnalysed:
		j.results[e.Index] = e
		j.units += e.Units
		j.usd = j.usd.Add(e.USD)
	case *JobSucceeded:
		j.state = StateSucceeded
		at := e.FinishedAt
		j.finishedAt = &at
	case *JobFailed:
		j.state, j.failure = StateFailed, e
		at := e.FinishedAt
		j.finishedAt = &at
	case *JobCancelled:
		j.state = StateCancelled
		at := e.FinishedAt
		j.finishedAt = &at
	}
}
