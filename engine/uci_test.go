package engine

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// The parser tests use lines copied from real Stockfish 17.1 / 15.1 output plus
// hand-made malformed ones; no engine process is involved.

func TestParseInfo(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		line string
		ok   bool
		want Info
	}{
		{
			name: "full line sf17",
			line: "info depth 14 seldepth 19 multipv 1 score cp 34 nodes 170239 nps 1203178 hashfull 60 tbhits 0 time 141 pv e2e4 e7e5 g1f3",
			ok:   true,
			want: Info{Depth: 14, HasDepth: true, SelDepth: 19, MultiPV: 1, HasScore: true, Score: Score{Value: 34},
				Nodes: 170239, NPS: 1203178, HashFull: 60, TimeMS: 141, PV: []string{"e2e4", "e7e5", "g1f3"}},
		},
		{
			name: "mate for side to move",
			line: "info depth 245 seldepth 2 multipv 1 score mate 1 nodes 48 nps 24000 hashfull 0 tbhits 0 time 2 pv h5f7",
			ok:   true,
			want: Info{Depth: 245, HasDepth: true, SelDepth: 2, MultiPV: 1, HasScore: true, Score: Score{Mate: true, Value: 1},
				Nodes: 48, NPS: 24000, TimeMS: 2, PV: []string{"h5f7"}},
		},
		{
			name: "mated, negative",
			line: "info depth 10 score mate -2 pv a1a2",
			ok:   true,
			want: Info{Depth: 10, HasDepth: true, HasScore: true, Score: Score{Mate: true, Value: -2}, PV: []string{"a1a2"}},
		},
		{
			name: "already mated, no pv",
			line: "info depth 0 score mate 0",
			ok:   true,
			want: Info{Depth: 0, HasDepth: true, HasScore: true, Score: Score{Mate: true, Value: 0}},
		},
		{
			name: "lowerbound",
			line: "info depth 22 seldepth 30 multipv 1 score cp 41 lowerbound nodes 4018221 nps 1100000 time 3650 pv d2d4",
			ok:   true,
			want: Info{Depth: 22, HasDepth: true, SelDepth: 30, MultiPV: 1, HasScore: true, Score: Score{Value: 41, Bound: BoundLower},
				Nodes: 4018221, NPS: 1100000, TimeMS: 3650, PV: []string{"d2d4"}},
		},
		{
			name: "upperbound with wdl",
			line: "info depth 22 multipv 2 score cp -12 upperbound wdl 20 900 80 nodes 1 pv e7e5 g1f3",
			ok:   true,
			want: Info{Depth: 22, HasDepth: true, MultiPV: 2, HasScore: true, Score: Score{Value: -12, Bound: BoundUpper},
				WDL: &WDL{W: 20, D: 900, L: 80}, Nodes: 1, PV: []string{"e7e5", "g1f3"}},
		},
		{
			name: "wdl",
			line: "info depth 8 seldepth 9 multipv 3 score cp 20 wdl 61 925 14 nodes 3090 nps 257500 hashfull 1 tbhits 0 time 12 pv g1f3 d7d5",
			ok:   true,
			want: Info{Depth: 8, HasDepth: true, SelDepth: 9, MultiPV: 3, HasScore: true, Score: Score{Value: 20},
				WDL: &WDL{W: 61, D: 925, L: 14}, Nodes: 3090, NPS: 257500, HashFull: 1, TimeMS: 12, PV: []string{"g1f3", "d7d5"}},
		},
		{
			name: "currmove",
			line: "info depth 23 currmove e2e4 currmovenumber 1",
			ok:   true,
			want: Info{Depth: 23, HasDepth: true, CurrMove: "e2e4", CurrMoveNumber: 1},
		},
		{
			name: "string keeps the rest verbatim",
			line: "info string NNUE evaluation using nn-1c0000000000.nnue (133MiB, (22528, 3072, 15, 32, 1))",
			ok:   true,
			want: Info{String: "NNUE evaluation using nn-1c0000000000.nnue (133MiB, (22528, 3072, 15, 32, 1))"},
		},
		{
			name: "promotion and 960 castling in pv",
			line: "info depth 3 score cp 900 pv e7e8q g1h1 0000",
			ok:   true,
			want: Info{Depth: 3, HasDepth: true, HasScore: true, Score: Score{Value: 900}, PV: []string{"e7e8q", "g1h1", "0000"}},
		},
		{
			name: "unknown tokens skipped, fields after pv parsed",
			line: "info depth 5 frobnicate 7 score cp 3 pv e2e4 e7e5 nodes 99",
			ok:   true,
			want: Info{Depth: 5, HasDepth: true, HasScore: true, Score: Score{Value: 3}, PV: []string{"e2e4", "e7e5"}, Nodes: 99},
		},
		{
			name: "bad numbers skipped",
			line: "info depth x score cp y nodes 12",
			ok:   true,
			want: Info{Nodes: 12},
		},
		{
			name: "truncated score",
			line: "info depth 3 score mate",
			ok:   true,
			want: Info{Depth: 3, HasDepth: true},
		},
		{name: "not info", line: "bestmove e2e4", ok: false},
		{name: "empty", line: "", ok: false},
		{name: "info prefix of a word", line: "information depth 3", ok: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := ParseInfo(tt.line)
			if ok != tt.ok {
				t.Fatalf("ok = %v, want %v", ok, tt.ok)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseInfo(%q)\n got  %+v\n want %+v", tt.line, got, tt.want)
			}
		})
	}
}

