package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"time"

	"chessd/analysis"
	"chessd/commands"
	"chessd/domain"
	"chessd/domain/position"
	"chessd/ledger"
	"chessd/projections"
)

// Job bounds (service-spec.md, Limits).
const (
	JobMaxDepth   = 14
	JobMaxMultiPV = 3
)

type batchRequest struct {
	FENs     []string `json:"fens"` // not a pointer: a pointer is left nil when an element is refused; a slice keeps those read
	Depth    *int     `json:"depth"`
	MultiPV  *int     `json:"multipv"`
	Engine   *string  `json:"engine"`
	Path     *string  `json:"path"`
	Chess960 bool     `json:"chess960"`
}

type analyzeRequest struct {
	PGN      *string `json:"pgn" text:"multiline"`
	FEN      *string `json:"fen"`
	Depth    *int    `json:"depth"`
	MultiPV  *int    `json:"multipv"`
	Engine   *string `json:"engine"`
	Path     *string `json:"path"`
	Chess960 bool    `json:"chess960"`
}

// jobSpec validates the settings every job shares, against the job bounds, the engine
// catalog and the account's plan.
func (s *Server) jobSpec(p *domain.Problems, depth, multipv *int, eng, path *string, chess960 bool) domain.JobSpec {
	spec := domain.JobSpec{Depth: JobMaxDepth, MultiPV: 1, Chess960: chess960}
	if depth != nil {
		if *depth < 1 || *depth > JobMaxDepth {
			p.Add("depth", fmt.Sprintf("must be from 1 to %d", JobMaxDepth))
		}
		spec.Depth = *depth
	}
	if multipv != nil {
		if *multipv < 1 || *multipv > JobMaxMultiPV {
			p.Add("multipv", fmt.Sprintf("must be from 1 to %d", JobMaxMultiPV))
		}
		spec.MultiPV = *multipv
	}
	id, resolved, _ := analysis.ResolveEngine(p, s.analysis.Catalog(), eng, path)
	spec.Engine, spec.Path = id, string(resolved)
	return spec
}

func (s *Server) batch(w http.ResponseWriter, r *http.Request) {
	s.withClaim(w, r, principal(r.Context()).ID(), func(idem *ledger.Stored) { s.batchClaimed(w, r, idem) })
}

func (s *Server) batchClaimed(w http.ResponseWriter, r *http.Request, idem *ledger.Stored) {
	submitDecoded(s, w, r, idem, "batch", s.batchJob)
}

// submitDecoded decodes a job request's body and submits the job job makes of it, or
// refuses it naming every bad field at once: the decoder's with those of the fields it
// could read. Nothing is held or started before.
func submitDecoded[T any](s *Server, w http.ResponseWriter, r *http.Request, idem *ledger.Stored, kind string,
	job func(T) (domain.JobSpec, []domain.JobPosition, domain.Problems)) {
	var req T
	err := decode(r, &req, false)
	if err != nil && !fieldProblems(err) {
		s.keepError(w, r, idem, err)
		return
	}
	spec, positions, p := job(req)
	if err != nil {
		err = withProblems(err, p)
	} else {
		err = p.Err()
	}
	if err != nil {
		s.keepError(w, r, idem, err)
		return
	}
	s.submit(w, r, idem, kind, spec, positions)
}

// batchJob reads a POST /batch body into the job's settings and positions, with every
// problem of its fields.
func (s *Server) batchJob(req batchRequest) (domain.JobSpec, []domain.JobPosition, domain.Problems) {
	var p domain.Problems
	spec := s.jobSpec(&p, req.Depth, req.MultiPV, req.Engine, req.Path, req.Chess960)
	var positions []domain.JobPosition
	switch {
	case req.FENs == nil: // absent or null; [] is empty, not nil
		p.Add("fens", "is required: 1 to 50 FENs")
	case len(req.FENs) == 0 || len(req.FENs) > domain.MaxJobPositions:
		p.Add("fens", fmt.Sprintf("must hold 1 to %d FENs, not %d", domain.MaxJobPositions, len(req.FENs)))
	default:
		for i, r := range parseFENs(req.FENs, req.Chess960) {
			if r.err != nil {
				p.Add(fmt.Sprintf("fens[%d]", i), reason(r.err))
				continue
			}
			positions = append(positions, domain.JobPosition{Index: i, FEN: r.fen})
		}
	}
	return spec, positions, p
}

