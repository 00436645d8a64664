package projections

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

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

// JobHead is what every view of a job starts with: the record and the list.
type JobHead struct {
	ID             string     `json:"job_id"`
	Kind           string     `json:"kind"`
	State          string     `json:"state"`
	CreatedAt      time.Time  `json:"created_at"`
	StartedAt      *time.Time `json:"started_at"`
	FinishedAt     *time.Time `json:"finished_at"`
	PositionsTotal int        `json:"positions_total"`
	PositionsDone  int        `json:"positions_done"`
	CostUnits      int64      `json:"cost_units"`
	CostUSD        string     `json:"cost_usd"`
}

// JobRecord is the job as clients see it (decisions.md, Jobs).
type JobRecord struct {
	JobHead
	HoldUnits int64          `json:"hold_units"`
	Error     *JobError      `json:"error"`
	Spec      domain.JobSpec `json:"spec"`
}

// JobError is why a job failed as the read model keeps it (the JobFailed event's code
// and message); the HTTP layer shows it as a problem made from the code.
type JobError struct {
	Code    domain.Code `json:"code"`
	Message string      `json:"message"`
}

// RecordOf renders a job aggregate.
func RecordOf(j *domain.Job) JobRecord {
	r := JobRecord{
		JobHead: JobHead{
			ID: j.ID(), Kind: j.Kind(), State: j.State().String(), CreatedAt: j.SubmittedAt(), StartedAt: j.StartedAt(),
			FinishedAt: j.FinishedAt(), PositionsTotal: len(j.Positions()), PositionsDone: j.Done(),
			CostUnits: j.CostUnits(), CostUSD: j.CostUSD().StringFixed(6),
		},
		HoldUnits: j.HoldUnits(), Spec: j.Spec(),
	}
	if f := j.Failure(); f != nil {
		r.Error = &JobError{Code: f.Code, Message: f.Message}
	}
	return r
}

func (p Jobs) Apply(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	jobID := strings.TrimPrefix(e.StreamID, "job-")
	if applied, err := applyNext(ctx, tx, jobID, e); applied || err != nil {
		return err
	}
	var current int64
	err := tx.QueryRow(ctx, `SELECT version FROM jobs WHERE job_id = $1 FOR UPDATE`, jobID).Scan(&current)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	return applyInStreamOrder(ctx, tx, e, current, func(e eventstore.Event) error { return p.apply(ctx, tx, jobID, e) })
}

// applyNext applies e in one statement when this process's projection left its job at
// e's predecessor (folds) and the row still stands there: the common case, a job's
// events applied one after another. It reports false, having written nothing, when the
// row stands elsewhere (another runner moved it, or the transaction that moved it
// rolled back): the caller then reads the row's version and goes the careful way.
func applyNext(ctx context.Context, tx pgx.Tx, jobID string, e eventstore.Event) (bool, error) {
	j := folds.take(e.StreamID, e.Version-1)
	if j == nil {
		return false, nil
	}
	m, err := foldRun(j, []eventstore.Event{e})
	if err != nil {
		return false, err
	}
	b := &pgx.Batch{}
	m.queue(b, jobID)
	br := tx.SendBatch(ctx, b)
	moved, err := rowMoved(br)
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	if err != nil || !moved {
		return false, err
	}
	folds.keep(e.StreamID, j, m.last)
	return true, nil
}

// move is what a run of one job's events does to its read model: the row as the last
// leaves it, and the SSE events they add, each with its event's version.
type move struct {
	from, to      int64 // the row's version before and after
	row           jobRow
	last          domain.Event
	kinds, data   []string
	versions      []int64
	code, message *string
}