func TestParseBestMove(t *testing.T) {
	t.Parallel()
	tests := []struct {
		line, best, ponder string
		ok                 bool
	}{
		{"bestmove e2e4 ponder e7e5", "e2e4", "e7e5", true},
		{"bestmove e7e8q", "e7e8q", "", true},
		{"bestmove (none)", "", "", true},
		{"bestmove g1h1 ponder (none)", "g1h1", "", true},
		{"bestmove", "", "", false},
		{"info depth 1", "", "", false},
		{"bestmoves e2e4", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.line, func(t *testing.T) {
			t.Parallel()
			best, ponder, ok := ParseBestMove(tt.line)
			if best != tt.best || ponder != tt.ponder || ok != tt.ok {
				t.Errorf("ParseBestMove(%q) = %q, %q, %v; want %q, %q, %v", tt.line, best, ponder, ok, tt.best, tt.ponder, tt.ok)
			}
		})
	}
}

func TestParseOption(t *testing.T) {
	t.Parallel()
	tests := []struct {
		line string
		ok   bool
		want Option
	}{
		{"option name Threads type spin default 1 min 1 max 1024", true,
			Option{Name: "Threads", Type: OptionSpin, Default: "1", Min: 1, Max: 1024, HasRange: true}},
		{"option name Skill Level type spin default 20 min 0 max 20", true,
			Option{Name: "Skill Level", Type: OptionSpin, Default: "20", Min: 0, Max: 20, HasRange: true}},
		{"option name Clear Hash type button", true, Option{Name: "Clear Hash", Type: OptionButton}},
		{"option name UCI_Chess960 type check default false", true,
			Option{Name: "UCI_Chess960", Type: OptionCheck, Default: "false"}},
		{"option name SyzygyPath type string default <empty>", true,
			Option{Name: "SyzygyPath", Type: OptionString, Default: ""}},
		{"option name Debug Log File type string default ", true, // 15.1 prints nothing
			Option{Name: "Debug Log File", Type: OptionString, Default: ""}},
		{"option name EvalFile type string default nn-1c0000000000.nnue", true,
			Option{Name: "EvalFile", Type: OptionString, Default: "nn-1c0000000000.nnue"}},
		{"option name Style type combo default Normal var Solid var Normal var Risky", true,
			Option{Name: "Style", Type: OptionCombo, Default: "Normal", Vars: []string{"Solid", "Normal", "Risky"}}},
		{"option name", false, Option{}},
		{"option name Foo", false, Option{}},
		{"id name Stockfish 17.1", false, Option{}},
	}
	for _, tt := range tests {
		t.Run(tt.line, func(t *testing.T) {
			t.Parallel()
			got, ok := ParseOption(tt.line)
			if ok != tt.ok || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseOption(%q) = %+v, %v; want %+v, %v", tt.line, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// TestLineCollector pins the choice rule: deepest exact line per rank; bound lines
// only when a rank has no exact line; ranks ordered.
func TestOptionJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		line, want string
	}{
		{"option name Skill Level type spin default 20 min 0 max 20",
			`{"name":"Skill Level","type":"spin","default":"20","min":0,"max":20}`},
		{"option name Clear Hash type button", `{"name":"Clear Hash","type":"button"}`},
		{"option name SyzygyPath type string default <empty>", `{"name":"SyzygyPath","type":"string","default":""}`},
		{"option name Style type combo default A var A var B", `{"name":"Style","type":"combo","default":"A","vars":["A","B"]}`},
	}
	for _, tt := range tests {
		o, ok := ParseOption(tt.line)
		if !ok {
			t.Fatalf("ParseOption(%q) failed", tt.line)
		}
		b, err := json.Marshal(o)
		if err != nil || string(b) != tt.want {
			t.Errorf("json of %q = %s, %v; want %s", tt.line, b, err, tt.want)
		}
	}
}

func TestLineCollector(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		lines     []string
		wantRanks []int
		wantDepth []int
		wantScore []Score
		wantMoves []string // first moves by rank, when given
		nodes     int64
		best      string // the engine's bestmove; e2e4 when empty
	}{
		{
			name: "a later bound line replaces an earlier exact one",
			lines: []string{
				"info depth 20 multipv 1 score cp 30 nodes 100 pv e2e4",
				"info depth 21 multipv 1 score cp 60 lowerbound nodes 200 pv d2d4",
			},
			best:      "d2d4",
			wantRanks: []int{1}, wantDepth: []int{21}, wantScore: []Score{{Value: 60, Bound: BoundLower}}, nodes: 200,
			wantMoves: []string{"d2d4"},
		},
		{
			name: "exact at same depth replaces bound",
			lines: []string{
				"info depth 21 multipv 1 score cp 60 lowerbound nodes 200 pv d2d4",
				"info depth 21 multipv 1 score cp 55 nodes 300 pv d2d4",
			},
			wantRanks: []int{1}, wantDepth: []int{21}, wantScore: []Score{{Value: 55}}, nodes: 300,
		},
		{
			name: "bound used when nothing exact",
			lines: []string{
				"info depth 3 multipv 1 score cp -20 upperbound pv e2e4",
			},
			wantRanks: []int{1}, wantDepth: []int{3}, wantScore: []Score{{Value: -20, Bound: BoundUpper}},
		},
		{
			name: "multipv ordering and stale lower depth of an unfinished rank",
			lines: []string{
				"info depth 9 multipv 2 score cp 10 pv d2d4",
				"info depth 9 multipv 1 score cp 20 pv e2e4",
				"info depth 10 multipv 1 score cp 22 pv e2e4",
				"info depth 9 multipv 3 score cp 5 pv c2c4",
				"info depth 10 currmove g1f3 currmovenumber 2",
			},
			wantRanks: []int{1, 2, 3}, wantDepth: []int{10, 9, 9},
			wantScore: []Score{{Value: 22}, {Value: 10}, {Value: 5}},
		},
		{
			name: "stopped while a new best move failed high",
			lines: []string{
				"info depth 11 multipv 1 score cp 20 pv d2d4 d7d5",
				"info depth 11 multipv 2 score cp 10 pv e2e4 e7e5",
				"info depth 12 multipv 1 score cp 35 lowerbound pv e2e4 c7c5",
				"info depth 12 multipv 2 score cp 18 pv d2d4 g8f6",
			},
			best:      "e2e4",
			wantRanks: []int{1, 2}, wantDepth: []int{12, 12},
			wantScore: []Score{{Value: 35, Bound: BoundLower}, {Value: 18}},
		},
		{
			// Recorded: sf-17.1, MultiPV 3, go movetime 73 on
			// r1bqkb1r/pppp1ppp/2n2n2/4p3/2B1P3/5N2/PPPP1PPP/RNBQK2R w KQkq - 4 4 (the
			// last two batches). Rank 2's deepest exact line (d2d3, depth 11) is the move
			// rank 1 holds now: the last batch alone keeps f3g5.
			name: "stopped mid-depth: every rank of the last batch, bound marked",
			lines: []string{
				"info depth 11 seldepth 14 multipv 1 score cp 127 nodes 30431 nps 691613 hashfull 5 tbhits 0 time 44 pv f3g5 d7d5 e4d5 f6d5 g5f7 e8f7 b1c3 f7e8 c4d5",
				"info depth 11 seldepth 16 multipv 2 score cp 46 nodes 30431 nps 691613 hashfull 5 tbhits 0 time 44 pv d2d3 d7d5 e4d5 f6d5 e1g1 f8e7 f1e1 d5b6 c4b3 c8g4 h2h3 g4h5 g2g4",
				"info depth 11 seldepth 18 multipv 3 score cp 6 nodes 30431 nps 691613 hashfull 5 tbhits 0 time 44 pv d2d4 e5d4 e4e5 d7d5 c4b5 f6d7 e1g1 f8e7 f1e1 e8g8 b5c6 b7c6 f3d4 d7b8 b1c3",
				"info depth 12 seldepth 20 multipv 1 score cp 35 nodes 50411 nps 690561 hashfull 15 tbhits 0 time 73 pv d2d3 d7d5 e4d5 f6d5 e1g1 d5b6 c4b3 f8d6 f1e1 e8g8",
				"info depth 12 seldepth 17 multipv 2 score cp 31 lowerbound nodes 50411 nps 690561 hashfull 15 tbhits 0 time 73 pv f3g5",
				"info depth 11 seldepth 18 multipv 3 score cp 6 nodes 50411 nps 690561 hashfull 15 tbhits 0 time 73 pv d2d4 e5d4 e4e5 d7d5 c4b5 f6d7 e1g1 f8e7 f1e1 e8g8 b5c6 b7c6 f3d4 d7b8 b1c3",
			},
			best:      "d2d3",
			wantRanks: []int{1, 2, 3}, wantDepth: []int{12, 12, 11},
			wantScore: []Score{{Value: 35}, {Value: 31, Bound: BoundLower}, {Value: 6}},
			wantMoves: []string{"d2d3", "f3g5", "d2d4"}, nodes: 50411,
		},
		{
			// Not what Stockfish prints (its batches start at rank 1), but a rank left
			// out of the last batch must not put a move twice in the answer.
			name: "a move at two ranks keeps its newest line",
			lines: []string{
				"info depth 11 multipv 1 score cp 20 pv d2d4 d7d5",
				"info depth 11 multipv 2 score cp 10 pv e2e4 e7e5",
				"info depth 11 multipv 3 score cp 5 pv c2c4 e7e5",
				"info depth 12 multipv 2 score cp 18 pv d2d4 g8f6",
			},
			best:      "d2d4",
			wantRanks: []int{1, 2}, wantDepth: []int{12, 11},
			wantScore: []Score{{Value: 18}, {Value: 5}},
			wantMoves: []string{"d2d4", "c2c4"},
		},
		{
			name:      "mated position",
			lines:     []string{"info depth 0 score mate 0"},
			wantRanks: []int{1}, wantDepth: []int{0}, wantScore: []Score{{Mate: true}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var c lineCollector
			for _, l := range tt.lines {
				in, ok := ParseInfo(l)
				if !ok {
					t.Fatalf("not an info line: %q", l)
				}
				c.add(&in)
			}
			best := tt.best
			if best == "" {
				best = "e2e4"
			}
			r := c.result(best, "")
			if len(r.Lines) != len(tt.wantRanks) {
				t.Fatalf("got %d lines, want %d: %+v", len(r.Lines), len(tt.wantRanks), r.Lines)
			}
			for i, l := range r.Lines {
				if l.MultiPV != tt.wantRanks[i] || l.Depth != tt.wantDepth[i] || l.Score != tt.wantScore[i] {
					t.Errorf("line %d = rank %d depth %d score %+v; want rank %d depth %d score %+v",
						i, l.MultiPV, l.Depth, l.Score, tt.wantRanks[i], tt.wantDepth[i], tt.wantScore[i])
				}
			}
			if tt.wantMoves != nil {
				var got []string
				for _, l := range r.Lines {
					got = append(got, firstMove(l))
				}
				if !slices.Equal(got, tt.wantMoves) {
					t.Errorf("first moves %v, want %v", got, tt.wantMoves)
				}
			}
			if tt.nodes != 0 && r.Nodes != tt.nodes {
				t.Errorf("nodes = %d, want %d", r.Nodes, tt.nodes)
			}
			if r.Depth != r.Lines[0].Depth {
				t.Errorf("result depth %d != rank-1 depth %d", r.Depth, r.Lines[0].Depth)
			}
		})
	}
}

func TestValidateOption(t *testing.T) {
	t.Parallel()
	id := &Identity{Name: "Test", Options: []Option{
		{Name: "Hash", Type: OptionSpin, Default: "16", Min: 1, Max: 33554432, HasRange: true},
		{Name: "Threads", Type: OptionSpin, Default: "1", Min: 1, Max: 1024, HasRange: true},
		{Name: "Skill Level", Type: OptionSpin, Default: "20", Min: 0, Max: 20, HasRange: true},
		{Name: "UCI_ShowWDL", Type: OptionCheck, Default: "false"},
		{Name: "EvalFile", Type: OptionString, Default: "nn-1c0000000000.nnue"},
		{Name: "Clear Hash", Type: OptionButton},
		{Name: "Style", Type: OptionCombo, Default: "Normal", Vars: []string{"Solid", "Normal"}},
	}}
	lim := &limits{maxHashMB: 256, maxThreads: 1}
	tests := []struct {
		name, value, want string
		ok                bool
	}{
		{"skill level", "3", "3", true}, // case-insensitive name
		{"Skill Level", "21", "", false},
		{"Skill Level", "x", "", false},
		{"Hash", "256", "256", true},
		{"Hash", "257", "", false}, // service cap below the engine's max
		{"Threads", "2", "", false},
		{"UCI_ShowWDL", "TRUE", "true", true},
		{"UCI_ShowWDL", "yes", "", false},
		{"EvalFile", "/etc/passwd", "", false}, // strings never come from requests
		{"Clear Hash", "", "", true},
		{"style", "solid", "Solid", true},
		{"Style", "Wild", "", false},
		{"Nope", "1", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name+"="+tt.value, func(t *testing.T) {
			t.Parallel()
			ov, err := validateOption(id, tt.name, tt.value, lim)
			if (err == nil) != tt.ok {
				t.Fatalf("err = %v, want ok=%v", err, tt.ok)
			}
			if err == nil && ov.value != tt.want {
				t.Errorf("value = %q, want %q", ov.value, tt.want)
			}
			if err != nil && !strings.Contains(err.Error(), "invalid option") {
				t.Errorf("error %v does not wrap ErrInvalidOption", err)
			}
		})
	}
}

// FuzzParseInfo proves ParseInfo never panics and keeps its output well formed.
func FuzzParseInfo(f *testing.F) {
	for _, s := range []string{
		"info depth 14 seldepth 19 multipv 1 score cp 34 nodes 170239 nps 1203178 hashfull 60 tbhits 0 time 141 pv e2e4 e7e5",
		"info depth 22 score cp 41 lowerbound wdl 1 2 3 pv d2d4",
		"info depth 12 seldepth 17 multipv 2 score cp 31 lowerbound nodes 50411 nps 690561 time 73 pv f3g5",
		"info depth 0 score mate 0",
		"info string NNUE evaluation using nn-1c0000000000.nnue",
		"info currmove e2e4 currmovenumber 1",
		"info score", "info wdl 1 2", "info pv", "info string", "info  depth\t3",
		"info depth 99999999999999999999 nodes -1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		in, ok := ParseInfo(line)
		if !ok && !reflect.DeepEqual(in, Info{}) {
			t.Fatalf("non-info line produced %+v", in)
		}
		for _, m := range in.PV {
			if !isMove(m) {
				t.Fatalf("pv holds non-move %q", m)
			}
		}
		var c lineCollector
		c.add(&in)
		_ = c.result("", "")
	})
}

func FuzzParseOption(f *testing.F) {
	for _, s := range []string{
		"option name Threads type spin default 1 min 1 max 1024",
		"option name Clear Hash type button",
		"option name Style type combo default Normal var Solid var Normal",
		"option name type type", "option name x min max var",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		o, ok := ParseOption(line)
		if ok && (o.Name == "" || o.Type == "") {
			t.Fatalf("ok option without name or type: %+v", o)
		}
	})
}

func FuzzParseBestMove(f *testing.F) {
	for _, s := range []string{"bestmove e2e4 ponder e7e5", "bestmove (none)", "bestmove", "bestmove a ponder"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		_, _, _ = ParseBestMove(line)
	})
}
