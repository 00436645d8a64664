// Package ucibridge speaks UCI (the Universal Chess Interface) on one side and the
// chessd API on the other: `chessd uci` lets any chess GUI or tool that runs a UCI
// engine use the hosted Stockfish with a key (docs/API.md, "Clients").
//
// protocol.go is the pure part: parsing the GUI's commands and writing the engine's
// answers. bridge.go is the state machine and the transport (the generated client and
// the live evaluation stream).
package ucibridge

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Kind is a GUI-to-engine command.
type Kind int

const (
	CmdUCI Kind = iota + 1
	CmdDebug
	CmdIsReady
	CmdSetOption
	CmdRegister
	CmdNewGame
	CmdPosition
	CmdGo
	CmdStop
	CmdPonderHit
	CmdQuit
)

var kindWords = map[string]Kind{
	"uci": CmdUCI, "debug": CmdDebug, "isready": CmdIsReady, "setoption": CmdSetOption,
	"register": CmdRegister, "ucinewgame": CmdNewGame, "position": CmdPosition, "go": CmdGo,
	"stop": CmdStop, "ponderhit": CmdPonderHit, "quit": CmdQuit,
}

// Command is one parsed line from the GUI.
type Command struct {
	Kind Kind
	// setoption
	Name, Value string
	// position: FEN empty means startpos
	FEN   string
	Moves []string
	// go
	Go Go
	// debug
	On bool
}

// Go is the search a `go` command asks for. Zero means not given.
type Go struct {
	SearchMoves                         []string
	Ponder, Infinite                    bool
	WTime, BTime, WInc, BInc, MovesToGo int
	Depth, Nodes, Mate, MoveTime        int
	wtimeGiven, btimeGiven              bool // "wtime 0" is a real (lost) clock
}

// TimeControl reports whether the GUI gave the clocks (wtime/btime).
func (g Go) TimeControl() bool { return g.wtimeGiven || g.btimeGiven }

// errEmpty is a line with no command in it: UCI says to ignore it.
var errEmpty = errors.New("no command")

// Parse reads one line from the GUI. As UCI asks, unknown words before the command are
// skipped ("joho debug on" is `debug on`), and so are unknown tokens inside `go`. A
// blank or unknown line is an error the caller ignores. A `go` comes back with its
// Kind even with an error (the parameters it names are left out), and so does a
// `position` (whose error means there is no position to search).
func Parse(line string) (Command, error) {
	f := strings.Fields(line)
	for len(f) > 0 {
		if _, ok := kindWords[f[0]]; ok {
			break
		}
		f = f[1:]
	}
	if len(f) == 0 {
		return Command{}, errEmpty
	}
	c := Command{Kind: kindWords[f[0]]}
	args := f[1:]
	switch c.Kind {
	case CmdDebug:
		c.On = len(args) > 0 && args[0] == "on"
	case CmdSetOption:
		return parseSetOption(args)
	case CmdPosition:
		return parsePosition(args)
	case CmdGo:
		g, err := parseGo(args)
		c.Go = g
		return c, err
	}
	return c, nil
}

// parseSetOption reads `name N... [value V...]`: both may hold spaces.
func parseSetOption(args []string) (Command, error) {
	c := Command{Kind: CmdSetOption}
	if len(args) == 0 || args[0] != "name" {
		return c, errors.New(`setoption: expected "name"`)
	}
	args = args[1:]
	i := indexOf(args, "value")
	if i < 0 {
		c.Name = strings.Join(args, " ")
	} else {
		c.Name, c.Value = strings.Join(args[:i], " "), strings.Join(args[i+1:], " ")
	}
	if c.Name == "" {
		return c, errors.New("setoption: no option name")
	}
	return c, nil
}

// parsePosition reads `startpos | fen F1 ... F6 [moves M...]`.
func parsePosition(args []string) (Command, error) {
	c := Command{Kind: CmdPosition}
	if len(args) == 0 {
		return c, errors.New("position: expected startpos or fen")
	}
	rest := args[1:]
	switch args[0] {
	case "startpos":
	case "fen":
		i := indexOf(rest, "moves")
		if i < 0 {
			i = len(rest)
		}
		c.FEN = strings.Join(rest[:i], " ")
		if c.FEN == "" {
			return c, errors.New("position fen: no FEN")
		}
		rest = rest[i:]
	default:
		return c, fmt.Errorf("position: expected startpos or fen, not %q", clip(args[0]))
	}
	if len(rest) > 0 {
		if rest[0] != "moves" {
			return c, fmt.Errorf("position: expected moves, not %q", clip(rest[0]))
		}
		if len(rest) > 1 {
			c.Moves = rest[1:]
		}
	}
	return c, nil
}

