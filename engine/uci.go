package engine

import (
	"encoding/json"
	"strconv"
	"strings"
)

// This file holds the pure UCI text parsers: no I/O, no state, safe for any input
// (FuzzParseInfo, FuzzParseOption and FuzzParseBestMove prove they never panic).

// Bound tells whether a score is exact or only a bound from an aspiration-window
// fail (UCI "lowerbound"/"upperbound").
type Bound uint8

const (
	BoundExact Bound = iota // the score is the search's value
	BoundLower              // "lowerbound": the true score is at least Value (fail high)
	BoundUpper              // "upperbound": the true score is at most Value (fail low)
)

func (b Bound) String() string {
	switch b {
	case BoundLower:
		return "lowerbound"
	case BoundUpper:
		return "upperbound"
	default:
		return "exact"
	}
}

// Score is a UCI score, raw: from the point of view of the side to move, as the engine
// reports it. Mate scores count moves (not plies); negative means the side to move is
// mated. "mate 0" is reported for a position that is already checkmate.
type Score struct {
	Mate  bool  // Value is moves to mate, not centipawns
	Value int   // centipawns, or moves to mate
	Bound Bound // exact unless the line was a lowerbound/upperbound fail
}

// WDL is the engine's win/draw/loss estimate in per mille, side to move's point of view.
type WDL struct {
	W, D, L int
}

// Info is one parsed "info" line. Fields absent from the line are zero; the Has*
// flags tell a real zero from an absent field where that matters.
type Info struct {
	Depth          int
	SelDepth       int
	MultiPV        int // 0 when absent (engines omit it when MultiPV is 1)
	HasScore       bool
	Score          Score
	WDL            *WDL
	Nodes          int64
	NPS            int64
	TimeMS         int64
	HashFull       int
	TBHits         int64
	CurrMove       string
	CurrMoveNumber int
	PV             []string
	String         string // the rest of the line after "string", verbatim
	HasDepth       bool
}

// ParseInfo parses a UCI "info" line. ok is false when the line is not an info line.
// Unknown tokens and malformed numbers are skipped rather than rejected: engines add
// fields over time and one odd token must not lose the score on the same line.
func ParseInfo(line string) (info Info, ok bool) {
	f := strings.Fields(line)
	if len(f) == 0 || f[0] != "info" {
		return Info{}, false
	}
	for i := 1; i < len(f); i++ {
		switch f[i] {
		case "depth":
			if v, n := intAt(f, i+1); n {
				info.Depth, info.HasDepth = v, true
				i++
			}
		case "seldepth":
			if v, n := intAt(f, i+1); n {
				info.SelDepth = v
				i++
			}
		case "multipv":
			if v, n := intAt(f, i+1); n {
				info.MultiPV = v
				i++
			}
		case "score":
			i = parseScore(f, i+1, &info) - 1
		case "lowerbound":
			// Some engines put the bound after other tokens; accept it anywhere.
			info.Score.Bound = BoundLower
		case "upperbound":
			info.Score.Bound = BoundUpper
		case "wdl":
			w, ok1 := intAt(f, i+1)
			d, ok2 := intAt(f, i+2)
			l, ok3 := intAt(f, i+3)
			if ok1 && ok2 && ok3 {
				info.WDL = &WDL{W: w, D: d, L: l}
				i += 3
			}
		case "nodes":
			if v, n := int64At(f, i+1); n {
				info.Nodes = v
				i++
			}
		case "nps":
			if v, n := int64At(f, i+1); n {
				info.NPS = v
				i++
			}
		case "time":
			if v, n := int64At(f, i+1); n {
				info.TimeMS = v
				i++
			}
		case "hashfull":
			if v, n := intAt(f, i+1); n {
				info.HashFull = v
				i++
			}
		case "tbhits":
			if v, n := int64At(f, i+1); n {
				info.TBHits = v
				i++
			}
		case "currmove":
			if i+1 < len(f) && isMove(f[i+1]) {
				info.CurrMove = f[i+1]
				i++
			}
		case "currmovenumber":
			if v, n := intAt(f, i+1); n {
				info.CurrMoveNumber = v
				i++
			}
		case "pv":
			// The PV runs to the first token that is not a move, so a field an engine
			// might print after the PV is still parsed rather than taken for a move.
			j := i + 1
			for j < len(f) && isMove(f[j]) {
				j++
			}
			if j > i+1 {
				info.PV = append([]string(nil), f[i+1:j]...)
			}
			i = j - 1
		case "string":
			// "string" swallows the rest of the line, whitespace kept as sent.
			info.String = restAfter(line, "string")
			return info, true
		}
	}
	return info, true
}

// parseScore reads "cp N" or "mate N" and an optional bound starting at f[i]; it
// returns the index of the first token it did not consume.
func parseScore(f []string, i int, info *Info) int {
	if i+1 >= len(f) {
		return i
	}
	var mate bool
	switch f[i] {
	case "cp":
	case "mate":
		mate = true
	default:
		return i
	}
	v, ok := intAt(f, i+1)
	if !ok {
		return i + 1
	}
	info.HasScore = true
	info.Score.Mate = mate
	info.Score.Value = v
	i += 2
	if i < len(f) {
		switch f[i] {
		case "lowerbound":
			info.Score.Bound = BoundLower
			i++
		case "upperbound":
			info.Score.Bound = BoundUpper
			i++
		}
	}
	return i
}