// parsedFEN is one FEN of a batch, normalised, or why it is refused.
type parsedFEN struct {
	fen string
	err error
}

// parseFENs parses a batch's FENs on every core: a FEN costs about 40 µs (most of it
// notnil's decoding), and the engines wait for the job while 50 are parsed.
func parseFENs(fens []string, chess960 bool) []parsedFEN {
	out := make([]parsedFEN, len(fens))
	workers := min(runtime.GOMAXPROCS(0), (len(fens)+7)/8) // at least 8 FENs each
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w * len(fens) / workers; i < (w+1)*len(fens)/workers; i++ {
				out[i] = parseFEN(fens[i], chess960)
			}
		})
	}
	wg.Wait()
	return out
}

// parseFEN parses one FEN off the request's goroutine, where a panic would end the
// process rather than the request: one is refused like a FEN that does not parse.
func parseFEN(fen string, chess960 bool) (out parsedFEN) {
	defer func() {
		if r := recover(); r != nil {
			out = parsedFEN{err: errors.New("the FEN could not be read")}
		}
	}()
	pos, err := position.Parse(fen, chess960)
	if err != nil {
		return parsedFEN{err: err}
	}
	return parsedFEN{fen: pos.FEN()}
}

func (s *Server) analyze(w http.ResponseWriter, r *http.Request) {
	s.withClaim(w, r, principal(r.Context()).ID(), func(idem *ledger.Stored) { s.analyzeClaimed(w, r, idem) })
}

func (s *Server) analyzeClaimed(w http.ResponseWriter, r *http.Request, idem *ledger.Stored) {
	submitDecoded(s, w, r, idem, "analyze", s.analyzeJob)
}

// noGame is POST /analyze's refusal of a body with neither pgn nor fen.
const noGame = "give pgn (a game) or fen (one position)"

// analyzeJob reads a POST /analyze body into the job's settings and positions (the
// game's, or the one FEN), with every problem of its fields.
func (s *Server) analyzeJob(req analyzeRequest) (domain.JobSpec, []domain.JobPosition, domain.Problems) {
	var p domain.Problems
	spec := s.jobSpec(&p, req.Depth, req.MultiPV, req.Engine, req.Path, req.Chess960)
	var positions []domain.JobPosition
	switch {
	case req.PGN != nil && req.FEN != nil:
		p.Add("pgn", "give pgn or fen, not both")
	case req.PGN == nil && req.FEN == nil:
		p.Add("pgn", noGame)
	case req.FEN != nil:
		pos, err := position.Parse(*req.FEN, req.Chess960)
		if err != nil {
			p.Add("fen", reason(err))
		} else {
			positions = []domain.JobPosition{{Index: 0, FEN: pos.FEN()}}
		}
	default:
		game, err := position.ParsePGN(*req.PGN, req.Chess960, domain.MaxJobPositions)
		if err != nil {
			p.Add("pgn", reason(err))
			break
		}
		if len(game.Plies) == 0 {
			p.Add("pgn", "the game has no moves to analyse")
			break
		}
		spec.Chess960 = spec.Chess960 || game.Start.Chess960()
		for i, ply := range game.Plies {
			positions = append(positions, domain.JobPosition{Index: i, FEN: ply.FEN, Ply: ply.GamePly, Move: ply.Move.UCI, MoveSAN: ply.Move.SAN})
		}
	}
	return spec, positions, p
}

func reason(err error) string {
	var pe *position.Error
	if errors.As(err, &pe) {
		return pe.Reason
	}
	return err.Error()
}

