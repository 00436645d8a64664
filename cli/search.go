package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"strings"

	"chessd/client"
)

// searchCommand is `chessd eval` and `chessd bestmove`: the search streamed (a
// progress line per completed depth), then the board, the score and the best line.
func searchCommand(fs *flag.FlagSet, endpoint string) func(context.Context, *env) error {
	depth := fs.Int("depth", 0, "search depth (default: the server's, 14)")
	multipv := fs.Int("multipv", 0, "lines to find (default 1)")
	movetime := fs.Int("movetime", 0, "stop after this many milliseconds")
	engine := fs.String("engine", "", "engine version, e.g. sf-17.1 (default: the newest)")
	wdl := fs.Bool("wdl", false, "win/draw/loss estimates")
	asJSON := fs.Bool("json", false, "print the API's answer as JSON")
	return func(ctx context.Context, e *env) error {
		fen := strings.Join(e.args, " ")
		if fen == "" {
			return fmt.Errorf("usage: chessd %s [flags] FEN", endpoint)
		}
		req := client.EvalRequest{Fen: fen, Depth: positive(*depth), Multipv: positive(*multipv), MovetimeMs: positive(*movetime)}
		if *engine != "" {
			req.Engine = engine
		}
		if *wdl {
			req.Options = &struct {
				Chess960       *bool `json:"chess960,omitempty"`
				Elo            *int  `json:"elo,omitempty"`
				HashMb         *int  `json:"hash_mb,omitempty"`
				LimitStrength  *bool `json:"limit_strength,omitempty"`
				MoveOverheadMs *int  `json:"move_overhead_ms,omitempty"`
				ShowWdl        *bool `json:"show_wdl,omitempty"`
				SkillLevel     *int  `json:"skill_level,omitempty"`
			}{ShowWdl: wdl}
		}
		var res *http.Response
		var err error
		if endpoint == "bestmove" {
			res, err = e.api.BestMove(ctx, nil, req, client.Accept(client.MediaNDJSON))
		} else {
			res, err = e.api.Eval(ctx, nil, req, client.Accept(client.MediaNDJSON))
		}
		if err != nil {
			return err
		}
		prog := newProgress(e)
		defer prog.done()
		var result json.RawMessage
		err = client.ReadStream(res, func(ev client.StreamEvent) error {
			switch ev.Event {
			case "depth":
				var d client.DepthProgress
				if json.Unmarshal(ev.Data, &d) == nil && len(d.Pvs) > 0 {
					prog.update("depth %d  %s  %s  %s nodes  %s nps", d.Depth, score(d.Eval),
						line(fen, first3(deref(d.Pvs[0].MovesSan))), count(d.Nodes), count(d.Nps))
				}
			case "result":
				result = ev.Data
			case "error":
				return eventProblem(ev.Data)
			}
			return nil
		})
		prog.done()
		if errors.Is(err, context.Canceled) || ctx.Err() != nil {
			return errors.New("stopped before the answer: the search was abandoned and is not charged")
		}
		if err != nil {
			return err
		}
		if result == nil {
			return errors.New("the stream ended without an answer (not charged)")
		}
		if *asJSON {
			return e.printJSON(result)
		}
		if endpoint == "bestmove" {
			return printBestMove(e, fen, result)
		}
		return printEval(e, fen, result)
	}
}

func printEval(e *env, fen string, raw json.RawMessage) error {
	var r client.Evaluation
	if err := json.Unmarshal(raw, &r); err != nil {
		return fmt.Errorf("reading the answer: %w", err)
	}
	w := e.io.Out
	fmt.Fprint(w, board(r.Fen))
	fmt.Fprintf(w, "FEN   %s\n", r.Fen)
	fmt.Fprintf(w, "Eval  %s (White's view), depth %d, %s %s\n", score(r.Eval), r.Depth, r.Engine, r.Path)
	for _, pv := range deref(r.Pvs) {
		wdl := ""
		if pv.Wdl != nil {
			wdl = fmt.Sprintf("  [W %d D %d L %d]", pv.Wdl.W, pv.Wdl.D, pv.Wdl.L)
		}
		fmt.Fprintf(w, "%2d. %-7s %s%s\n", pv.Rank, score(pv.Eval), line(r.Fen, deref(pv.MovesSan)), wdl)
	}
	if r.BestmoveSan != nil {
		fmt.Fprintf(w, "Best  %s (%s)\n", *r.BestmoveSan, deref(r.Bestmove))
	} else {
		fmt.Fprintln(w, "Best  none: the game is over")
	}
	return charged(e, r.CostUnits, string(r.CostUsd), r.Cached)
}

func printBestMove(e *env, fen string, raw json.RawMessage) error {
	var r client.BestMove
	if err := json.Unmarshal(raw, &r); err != nil {
		return fmt.Errorf("reading the answer: %w", err)
	}
	w := e.io.Out
	fmt.Fprint(w, board(fen))
	if r.BestmoveSan == nil {
		fmt.Fprintln(w, "Best  none: the game is over")
	} else {
		fmt.Fprintf(w, "Best  %s (%s)", *r.BestmoveSan, deref(r.Bestmove))
		if r.Ponder != nil {
			fmt.Fprintf(w, ", expecting %s", *r.Ponder)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "Eval  %s (White's view), depth %d, %s\n", score(r.Eval), r.Depth, r.Engine)
	return charged(e, r.CostUnits, string(r.CostUsd), r.Cached)
}

func charged(e *env, units int, usd string, cached bool) error {
	from := ""
	if cached {
		from = ", from the cache"
	}
	_, err := fmt.Fprintf(e.io.Out, "Cost  %d units (%s USD)%s\n", units, usd, from)
	return err
}

func positive(n int) *int {
	if n <= 0 {
		return nil
	}
	return &n
}

func first3(s []string) []string { return s[:min(len(s), 3)] }

// count is 1234567 as "1.2M".
func count(n int) string {
	switch {
	case n >= 1_000_000:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1_000:
		return fmt.Sprintf("%.1fk", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}