// ParseBestMove parses "bestmove X [ponder Y]". "bestmove (none)", which the engine
// sends when the side to move has no legal move, gives best == "" and ok == true.
func ParseBestMove(line string) (best, ponder string, ok bool) {
	f := strings.Fields(line)
	if len(f) < 2 || f[0] != "bestmove" {
		return "", "", false
	}
	if f[1] != "(none)" {
		best = f[1]
	}
	if len(f) >= 4 && f[2] == "ponder" && f[3] != "(none)" {
		ponder = f[3]
	}
	return best, ponder, true
}

// OptionType is a UCI option type: check, spin, combo, button or string.
type OptionType string

const (
	OptionCheck  OptionType = "check"
	OptionSpin   OptionType = "spin"
	OptionCombo  OptionType = "combo"
	OptionButton OptionType = "button"
	OptionString OptionType = "string"
)

// Option is one "option name ..." line of the engine's uci answer, as the engine sent
// it. Default is the text after "default" ("" when the engine printed nothing or the
// placeholder "<empty>"). Min and Max are meaningful for spin options only (HasRange).
type Option struct {
	Name     string
	Type     OptionType
	Default  string
	Min      int64
	Max      int64
	HasRange bool
	Vars     []string
}

// MarshalJSON writes {name, type, default, min, max, vars} with min and max only for
// spin options (a min of 0 is a real bound, so omitempty would not do) and default
// omitted for buttons, which have none.
func (o Option) MarshalJSON() ([]byte, error) {
	type out struct {
		Name    string     `json:"name"`
		Type    OptionType `json:"type"`
		Default *string    `json:"default,omitempty"`
		Min     *int64     `json:"min,omitempty"`
		Max     *int64     `json:"max,omitempty"`
		Vars    []string   `json:"vars,omitempty"`
	}
	j := out{Name: o.Name, Type: o.Type, Vars: o.Vars}
	if o.Type != OptionButton {
		j.Default = &o.Default
	}
	if o.HasRange {
		j.Min, j.Max = &o.Min, &o.Max
	}
	return json.Marshal(j)
}

// ParseOption parses "option name <name> type <t> [default <d>] [min <n>] [max <n>]
// [var <v>]...". Names and values may contain spaces; the keywords split them.
func ParseOption(line string) (opt Option, ok bool) {
	f := strings.Fields(line)
	if len(f) < 3 || f[0] != "option" || f[1] != "name" {
		return Option{}, false
	}
	key := "name"
	var val []string
	var haveMin, haveMax bool
	flush := func() {
		v := strings.Join(val, " ")
		switch key {
		case "name":
			opt.Name = v
		case "type":
			opt.Type = OptionType(v)
		case "default":
			if v == "<empty>" {
				v = ""
			}
			opt.Default = v
		case "min":
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				opt.Min, haveMin = n, true
			}
		case "max":
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				opt.Max, haveMax = n, true
			}
		case "var":
			opt.Vars = append(opt.Vars, v)
		}
		val = val[:0]
	}
	for _, tok := range f[2:] {
		switch tok {
		case "type", "default", "min", "max", "var":
			// "type" inside a name would be ambiguous in UCI itself; engines avoid it.
			// A keyword right after "name" with nothing between is taken as a keyword.
			flush()
			key = tok
		default:
			val = append(val, tok)
		}
	}
	flush()
	if opt.Name == "" || opt.Type == "" {
		return Option{}, false
	}
	opt.HasRange = haveMin && haveMax
	return opt, true
}

// isMove reports whether s looks like a UCI move: from-square, to-square and an
// optional promotion piece (e2e4, e7e8q), or the null move 0000.
func isMove(s string) bool {
	if s == "0000" {
		return true
	}
	if len(s) != 4 && len(s) != 5 {
		return false
	}
	sq := func(f, r byte) bool { return f >= 'a' && f <= 'h' && r >= '1' && r <= '8' }
	if !sq(s[0], s[1]) || !sq(s[2], s[3]) {
		return false
	}
	if len(s) == 5 {
		switch s[4] {
		case 'q', 'r', 'b', 'n':
		default:
			return false
		}
	}
	return true
}

func intAt(f []string, i int) (int, bool) {
	if i >= len(f) {
		return 0, false
	}
	v, err := strconv.Atoi(f[i])
	return v, err == nil
}

func int64At(f []string, i int) (int64, bool) {
	if i >= len(f) {
		return 0, false
	}
	v, err := strconv.ParseInt(f[i], 10, 64)
	return v, err == nil
}

// restAfter returns the text after the first whole-word occurrence of word, trimmed of
// the single separator; "" when word ends the line.
func restAfter(line, word string) string {
	for off := 0; ; {
		j := strings.Index(line[off:], word)
		if j < 0 {
			return ""
		}
		j += off
		end := j + len(word)
		before := j == 0 || isSpace(line[j-1])
		after := end == len(line) || isSpace(line[end])
		if before && after {
			return strings.TrimSpace(line[end:])
		}
		off = end
	}
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'
}