// foldRun folds evs, consecutive events of j's stream right after its version, into j.
func foldRun(j *domain.Job, evs []eventstore.Event) (move, error) {
	m := move{from: evs[0].Version - 1, to: evs[len(evs)-1].Version}
	for _, e := range evs {
		d, err := domain.Decode(e.Type, e.SchemaVersion, e.Payload)
		if err != nil {
			return m, err
		}
		j.Apply(d)
		row, emitted, err := jobRowAfter(j, d, e.Version)
		if err != nil {
			return m, err
		}
		kinds, data := emitted.columns()
		m.kinds, m.data = append(m.kinds, kinds...), append(m.data, data...)
		for range kinds {
			m.versions = append(m.versions, e.Version)
		}
		m.row, m.last = row, d
	}
	m.code, m.message = m.row.errorColumns()
	return m, nil
}

// queue queues the move as one statement: the row moved from m.from to m.to, the SSE
// events appended and the job's followers woken, or nothing at all when the row does
// not stand at m.from (the statement then returns no row).
func (m move) queue(b *pgx.Batch, jobID string) {
	r := m.row
	b.Queue(`WITH moved AS (
			UPDATE jobs SET state = $3, positions_done = $4, cost_units = $5, cost_usd = $6::text::numeric,
				started_at = $7, finished_at = $8, version = $2, error_code = $9, error_message = $10
			WHERE job_id = $1 AND version = $11 RETURNING job_id),
		streamed AS (`+jobStreamInsert("(SELECT job_id FROM moved)", "$12", "$13", "$14")+`)
		SELECT pg_notify($15, $16) FROM moved`,
		jobID, m.to, r.State, r.PositionsDone, r.CostUnits, r.CostUSD, r.StartedAt, r.FinishedAt, m.code, m.message,
		m.from, m.versions, m.kinds, m.data, eventstore.NotifyChannel, JobStreamTopic(jobID))
}

// rowMoved reads the result of a queued move, the next of br: whether the row moved.
func rowMoved(br pgx.BatchResults) (bool, error) {
	rows, err := br.Query()
	if err != nil {
		return false, err
	}
	moved := 0
	for rows.Next() {
		moved++
	}
	return moved > 0, rows.Err()
}

// applyBulk applies the runs of events of each job in evs that this process's
// projection left at the run's predecessor, a statement a job and one round trip in
// all (bulkApplier): a record of fifty positions is one statement, not fifty. It
// returns the events it did not take (whole streams, in order) for Apply one by one.
func (Jobs) applyBulk(ctx context.Context, tx pgx.Tx, evs []eventstore.Event) (rest, applied []eventstore.Event, err error) {
	var streams []string
	runs := map[string][]eventstore.Event{}
	for _, e := range evs {
		if runs[e.StreamID] == nil {
			streams = append(streams, e.StreamID)
		}
		runs[e.StreamID] = append(runs[e.StreamID], e)
	}
	type taken struct {
		stream string
		j      *domain.Job
		before *domain.Job // as it stood, kept again when the run is not applied here
		m      move
	}
	var ts []taken
	b := &pgx.Batch{}
	for _, s := range streams {
		run := runs[s]
		consecutive := true
		for i, e := range run {
			consecutive = consecutive && e.Version == run[0].Version+int64(i)
		}
		var j *domain.Job
		if consecutive {
			j = folds.take(s, run[0].Version-1)
		}
		if j == nil {
			rest = append(rest, run...)
			continue
		}
		before := j.Clone()
		m, err := foldRun(j, run)
		if err != nil { // Apply finds the event at fault
			folds.put(s, before)
			rest = append(rest, run...)
			continue
		}
		m.queue(b, strings.TrimPrefix(s, "job-"))
		ts = append(ts, taken{s, j, before, m})
	}
	if len(ts) == 0 {
		return rest, nil, nil
	}
	br := tx.SendBatch(ctx, b)
	moved := make([]bool, len(ts))
	for i := range ts {
		if moved[i], err = rowMoved(br); err != nil {
			break
		}
	}
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	for i, t := range ts {
		switch {
		case err != nil: // all of it is rolled back
			folds.put(t.stream, t.before)
		case !moved[i]: // the row stands elsewhere: the careful way
			folds.put(t.stream, t.before)
			rest = append(rest, runs[t.stream]...)
		default:
			folds.keep(t.stream, t.j, t.m.last)
			applied = append(applied, runs[t.stream]...)
		}
	}
	if err != nil {
		return nil, nil, err
	}
	return rest, applied, nil
}