// submit prices the job with the shared pricing function, checks the plan, and hands
// it to SubmitJob (which holds its whole price on the key's budget and stores the answer
// for a claimed Idempotency-Key in the same transaction).
func (s *Server) submit(w http.ResponseWriter, r *http.Request, idem *ledger.Stored, kind string, spec domain.JobSpec, positions []domain.JobPosition) {
	key, acct := principal(r.Context()), account(r.Context())
	plan := acct.Plan()
	if err := plan.Limits().CheckCaps(plan, spec.Depth, spec.MultiPV, 0); err != nil {
		s.keepError(w, r, idem, err)
		return
	}
	price, err := ledger.Quote(domain.Call{Endpoint: domain.Endpoint(kind), Depth: spec.Depth, MultiPV: spec.MultiPV, Positions: len(positions)})
	if err != nil {
		s.keepError(w, r, idem, err)
		return
	}
	render := func(j *domain.Job) (int, []byte, error) {
		body, err := json.Marshal(jobAnswer(s, j))
		return http.StatusAccepted, body, err
	}
	job, err := s.commands.SubmitJob(r.Context(), s.actor(r), acct.Plan().Limits().UnitsPerDay, domain.JobSubmitted{
		Kind: kind, Spec: spec, Positions: positions, HoldUnits: price.Units, HoldUSD: price.USD,
	}, idem, render)
	if err != nil {
		s.keepError(w, r, idem, err)
		return
	}
	s.logger.InfoContext(r.Context(), "job submitted", "job_id", job.ID(), "key_id", key.ID(), "positions", len(positions))
	w.Header().Set("Location", s.baseURL+"/jobs/"+job.ID())
	writeJSON(w, http.StatusAccepted, jobAnswer(s, job))
}

// keepError answers err and gives the claimed Idempotency-Key back: a retry runs
// afresh (after raising a budget, say).
func (s *Server) keepError(w http.ResponseWriter, r *http.Request, idem *ledger.Stored, err error) {
	if idem == nil {
		s.writeError(w, r, err)
		return
	}
	rec := &bodyRecorder{ResponseWriter: w, status: http.StatusOK}
	s.writeError(rec, r, err)
	s.keep(r, idem, rec.status, rec.body.Bytes())
}

// jobProblem is a failed job's error as clients see it (decisions.md, Jobs: "error
// (problem, when failed)"): the RFC 9457 problem its code gets as an answer, from the
// same table (problemKinds), with the code as an extension member and message, the
// detail again, for clients of the {code, message} form it replaced.
type jobProblem struct {
	Problem
	Code    domain.Code `json:"code"`
	Message string      `json:"message"` // deprecated: the same as Detail
}

// jobProblemOf renders the read model's {code, message} of a failed job; nil stays nil.
func (s *Server) jobProblemOf(e *projections.JobError) *jobProblem {
	if e == nil {
		return nil
	}
	_, kind := kindOf(e.Code)
	p := s.problemOf(kind)
	p.Detail = e.Message
	return &jobProblem{Problem: p, Code: e.Code, Message: e.Message}
}

// jobRecordJSON is a job record as every answer and event shows it: its error a problem.
type jobRecordJSON struct {
	// ID is decisions.md's name of the record's id; job_id, the same, stays for the
	// clients of earlier releases
	ID string `json:"id"`
	projections.JobRecord
	Error *jobProblem `json:"error"` // over the record's {code, message}
}

func (s *Server) jobRecordJSON(r projections.JobRecord) jobRecordJSON {
	return jobRecordJSON{ID: r.ID, JobRecord: r, Error: s.jobProblemOf(r.Error)}
}

type jobJSON struct {
	jobRecordJSON
	Links map[string]string `json:"links"`
}

func jobAnswer(s *Server, j *domain.Job) jobJSON {
	base := s.baseURL + "/jobs/" + j.ID()
	return jobJSON{jobRecordJSON: s.jobRecordJSON(projections.RecordOf(j)), Links: map[string]string{
		"self": base, "result": base + "/result", "events": base + "/events"}}
}

// streamedJobData is what a job's stream event says: a state or end event's record is
// rendered again, its error a problem (the read model keeps the record as the
// projection wrote it, with {code, message}); the other kinds as they are.
func (s *Server) streamedJobData(e projections.StreamEvent) []byte {
	if e.Kind != "state" && e.Kind != "end" {
		return e.Data
	}
	var r projections.JobRecord
	if err := json.Unmarshal(e.Data, &r); err != nil {
		return e.Data
	}
	out, err := json.Marshal(s.jobRecordJSON(r))
	if err != nil {
		return e.Data
	}
	return out
}