// goNumbers are the `go` parameters that take a number.
var goNumbers = map[string]bool{"wtime": true, "btime": true, "winc": true, "binc": true, "movestogo": true,
	"depth": true, "nodes": true, "mate": true, "movetime": true}

// goClocks are read as 0 when negative: GUIs send a clock below zero once an engine
// overran its time, and time that is up still wants a move.
var goClocks = map[string]bool{"wtime": true, "btime": true, "winc": true, "binc": true}

// parseGo reads a `go` line. A parameter without a readable number is left out and
// told in the error, but the Go is still searched: a GUI waits for a bestmove.
func parseGo(args []string) (Go, error) {
	var g Go
	var errs []error
	for i := 0; i < len(args); i++ {
		w := args[i]
		switch {
		case w == "infinite":
			g.Infinite = true
		case w == "ponder":
			g.Ponder = true
		case w == "searchmoves":
			for i+1 < len(args) && !goKeyword(args[i+1]) {
				i++
				g.SearchMoves = append(g.SearchMoves, args[i])
			}
		case goNumbers[w]:
			if i+1 >= len(args) || goKeyword(args[i+1]) {
				errs = append(errs, fmt.Errorf("go %s: no value, ignored", w))
				continue
			}
			i++
			n, err := strconv.Atoi(args[i])
			if err == nil && n < 0 && goClocks[w] {
				n = 0
			}
			if err != nil || n < 0 {
				errs = append(errs, fmt.Errorf("go %s: %q is not a number of at least 0, ignored", w, clip(args[i])))
				continue
			}
			g.set(w, n)
		}
		// anything else: an unknown token, skipped
	}
	return g, errors.Join(errs...)
}

// goKeyword is a word that starts a `go` parameter (so it is no parameter's value).
func goKeyword(w string) bool {
	return goNumbers[w] || w == "infinite" || w == "ponder" || w == "searchmoves"
}

func (g *Go) set(word string, n int) {
	switch word {
	case "wtime":
		g.WTime, g.wtimeGiven = n, true
	case "btime":
		g.BTime, g.btimeGiven = n, true
	case "winc":
		g.WInc = n
	case "binc":
		g.BInc = n
	case "movestogo":
		g.MovesToGo = n
	case "depth":
		g.Depth = n
	case "nodes":
		g.Nodes = n
	case "mate":
		g.Mate = n
	case "movetime":
		g.MoveTime = n
	}
}

// String writes the command back as a GUI would send it (Parse(c.String()) is c).
func (c Command) String() string {
	var b strings.Builder
	for w, k := range kindWords {
		if k == c.Kind {
			b.WriteString(w)
		}
	}
	switch c.Kind {
	case CmdDebug:
		if c.On {
			b.WriteString(" on")
		} else {
			b.WriteString(" off")
		}
	case CmdSetOption:
		b.WriteString(" name " + c.Name)
		if c.Value != "" {
			b.WriteString(" value " + c.Value)
		}
	case CmdPosition:
		if c.FEN == "" {
			b.WriteString(" startpos")
		} else {
			b.WriteString(" fen " + c.FEN)
		}
		if len(c.Moves) > 0 {
			b.WriteString(" moves " + strings.Join(c.Moves, " "))
		}
	case CmdGo:
		g := c.Go
		if len(g.SearchMoves) > 0 {
			b.WriteString(" searchmoves " + strings.Join(g.SearchMoves, " "))
		}
		if g.Ponder {
			b.WriteString(" ponder")
		}
		if g.wtimeGiven {
			fmt.Fprintf(&b, " wtime %d", g.WTime)
		}
		if g.btimeGiven {
			fmt.Fprintf(&b, " btime %d", g.BTime)
		}
		for _, kv := range []struct {
			w string
			n int
		}{{"winc", g.WInc}, {"binc", g.BInc}, {"movestogo", g.MovesToGo}, {"depth", g.Depth},
			{"nodes", g.Nodes}, {"mate", g.Mate}, {"movetime", g.MoveTime}} {
			if kv.n != 0 {
				fmt.Fprintf(&b, " %s %d", kv.w, kv.n)
			}
		}
		if g.Infinite {
			b.WriteString(" infinite")
		}
	}
	return b.String()
}

func indexOf(s []string, w string) int {
	for i, x := range s {
		if x == w {
			return i
		}
	}
	return -1
}

// clip shortens what is quoted back to the GUI.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
