package ucibridge

import (
	"fmt"
	"strings"

	"chessd/client"
)

// infoLine is one UCI `info` line for a line (PV) of a completed depth. The service
// scores from White's point of view; UCI wants the side to move's, so with Black to
// move the score is negated, a bound turns over and WDL's win and loss swap.
func infoLine(pv client.PV, d depthStats, blackToMove, showWDL bool) string {
	var b strings.Builder
	depth, seldepth := pv.Depth, pv.Seldepth
	if depth == 0 {
		depth, seldepth = d.depth, d.seldepth
	}
	fmt.Fprintf(&b, "info depth %d seldepth %d multipv %d score %s", depth, seldepth, pv.Rank, uciScore(pv.Eval, blackToMove))
	if showWDL && pv.Wdl != nil {
		w, l := pv.Wdl.W, pv.Wdl.L
		if blackToMove {
			w, l = l, w
		}
		fmt.Fprintf(&b, " wdl %d %d %d", w, pv.Wdl.D, l)
	}
	fmt.Fprintf(&b, " nodes %d nps %d time %d", d.nodes, d.nps, d.timeMS)
	if pv.Moves != nil && len(*pv.Moves) > 0 {
		b.WriteString(" pv " + strings.Join(*pv.Moves, " "))
	}
	return b.String()
}

// depthStats are the numbers of a depth shared by its lines.
type depthStats struct {
	depth, seldepth    int
	nodes, nps, timeMS int
}

// uciScore is "cp N" or "mate N" (moves, negative when the side to move is mated),
// with "lowerbound"/"upperbound" from the side to move's view.
func uciScore(s client.Score, blackToMove bool) string {
	v := s.Value
	bound := ""
	if s.Bound != nil {
		bound = string(*s.Bound)
	}
	if blackToMove {
		v = -v
		switch bound {
		case "lower":
			bound = "upper"
		case "upper":
			bound = "lower"
		}
	}
	unit := "cp"
	if s.Type == client.ScoreTypeMate {
		unit = "mate"
	}
	out := fmt.Sprintf("%s %d", unit, v)
	if bound != "" {
		out += " " + bound + "bound"
	}
	return out
}

// bestMoveLine is the `bestmove` answer; "(none)" when there is no move to play.
func bestMoveLine(best, ponder string) string {
	if best == "" {
		return "bestmove (none)"
	}
	if ponder != "" {
		return "bestmove " + best + " ponder " + ponder
	}
	return "bestmove " + best
}

// option is one UCI option the bridge offers.
type option struct {
	name string // the UCI name, as the GUI sends it back
	typ  string // spin, check, combo, string
	def  string
	min  int
	max  int
	vars []string
	// service is the EvalRequest option it sets ("" for the bridge's own)
	service string
}

func (o option) line() string {
	def := o.def
	if def == "" {
		def = "<empty>"
	}
	s := fmt.Sprintf("option name %s type %s default %s", o.name, o.typ, def)
	switch o.typ {
	case "spin":
		s += fmt.Sprintf(" min %d max %d", o.min, o.max)
	case "combo":
		for _, v := range o.vars {
			s += " var " + v
		}
	}
	return s
}

// optionsOf lists the options the service offers (GET /engines): MultiPV within the
// limits, the engine version and path, every engine option under its UCI name (Hash,
// UCI_ShowWDL, UCI_Elo, …), and the bridge's own Server and Key.
func optionsOf(e *client.Engines, server string) []option {
	opts := []option{{name: "MultiPV", typ: "spin", def: "1", min: 1, max: 10}}
	if e == nil {
		return append(opts, ownOptions(server)...)
	}
	if r := e.Limits.Multipv; r.Max > 0 {
		opts[0].min, opts[0].max = r.Min, r.Max
		if r.Default != nil {
			opts[0].def = fmt.Sprint(*r.Default)
		}
	}
	versions := make([]string, 0, len(e.Versions)+1)
	for _, v := range e.Versions {
		versions = append(versions, v.Id)
	}
	opts = append(opts,
		option{name: "Engine", typ: "combo", def: e.Default, vars: append(versions, "latest")},
		option{name: "Path", typ: "combo", def: "auto", vars: []string{"auto", "native", "wasm"}})
	if e.Options != nil {
		for _, eo := range *e.Options {
			o := option{name: eo.UciOption, service: string(eo.Name), def: fmt.Sprint(eo.Default)}
			if eo.Type == client.EngineOptionTypeBoolean {
				o.typ = "check"
			} else {
				o.typ = "spin"
				if eo.Min != nil {
					o.min = *eo.Min
				}
				if eo.Max != nil {
					o.max = *eo.Max
				}
			}
			opts = append(opts, o)
		}
	}
	return append(opts, ownOptions(server)...)
}

func ownOptions(server string) []option {
	return []option{{name: "Server", typ: "string", def: server}, {name: "Key", typ: "string"}}
}