// ownJob loads one of the caller's jobs from its events (always current); another
// account's job, or one of the other env, is 404, like an unknown one.
func (s *Server) ownJob(r *http.Request) (*domain.Job, error) {
	id := pathVar(r, "id")
	j, err := commands.LoadJob(r.Context(), s.pool, id)
	if err != nil {
		return nil, err
	}
	if !j.VisibleTo(principal(r.Context())) {
		return nil, domain.Errorf(domain.CodeNotFound, "no job %q on this account", id)
	}
	return j, nil
}

// streamStillAllowed checks a job's open event stream's key again, before each batch of
// events and each keep-alive: a key revoked, or no longer holding the jobs scope, since
// the stream opened gets nothing more. It is told why in an `error` event (no id: a
// reconnect resumes where it was, and is refused) and the stream ends. A check that
// cannot be made (the database away, a limit) ends the stream without an event, as a
// failed read does: the client reconnects with Last-Event-ID. From memory while the
// key watcher vouches for the key (auth.Authenticator.Remembered), so a quiet stream
// still makes no query.
func (s *Server) streamStillAllowed(w http.ResponseWriter, r *http.Request) bool {
	key, err := s.authenticateRemembered(r)
	if err == nil && (key == nil || !key.HasScope(domain.ScopeJobs)) {
		err = domain.Errorf(domain.CodeScope, "this key lacks the scope %q that %s %s needs", domain.ScopeJobs, r.Method, r.URL.Path)
	}
	if err == nil {
		return true
	}
	if c := domain.ErrorCode(err); c != domain.CodeBadCredential && c != domain.CodeScope {
		return false
	}
	var pw problemWriter
	s.writeError(&pw, r, err)
	fmt.Fprintf(w, "event: error\ndata: %s\n\n", bytes.TrimSpace(pw.body.Bytes())) //nolint:errcheck // the stream ends here anyway
	http.NewResponseController(w).Flush()                                          //nolint:errcheck // as above
	return false
}

// streamWriteTimeout bounds each write of a job's event stream (jobEvents): twice the
// keep-alive's period, so that a reading client never meets it.
const streamWriteTimeout = 30 * time.Second

// Jobs' list: GET /jobs.
const (
	defaultJobsLimit = 20
	maxJobsLimit     = 100
)

// listJobs answers GET /jobs: the calling key's account's jobs in its env (or env=test
// for a live key), newest first, a page at a time, optionally in one state.
func (s *Server) listJobs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	key := principal(r.Context())
	var p domain.Problems
	state := ""
	pg := page{limit: defaultJobsLimit}
	le := listEnvOf(key)
	eachParam(q, func(name, v string) {
		switch {
		case name == "state":
			if _, ok := domain.ParseJobState(v); !ok {
				p.Add("state", "must be queued, running, succeeded, failed or cancelled")
			}
			state = v
		case pg.read(&p, name, v, maxJobsLimit, "job_"):
		default:
			le.read(&p, name, v)
		}
	})
	if err := p.Err(); err != nil {
		s.writeError(w, r, err)
		return
	}
	env, err := le.show("jobs")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	jobs, next, err := projections.ListJobs(r.Context(), s.pool, key.AccountID(), env.String(), state, pg.after, pg.limit)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	type listed struct {
		ID string `json:"id"` // as the record's (jobRecordJSON)
		projections.JobSummary
		Error *jobProblem       `json:"error"` // over the summary's {code, message}
		Links map[string]string `json:"links"`
	}
	out := make([]listed, len(jobs))
	for i, j := range jobs {
		base := s.baseURL + "/jobs/" + j.ID
		out[i] = listed{ID: j.ID, JobSummary: j, Error: s.jobProblemOf(j.Error),
			Links: map[string]string{"self": base, "result": base + "/result", "events": base + "/events"}}
	}
	nextCursor := s.nextPage(w, "/jobs", q, next)
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, map[string]any{"env": env.String(), "jobs": out, "next_cursor": nextCursor})
}

func (s *Server) getJob(w http.ResponseWriter, r *http.Request) {
	j, err := s.ownJob(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, jobAnswer(s, j))
}

