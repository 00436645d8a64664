package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"chessd/client"
)

// analyzeCommand is `chessd analyze`: POST /analyze (a game, or one position), then
// the job followed to its end like `jobs watch`.
func analyzeCommand(fs *flag.FlagSet) func(context.Context, *env) error {
	pgnFile := fs.String("pgn", "", "the game's PGN file (- for stdin)")
	fen := fs.String("fen", "", "one position instead of a game")
	depth := fs.Int("depth", 0, "search depth per position (default: the server's, 14)")
	multipv := fs.Int("multipv", 0, "lines per position (default 1)")
	asJSON := fs.Bool("json", false, "print the job's result as JSON")
	return func(ctx context.Context, e *env) error {
		body := client.SubmitAnalysisJSONRequestBody{Depth: positive(*depth), Multipv: positive(*multipv)}
		switch {
		case *pgnFile != "" && *fen != "":
			return errors.New("analyze: --pgn or --fen, not both")
		case *pgnFile != "":
			pgn, err := readInput(*pgnFile, e.io.In)
			if err != nil {
				return err
			}
			body.Pgn = &pgn
		case *fen != "":
			body.Fen = fen
		default:
			return errors.New("usage: chessd analyze --pgn FILE | --fen FEN [--depth N] [--multipv N] [--json]")
		}
		res, err := e.api.SubmitAnalysisWithResponse(ctx, nil, body)
		if err != nil && ctx.Err() != nil { // the server may have taken it before the cut
			return errors.New("stopped while submitting the job: it may have been accepted, and then runs and is charged " +
				"(GET /v1/jobs lists the account's jobs; `chessd jobs watch JOB_ID` follows one)")
		}
		if err != nil {
			return err
		}
		if err := client.Check(res.HTTPResponse, res.Body); err != nil {
			return err
		}
		if !*asJSON {
			fmt.Fprintf(e.io.Err, "job %s: %d positions\n", res.JSON202.JobId, res.JSON202.PositionsTotal)
		}
		return watch(ctx, e, res.JSON202.JobId, *asJSON)
	}
}

func readInput(path string, stdin io.Reader) (string, error) {
	var b []byte
	var err error
	if path == "-" {
		b, err = io.ReadAll(stdin)
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return "", fmt.Errorf("reading the PGN: %w", err)
	}
	return string(b), nil
}

// watchCommand is `chessd jobs watch JOB_ID`.
func watchCommand(fs *flag.FlagSet) func(context.Context, *env) error {
	asJSON := fs.Bool("json", false, "print the job's result as JSON")
	return func(ctx context.Context, e *env) error {
		if len(e.args) != 1 {
			return errors.New("usage: chessd jobs watch [--json] JOB_ID")
		}
		return watch(ctx, e, e.args[0], *asJSON)
	}
}

// Following a job's events across cuts: the wait before reconnecting, doubled after
// each attempt that brought no event up to reconnectMost, and how many such attempts in
// a row make the watch give up (long enough to outlast a server's restart).
const (
	reconnectFirst = 500 * time.Millisecond
	reconnectMost  = 5 * time.Second
	maxReconnects  = 10
)

// streamIdle is how long a job's stream may bring nothing, not even the server's
// keep-alive (every 15 s), before it counts as cut: a connection a proxy holds open
// without passing anything on would otherwise hang the watch for good. A variable for
// the tests.
var streamIdle = 45 * time.Second

// idleBody is a stream's body that calls off its request (cancel) once it has brought
// nothing for streamIdle.
type idleBody struct {
	io.ReadCloser
	timer *time.Timer
}

func (b *idleBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.timer.Reset(streamIdle)
	}
	return n, err
}

// watch follows a job's events (GET /jobs/{id}/events) with a progress line until it
// ends, then prints its result: a table of positions, or the result's JSON. Stopped
// (Ctrl-C), it says that the job is not: it runs on the server, charged, whoever watches.
func watch(ctx context.Context, e *env, id string, asJSON bool) error {
	err := watchJob(ctx, e, id, asJSON)
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("stopped watching job %s, which goes on running on the server and is charged for the "+
			"positions it analyses: `chessd jobs watch %s` follows it again (DELETE /v1/jobs/%s cancels it)", id, id, id)
	}
	return err
}