// jobStreamInsert appends the SSE events kinds and data (text arrays, in order) of the
// job whose id the SQL expression job gives, numbered after its last one, each for the
// job event whose version is at the same place in versions.
func jobStreamInsert(job, versions, kinds, data string) string {
	return `INSERT INTO job_stream (job_id, seq, version, kind, data)
		SELECT j.job_id, j.seq + s.n, s.version, s.kind, s.data::jsonb
		FROM (SELECT ` + job + ` AS job_id, (SELECT coalesce(max(seq), 0) FROM job_stream WHERE job_id = ` + job + `) AS seq) j,
			unnest(` + versions + `::bigint[], ` + kinds + `::text[], ` + data + `::text[]) WITH ORDINALITY AS s(version, kind, data, n)
		WHERE j.job_id IS NOT NULL`
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
	row, emitted, err := jobRowAfter(j, last, e.Version)
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	code, message := row.errorColumns()
	b.Queue(`INSERT INTO jobs (job_id, account_id, key_id, kind, state, positions_total, positions_done, cost_units, cost_usd,
			created_at, started_at, finished_at, version, error_code, error_message)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::text::numeric, $10, $11, $12, $13, $14, $15)
		ON CONFLICT (job_id) DO UPDATE SET `+jobsUpdate,
		jobID, row.AccountID, row.KeyID, row.Kind, row.State, row.PositionsTotal, row.PositionsDone, row.CostUnits,
		row.CostUSD, row.CreatedAt, row.StartedAt, row.FinishedAt, row.Version, code, message)
	if len(emitted) > 0 {
		kinds, data := emitted.columns()
		versions := make([]int64, len(kinds))
		for i := range versions {
			versions[i] = e.Version
		}
		b.Queue(jobStreamInsert("$1::text", "$2", "$3", "$4"), jobID, versions, kinds, data)
		// the job's open event streams wake at this transaction's commit
		eventstore.QueueNotify(b, JobStreamTopic(jobID))
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	folds.keep(e.StreamID, j, last)
	return nil
}

// jobsUpdate is how a jobs row moves: the rest of it never changes.
const jobsUpdate = `state = excluded.state, positions_done = excluded.positions_done,
	cost_units = excluded.cost_units, cost_usd = excluded.cost_usd, started_at = excluded.started_at,
	finished_at = excluded.finished_at, version = excluded.version,
	error_code = excluded.error_code, error_message = excluded.error_message`

// errorColumns are the row's error_code and error_message: null unless the job failed.
func (r jobRow) errorColumns() (code, message *string) {
	if r.Error == nil {
		return nil, nil
	}
	c := string(r.Error.Code)
	return &c, &r.Error.Message
}

// jobRow is a jobs row.
type jobRow struct {
	JobRecord
	AccountID, KeyID string
	Version          int64
}

// emittedEvent is an event of a job's SSE stream, before it is numbered.
type emittedEvent struct {
	kind string
	data []byte
}

// emittedEvents are what one job event adds to the job's SSE stream, in order.
type emittedEvents []emittedEvent

// columns are the events' kinds and data, as the text arrays jobStreamInsert takes.
func (es emittedEvents) columns() (kinds, data []string) {
	for _, e := range es {
		kinds, data = append(kinds, e.kind), append(data, string(e.data))
	}
	return kinds, data
}

// jobRowAfter is the jobs row of j, just moved by its event last (at version), and what
// that event adds to the job's SSE stream.
func jobRowAfter(j *domain.Job, last domain.Event, version int64) (jobRow, emittedEvents, error) {
	row := jobRow{JobRecord: RecordOf(j), AccountID: j.AccountID(), KeyID: j.KeyID(), Version: version}
	var out emittedEvents
	emit := func(kind string, data any) error {
		body, err := json.Marshal(data)
		out = append(out, emittedEvent{kind, body})
		return err
	}
	var err error
	switch ev := last.(type) {
	case *domain.JobSubmitted, *domain.JobStarted:
		err = emit("state", row.JobRecord)
	case *domain.JobPositionAnalysed:
		if ev.Index < 0 || ev.Index >= len(j.Positions()) { // the projection's refusal: set aside, not a panic
			return row, nil, fmt.Errorf("position %d of a job of %d positions", ev.Index, len(j.Positions()))
		}
		if err = emit("position", PositionOf(j, ev.Index)); err == nil {
			err = emit("progress", map[string]int{"done": row.PositionsDone, "total": row.PositionsTotal})
		}
	case *domain.JobSucceeded, *domain.JobFailed, *domain.JobCancelled:
		if err = emit("state", row.JobRecord); err == nil {
			err = emit("end", row.JobRecord)
		}
	}
	return row, out, err
}

// A rebuild folds each job's events in memory, in position order, as they come: no
// stream is read back per event, and a chunk's rows go in three statements.
func (Jobs) rebuilder() rebuilder {
	return &jobsRebuild{jobs: map[string]*domain.Job{}, seq: map[string]int{}, broken: map[string]error{}}
}

type jobsRebuild struct {
	jobs   map[string]*domain.Job // stream id -> the job after its last event so far; ended ones are let go
	seq    map[string]int         // job id -> its SSE stream's last seq
	broken map[string]error       // stream id -> why a skipped event could not be folded
}

// jobWrites is one event's writes: the job's row after it, and its SSE events.
type jobWrites struct {
	row    jobRow
	stream []streamRow
}

type streamRow struct {
	seq  int
	kind string
	data []byte
}

func (r *jobsRebuild) fold(ctx context.Context, q eventstore.Querier, e eventstore.Event, skipped bool) (any, error) {
	if err := r.broken[e.StreamID]; err != nil {
		// the live projection folds the job from its stream, skipped events included
		return nil, err
	}
	d, err := domain.Decode(e.Type, e.SchemaVersion, e.Payload)
	if err != nil {
		if skipped {
			r.broken[e.StreamID] = err
			return nil, nil
		}
		return nil, err
	}
	j := r.jobs[e.StreamID]
	switch {
	case j != nil && j.Version() == e.Version-1:
		j.Apply(d)
	case e.Version == 1:
		j = domain.RehydrateJob([]domain.Event{d})
	default:
		// an event after the job ended: read its stream back (the rebuild's
		// transaction sees the log it rebuilds from)
		if j, err = loadJob(ctx, q, e, d); err != nil {
			return nil, err
		}
	}
	r.jobs[e.StreamID] = j
	if skipped {
		return nil, nil
	}
	switch d.(type) {
	case *domain.JobSucceeded, *domain.JobFailed, *domain.JobCancelled:
		delete(r.jobs, e.StreamID)
	}
	row, emitted, err := jobRowAfter(j, d, e.Version)
	if err != nil {
		return nil, err
	}
	w := jobWrites{row: row}
	for _, s := range emitted {
		r.seq[row.ID]++
		w.stream = append(w.stream, streamRow{r.seq[row.ID], s.kind, s.data})
	}
	return w, nil
}

func (r *jobsRebuild) queue(b *pgx.Batch, ws []any) error {
	var c struct {
		id, account, key, kind, state, usd []string
		total, done                        []int
		units, version                     []int64
		created                            []time.Time
		started, finished                  []*time.Time
		errCode, errMessage                []*string
	}
	var s struct {
		id, kind, data []string
		seq            []int
		version        []int64
	}
	// one row per job, its latest: a statement may not move a row twice
	latest := map[string]int{}
	for i, w := range ws {
		latest[w.(jobWrites).row.ID] = i
	}
	for i, w := range ws {
		w := w.(jobWrites)
		if r := w.row; latest[r.ID] == i {
			c.id, c.account, c.key, c.kind = append(c.id, r.ID), append(c.account, r.AccountID), append(c.key, r.KeyID), append(c.kind, r.Kind)
			c.state, c.usd = append(c.state, r.State), append(c.usd, r.CostUSD)
			c.total, c.done = append(c.total, r.PositionsTotal), append(c.done, r.PositionsDone)
			c.units, c.version = append(c.units, r.CostUnits), append(c.version, r.Version)
			c.created = append(c.created, r.CreatedAt)
			c.started, c.finished = append(c.started, r.StartedAt), append(c.finished, r.FinishedAt)
			code, message := r.errorColumns()
			c.errCode, c.errMessage = append(c.errCode, code), append(c.errMessage, message)
		}
		for _, e := range w.stream {
			s.id, s.kind, s.data = append(s.id, w.row.ID), append(s.kind, e.kind), append(s.data, string(e.data))
			s.seq, s.version = append(s.seq, e.seq), append(s.version, w.row.Version)
		}
	}
	b.Queue(`INSERT INTO jobs (job_id, account_id, key_id, kind, state, positions_total, positions_done, cost_units, cost_usd,
			created_at, started_at, finished_at, version, error_code, error_message)
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::int[], $8::bigint[],
			$9::text[]::numeric[], $10::timestamptz[], $11::timestamptz[], $12::timestamptz[], $13::bigint[], $14::text[], $15::text[])
		ON CONFLICT (job_id) DO UPDATE SET `+jobsUpdate,
		c.id, c.account, c.key, c.kind, c.state, c.total, c.done, c.units, c.usd, c.created, c.started, c.finished, c.version,
		c.errCode, c.errMessage)
	if len(s.id) > 0 {
		b.Queue(`INSERT INTO job_stream (job_id, seq, version, kind, data)
			SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[], $4::text[], $5::text[]::jsonb[])`,
			s.id, s.seq, s.version, s.kind, s.data)
	}
	topics := make([]string, 0, len(latest))
	for id := range latest {
		topics = append(topics, JobStreamTopic(id))
	}
	b.Queue(`SELECT pg_notify($1, t) FROM unnest($2::text[]) t`, eventstore.NotifyChannel, topics)
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

// put stores j as stream's aggregate, whatever its state: a run that was not applied
// gives back the aggregate it took.
func (f *jobFolds) put(stream string, j *domain.Job) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.jobs[stream] = j
}

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
func jobAt(ctx context.Context, q eventstore.Querier, e eventstore.Event, d domain.Event) (*domain.Job, error) {
	if j := folds.take(e.StreamID, e.Version-1); j != nil {
		j.Apply(d)
		return j, nil
	}
	return loadJob(ctx, q, e, d)
}

// loadJob folds the job's stream up to e from the events table.
func loadJob(ctx context.Context, q eventstore.Querier, e eventstore.Event, d domain.Event) (*domain.Job, error) {
	evs, err := eventstore.Load(ctx, q, e.StreamID)
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
	Index int `json:"index"`
	// FEN is the position's as submitted; once analysed, its JSON gives the FEN as
	// analysed (the result's), which differs where the analysis repaired counters
	// accepted before the rules refused them (position.ParseStored).
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
// position's facts, with the FEN it analysed.
func (p PositionResult) MarshalJSON() ([]byte, error) {
	type plain PositionResult
	if len(p.Result) < 2 {
		return json.Marshal(plain(p))
	}
	var analysisFields map[string]json.RawMessage
	if err := json.Unmarshal(p.Result, &analysisFields); err != nil {
		return nil, err
	}
	var analysed string
	if raw, ok := analysisFields["fen"]; ok && json.Unmarshal(raw, &analysed) == nil && analysed != "" {
		p.FEN = analysed
	}
	for _, k := range []string{"fen", "cached"} { // the position's own
		delete(analysisFields, k)
	}
	head, err := json.Marshal(plain(p))
	if err != nil || len(analysisFields) == 0 {
		return head, err
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
