package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

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

// watch follows a job's events (GET /jobs/{id}/events) with a progress line until it
// ends, then prints its result: a table of positions, or the result's JSON.
func watch(ctx context.Context, e *env, id string, asJSON bool) error {
	res, err := e.api.StreamJobEvents(ctx, id, nil)
	if err != nil {
		return err
	}
	prog := newProgress(e)
	var last client.Job
	err = client.ReadStream(res, func(ev client.StreamEvent) error {
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
	if last.Error != nil {
		fmt.Fprintf(w, "error: %s: %s\n", last.Error.Code, last.Error.Message)
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