func watchJob(ctx context.Context, e *env, id string, asJSON bool) error {
	prog := newProgress(e)
	var last client.Job
	err := followJob(ctx, e, id, prog, func(ev client.StreamEvent) error {
		switch ev.Event {
		case "state", "end":
			if err := json.Unmarshal(ev.Data, &last); err != nil {
				return fmt.Errorf("job event: %w", err)
			}
			prog.update("%s %s  %d/%d positions  %d units", last.JobId, last.State, last.PositionsDone, last.PositionsTotal, last.CostUnits)
		case "progress":
			var p struct{ Done, Total int }
			if json.Unmarshal(ev.Data, &p) == nil {
				prog.update("%s running  %d/%d positions", id, p.Done, p.Total)
			}
		}
		return nil
	})
	prog.done()
	if err != nil {
		return err
	}
	if !finished(last.State) { // a 204 ended the watch before its end event was read
		j, err := e.api.GetJobWithResponse(ctx, id, nil)
		if err != nil {
			return fmt.Errorf("job %s: %w", id, err)
		}
		if err := client.Check(j.HTTPResponse, j.Body); err != nil {
			return fmt.Errorf("job %s: %w", id, err)
		}
		last = *j.JSON200
	}
	out, err := e.api.GetJobResultWithResponse(ctx, id, nil)
	if err != nil {
		return err
	}
	if err := client.Check(out.HTTPResponse, out.Body); err != nil {
		return err
	}
	if asJSON {
		return e.printJSON(out.Body)
	}
	r := out.JSON200
	w := e.io.Out
	fmt.Fprintf(w, "%s: %s, %d/%d positions, %d units\n", r.JobId, r.State, r.PositionsDone, r.PositionsTotal, last.CostUnits)
	if p := last.Error; p != nil {
		fmt.Fprintln(w, jobErrorLine(p))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PLY\tPLAYED\tEVAL\tBEST\tDEPTH\tLINE")
	for _, p := range r.Positions {
		ply := fmt.Sprint(p.Index)
		if p.Ply != nil {
			ply = fmt.Sprint(*p.Ply)
		}
		if p.Status != client.JobPositionStatusDone {
			fmt.Fprintf(tw, "%s\t%s\t%s\t\t\t\n", ply, deref(p.MoveSan), p.Status)
			continue
		}
		ev, pvLine := "", ""
		if p.Eval != nil {
			ev = score(*p.Eval)
		}
		if p.Pvs != nil && len(*p.Pvs) > 0 {
			pvLine = line(p.Fen, first3(deref((*p.Pvs)[0].MovesSan)))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", ply, deref(p.MoveSan), ev, deref(p.BestmoveSan), deref(p.Depth), pvLine)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if s := string(r.State); s == "failed" || s == "cancelled" {
		return fmt.Errorf("job %s", strings.ToLower(s))
	}
	return nil
}

func finished(s client.JobState) bool {
	return s == client.JobStateSucceeded || s == client.JobStateFailed || s == client.JobStateCancelled
}

// errEnded stops reading a stream at its end event.
var errEnded = errors.New("the job ended")

// followJob passes fn the job's events until its end event. A stream that closes
// before that was cut (a stopping server ends its streams, a connection drops): it is
// opened again with Last-Event-ID, which resumes right after the last event seen, after
// a short backoff, or after Retry-After when the server answers 429 or 503. A 204 means
// the job has ended with nothing left to send. It gives up after maxReconnects attempts
// in a row without an event; a first attempt that reaches no server, and a 4xx other
// than 429, fail at once.
func followJob(ctx context.Context, e *env, id string, prog *progress, fn func(client.StreamEvent) error) error {
	var lastID string
	failures := 0 // attempts in a row that brought no event
	for attempt := 0; ; attempt++ {
		r := followOnce(ctx, e, id, &lastID, fn)
		switch {
		case r.done:
			return r.err
		case ctx.Err() != nil:
			return ctx.Err()
		case r.unreachable && attempt == 0:
			return fmt.Errorf("job %s: events: %w", id, r.why)
		}
		wait := min(reconnectFirst<<failures, reconnectMost)
		if r.told {
			wait = max(r.retryAfter, reconnectFirst) // Retry-After: 0 is no reason to ask back to back
		}
		if r.got {
			failures, wait = 0, reconnectFirst
		} else if failures++; failures >= maxReconnects {
			return fmt.Errorf("job %s: no events in %d attempts in a row, giving up: %w", id, maxReconnects, r.why)
		}
		prog.update("%s events: %v; reconnecting in %s", id, r.why, wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// followed is how one connection to a job's stream went.
type followed struct {
	done        bool          // the follow is over: return err (nil at the job's end)
	err         error         // with done
	why         error         // else: why the stream stopped before the job's end
	unreachable bool          // the request reached no server
	retryAfter  time.Duration // the server's Retry-After (429, 5xx), when told
	told        bool
	got         bool // the connection brought an event
}

// followOnce opens the job's stream once, after *lastID, and passes fn its events,
// moving *lastID along, until the stream ends or brought nothing for streamIdle.
func followOnce(ctx context.Context, e *env, id string, lastID *string, fn func(client.StreamEvent) error) (r followed) {
	var params client.StreamJobEventsParams
	if *lastID != "" {
		params.LastEventID = lastID
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	idle := time.AfterFunc(streamIdle, cancel)
	defer func() {
		if !idle.Stop() && ctx.Err() == nil && !r.done {
			r.why = fmt.Errorf("nothing came for %s (the server sends a keep-alive every 15 s)", streamIdle)
		}
	}()
	res, err := e.api.StreamJobEvents(actx, id, &params)
	switch {
	case err != nil:
		if res != nil {
			res.Body.Close()
		}
		return followed{why: err, unreachable: true}
	case res.StatusCode == http.StatusNoContent:
		res.Body.Close()
		return followed{done: true}
	case res.StatusCode == http.StatusTooManyRequests || res.StatusCode >= 500:
		d, told := client.RetryAfter(res.Header.Get("Retry-After"))
		return followed{why: answerError(res), retryAfter: d, told: told}
	case res.StatusCode != http.StatusOK:
		return followed{done: true, err: fmt.Errorf("job %s: events: %w", id, answerError(res))}
	}
	res.Body = &idleBody{ReadCloser: res.Body, timer: idle}
	var fnErr error
	err = client.ReadStream(res, func(ev client.StreamEvent) error {
		if ev.ID != "" {
			*lastID, r.got = ev.ID, true
		}
		if ev.Event == "error" { // the stream's key lost its rights to it: said, and the stream ends
			fnErr = fmt.Errorf("job %s: events: %w", id, eventProblem(ev.Data))
			return fnErr
		}
		if fnErr = fn(ev); fnErr != nil {
			return fnErr
		}
		if ev.Event == "end" {
			return errEnded
		}
		return nil
	})
	switch {
	case errors.Is(err, errEnded):
		return followed{done: true}
	case fnErr != nil:
		return followed{done: true, err: fnErr}
	case err == nil:
		err = errors.New("the stream closed before the job ended")
	}
	r.why = err
	return r
}

// eventProblem is a stream's `error` event as an error: the problem it carries.
func eventProblem(data []byte) error {
	var p client.Problem
	if err := json.Unmarshal(data, &p); err != nil {
		return fmt.Errorf("error event: %.200s", data)
	}
	return &p
}

// answerError is a non-stream answer's problem as an error; it closes res.Body.
func answerError(res *http.Response) error {
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%s: reading the answer: %w", res.Status, err)
	}
	if err := client.Check(res, body); err != nil {
		return err
	}
	return errors.New(res.Status)
}

// jobErrorLine shows a failed job's error: a problem, as the API's refusals are shown;
// from a server of a release before, which sent {code, message}, those two.
func jobErrorLine(p *client.JobProblem) string {
	if p.Status == 0 && p.Title == "" {
		return fmt.Sprintf("error: %s: %s", p.Code, p.Message)
	}
	return fmt.Sprintf("error: %d %s: %s (%s; next: %s)", p.Status, p.Title, p.Detail, p.Code, p.NextAction)
}
