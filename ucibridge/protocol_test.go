package ucibridge

import (
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		line string
		want Command
		err  string
	}{
		{line: "uci", want: Command{Kind: CmdUCI}},
		{line: "  isready  ", want: Command{Kind: CmdIsReady}},
		{line: "joho debug on", want: Command{Kind: CmdDebug, On: true}},
		{line: "setoption name MultiPV value 3", want: Command{Kind: CmdSetOption, Name: "MultiPV", Value: "3"}},
		{line: "setoption name Skill Level value 5", want: Command{Kind: CmdSetOption, Name: "Skill Level", Value: "5"}},
		{line: "setoption name Clear Hash", want: Command{Kind: CmdSetOption, Name: "Clear Hash"}},
		{line: "setoption name Key value ce_test_a b", want: Command{Kind: CmdSetOption, Name: "Key", Value: "ce_test_a b"}},
		{line: "setoption value 3", err: `expected "name"`},
		{line: "position startpos", want: Command{Kind: CmdPosition}},
		{line: "position startpos moves e2e4 e7e5", want: Command{Kind: CmdPosition, Moves: []string{"e2e4", "e7e5"}}},
		{line: "position fen 8/8/8/4k3/8/8/4P3/4K3 w - - 0 1 moves e2e4",
			want: Command{Kind: CmdPosition, FEN: "8/8/8/4k3/8/8/4P3/4K3 w - - 0 1", Moves: []string{"e2e4"}}},
		{line: "position fen", err: "no FEN"},
		{line: "position e2e4", err: "expected startpos or fen"},
		{line: "go depth 12", want: Command{Kind: CmdGo, Go: Go{Depth: 12}}},
		{line: "go infinite", want: Command{Kind: CmdGo, Go: Go{Infinite: true}}},
		{line: "go wtime 60000 btime 0 winc 1000 binc 1000 movestogo 20",
			want: Command{Kind: CmdGo, Go: Go{WTime: 60000, WInc: 1000, BInc: 1000, MovesToGo: 20, wtimeGiven: true, btimeGiven: true}}},
		{line: "go searchmoves e2e4 d2d4 movetime 500", want: Command{Kind: CmdGo, Go: Go{SearchMoves: []string{"e2e4", "d2d4"}, MoveTime: 500}}},
		{line: "go ponder nodes 1000 mate 3 frobnicate", want: Command{Kind: CmdGo, Go: Go{Ponder: true, Nodes: 1000, Mate: 3}}},
		// a GUI sends clocks below zero once the engine overran: time is up
		{line: "go wtime -35 btime 12000 winc -10", want: Command{Kind: CmdGo, Go: Go{WTime: 0, BTime: 12000, wtimeGiven: true, btimeGiven: true}}},
		// what cannot be read is left out (and told); the rest is still a go
		{line: "go depth", err: "no value", want: Command{Kind: CmdGo}},
		{line: "go depth -1", err: "not a number", want: Command{Kind: CmdGo}},
		{line: "go depth abc movetime 500", err: `go depth: "abc"`, want: Command{Kind: CmdGo, Go: Go{MoveTime: 500}}},
		{line: "go movetime depth 5", err: "go movetime: no value", want: Command{Kind: CmdGo, Go: Go{Depth: 5}}},
		{line: "go depth 99999999999999999999 infinite", err: "not a number", want: Command{Kind: CmdGo, Go: Go{Infinite: true}}},
		{line: "stop", want: Command{Kind: CmdStop}},
		{line: "ponderhit", want: Command{Kind: CmdPonderHit}},
		{line: "ucinewgame", want: Command{Kind: CmdNewGame}},
		{line: "quit", want: Command{Kind: CmdQuit}},
		{line: "", err: "no command"},
		{line: "hello world", err: "no command"},
	}
	for _, tt := range tests {
		got, err := Parse(tt.line)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("Parse(%q) error %v, want one containing %q", tt.line, err, tt.err)
			}
			if tt.want.Kind != 0 && !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Parse(%q) = %+v, want %+v with the error", tt.line, got, tt.want)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", tt.line, got, err, tt.want)
		}
	}
}

// FuzzParse: no line makes Parse panic, and a command it reads (a go also with
// parameters left out) writes back to a line that reads the same.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"uci", "debug on", "setoption name Skill Level value 5", "position startpos moves e2e4",
		"position fen 8/8/8/4k3/8/8/4P3/4K3 w - - 0 1 moves e2e4 e7e5", "go wtime 0 btime 10 movestogo 3 infinite",
		"go searchmoves e2e4 ponder depth 3", "xyzzy quit", "go depth 99999999999999999999", "go wtime -5 movetime"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		c, err := Parse(line)
		if err != nil && c.Kind != CmdGo {
			return
		}
		again, err := Parse(c.String())
		if err != nil {
			t.Fatalf("Parse(%q) = %+v, written %q, which does not parse: %v", line, c, c.String(), err)
		}
		if !reflect.DeepEqual(c, again) {
			t.Fatalf("Parse(%q) = %+v, written %q, read back %+v", line, c, c.String(), again)
		}
	})
}