func (s *Server) jobResult(w http.ResponseWriter, r *http.Request) {
	j, err := s.ownJob(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]projections.PositionResult, len(j.Positions()))
	for i := range out {
		out[i] = projections.PositionOf(j, i)
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": j.ID(), "job_id": j.ID(), "kind": j.Kind(), "state": j.State().String(), "complete": j.State() == domain.StateSucceeded,
		"positions_done": j.Done(), "positions_total": len(out), "positions": out,
	})
}

func (s *Server) cancelJob(w http.ResponseWriter, r *http.Request) {
	j, err := s.commands.CancelJob(r.Context(), s.actor(r), pathVar(r, "id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, jobAnswer(s, j))
}

// lastEventID reads the Last-Event-ID a reconnecting client sends; 0 without one. An id
// past what a stream can hold reads as its largest (past the end: nothing left, 204):
// the stream's sequence is a 32-bit column, which a larger one made a 500.
func lastEventID(r *http.Request) (int, error) {
	v := r.Header.Get("Last-Event-ID")
	if v == "" {
		return 0, nil
	}
	last, err := strconv.ParseUint(v, 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange) || err == nil && last > math.MaxInt32:
		return math.MaxInt32, nil
	case err != nil:
		return 0, domain.Invalid("Last-Event-ID", "must be an event id from this stream")
	}
	return int(last), nil
}

// jobEvents streams the job event stream as Server-Sent Events: every event has an id,
// so a client reconnecting with Last-Event-ID resumes exactly after what it saw; the
// stream ends after `end`. A reconnect with nothing left to send (its Last-Event-ID is
// at or past `end`) answers 204, which tells an EventSource to stop reconnecting.
func (s *Server) jobEvents(w http.ResponseWriter, r *http.Request) {
	j, err := s.ownJob(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	last, err := lastEventID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	key := principal(r.Context())
	holder := key.AccountID() + ":" + key.Env().String() // as the rate limit: test streams never crowd out live ones
	if !s.slots.take(holder) {
		s.writeError(w, r, &streamsFull{limit: s.slots.limit})
		return
	}
	defer s.slots.give(holder)
	// The jobs projection announces each addition to the stream at its commit: the
	// stream waits for that and makes no query while nothing happens. It polls only
	// while notifications are not being received (the listener reconnects), or when
	// the server has no listener at all. It subscribes before its first read, so
	// nothing added after that read goes unannounced.
	var wake <-chan struct{}
	listening := func() bool { return false }
	if s.wakeups != nil {
		var cancel func()
		wake, cancel = s.wakeups.Subscribe(projections.JobStreamTopic(j.ID()))
		defer cancel()
		listening = s.wakeups.Listening
	}
	if s.streams.Err() != nil {
		s.writeError(w, r, domain.Errorf(domain.CodeUnavailable, "this server is stopping; reconnect (with Last-Event-ID) to get the rest"))
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(s.streams, cancel)() // the server is stopping (EndStreams)
	pending, ended, err := projections.JobStreamAfter(ctx, s.pool, j.ID(), last)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if ended && len(pending) == 0 {
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	// A stream outlives the server's write timeout; each write gets streamWriteTimeout
	// instead, so that a client that stops reading (with its connection open) is cut
	// off rather than holding this goroutine and its subscription for ever.
	rc := http.NewResponseController(w)
	writing := func() { rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout)) } //nolint:errcheck // best effort
	writing()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, "retry: 1000\n\n")
	keepAlive := time.NewTicker(15 * time.Second)
	defer keepAlive.Stop()
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	for {
		writing()
		if !s.streamStillAllowed(w, r) {
			return
		}
		for _, e := range pending {
			if _, err := fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", e.Seq, e.Kind, s.streamedJobData(e)); err != nil {
				return // the client went away
			}
			last = e.Seq
		}
		rc.Flush() //nolint:errcheck // a failed flush shows as a failed write next time
		if ended {
			return
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				return
			case <-keepAlive.C:
				writing()
				if !s.streamStillAllowed(w, r) {
					return
				}
				if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
					return
				}
				rc.Flush() //nolint:errcheck // as above
			case <-wake:
				break wait
			case <-poll.C:
				if !listening() { // a notification may be lost: look
					break wait
				}
			}
		}
		if pending, ended, err = projections.JobStreamAfter(ctx, s.pool, j.ID(), last); err != nil {
			return // the database failed mid-stream: the client reconnects with Last-Event-ID
		}
	}
}
