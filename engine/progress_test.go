package engine

import (
	"reflect"
	"testing"
)

// The watcher fed the engine's output as Stockfish prints it: which depths it reports.
func TestDepthWatchLines(t *testing.T) {
	for _, tc := range []struct {
		name    string
		multipv string // the search's MultiPV option ("": none)
		lines   []string
		best    bool // the search ends with bestmove
		want    []int
		wantPVs []int // lines in each report
	}{
		{
			name: "one line per depth",
			lines: []string{
				"info depth 1 seldepth 1 multipv 1 score cp 20 nodes 20 nps 20000 time 1 pv e2e4",
				"info depth 2 seldepth 2 multipv 1 score cp 25 nodes 60 nps 30000 time 2 pv e2e4 e7e5",
				"info depth 3 currmove e2e4 currmovenumber 1",
				"info depth 3 seldepth 4 multipv 1 score cp 30 nodes 200 nps 40000 time 5 pv d2d4",
			},
			best: true, want: []int{1, 2, 3}, wantPVs: []int{1, 1, 1},
		},
		{
			name: "multipv: a depth completes with its last line", multipv: "2",
			lines: []string{
				"info depth 1 seldepth 1 multipv 1 score cp 20 nodes 20 pv e2e4",
				"info depth 1 seldepth 1 multipv 2 score cp 10 nodes 40 pv d2d4",
				"info depth 2 seldepth 2 multipv 1 score cp 25 nodes 80 pv e2e4 e7e5",
				// printed after 3 s while line 2 is searched: line 2 still at depth 1
				"info depth 2 seldepth 2 multipv 2 score cp 10 nodes 90 pv d2d4",
				"info depth 2 seldepth 3 multipv 2 score cp 12 upperbound nodes 95 pv d2d4",
				"info depth 2 seldepth 3 multipv 1 score cp 25 nodes 100 pv e2e4 e7e5",
				"info depth 2 seldepth 3 multipv 2 score cp 11 nodes 100 pv d2d4 d7d5",
			},
			best: true, want: []int{1, 2}, wantPVs: []int{2, 2},
		},
		{
			// the answer's line is the last printed, a bound at depth 2: so is the last report
			name: "stopped mid-depth: the answer's depth at bestmove",
			lines: []string{
				"info depth 1 multipv 1 score cp 20 nodes 20 pv e2e4",
				"info depth 2 multipv 1 score cp 30 lowerbound nodes 40 pv e2e4",
			},
			best: true, want: []int{1, 2}, wantPVs: []int{1, 1},
		},
		{
			name: "fewer lines than asked: only at bestmove", multipv: "3",
			lines: []string{
				"info depth 1 multipv 1 score cp 20 nodes 20 pv e2e4",
				"info depth 1 multipv 2 score cp 10 nodes 30 pv d2d4",
				"info depth 2 multipv 1 score cp 20 nodes 40 pv e2e4",
				"info depth 2 multipv 2 score cp 10 nodes 50 pv d2d4",
			},
			best: true, want: []int{2}, wantPVs: []int{2},
		},
		{
			name: "cancelled: nothing at the end",
			lines: []string{
				"info depth 1 multipv 1 score cp 20 nodes 20 pv e2e4",
				"info depth 2 multipv 1 score cp 30 lowerbound nodes 40 pv e2e4",
			},
			want: []int{1}, wantPVs: []int{1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got, gotPVs []int
			s := Search{Progress: func(p *Progress) {
				got = append(got, p.Depth)
				gotPVs = append(gotPVs, len(p.Lines))
			}}
			var opts []optionValue
			if tc.multipv != "" {
				opts = append(opts, optionValue{key: "multipv", name: "MultiPV", value: tc.multipv})
			}
			w := newDepthWatch(&s, opts)
			var col lineCollector
			for _, l := range tc.lines {
				in, ok := ParseInfo(l)
				if !ok {
					t.Fatalf("not an info line: %q", l)
				}
				col.add(&in)
				w.line(&in, &col)
			}
			if tc.best {
				w.done(col.result("e2e4", ""))
			}
			if !reflect.DeepEqual(got, tc.want) || !reflect.DeepEqual(gotPVs, tc.wantPVs) {
				t.Fatalf("reported depths %v with %v lines, want %v with %v", got, gotPVs, tc.want, tc.wantPVs)
			}
		})
	}
}

// No listener, no watcher: the plain search path is unchanged.
func TestDepthWatchOff(t *testing.T) {
	if w := newDepthWatch(&Search{}, nil); w != nil {
		t.Fatal("a watcher without a listener")
	}
}

// Every engine reports each depth once, deepening, before its answer; the last report
// is the answer's lines.
func TestSearchProgress(t *testing.T) {
	for _, e := range allEngines {
		t.Run(engineLabel(e.id, e.path), func(t *testing.T) {
			var got []*Progress
			res := search(t, e.id, e.path, Search{
				FEN: "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3", Depth: 10, MultiPV: 2,
				Options:  map[string]string{"UCI_ShowWDL": "true"},
				Progress: func(p *Progress) { got = append(got, p) },
			})
			if len(got) == 0 {
				t.Fatal("no progress reported")
			}
			for i, p := range got {
				if i > 0 && p.Depth <= got[i-1].Depth {
					t.Fatalf("depth %d after %d", p.Depth, got[i-1].Depth)
				}
				if len(p.Lines) != 2 {
					t.Fatalf("depth %d: %d lines, want 2", p.Depth, len(p.Lines))
				}
				for _, l := range p.Lines {
					if l.Depth != p.Depth || len(l.PV) == 0 || l.WDL == nil {
						t.Fatalf("depth %d: incomplete line %+v", p.Depth, l)
					}
				}
				if p.Nodes <= 0 {
					t.Fatalf("depth %d: no nodes", p.Depth)
				}
			}
			last := got[len(got)-1]
			if last.Depth != 10 || res.Depth != 10 {
				t.Fatalf("last progress depth %d, result depth %d, want 10", last.Depth, res.Depth)
			}
			if !reflect.DeepEqual(last.Lines, res.Lines) {
				t.Fatalf("last progress lines %+v differ from the result's %+v", last.Lines, res.Lines)
			}
		})
	}
}
