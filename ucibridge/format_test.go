package ucibridge

import (
	"encoding/json"
	"testing"

	"chessd/client"
)

func TestUCIScoreIsTheSideToMoves(t *testing.T) {
	lower, upper := client.ScoreBoundLower, client.ScoreBoundUpper
	tests := []struct {
		s     client.Score
		black bool
		want  string
	}{
		{client.Score{Type: client.ScoreTypeCp, Value: 34}, false, "cp 34"},
		{client.Score{Type: client.ScoreTypeCp, Value: 34}, true, "cp -34"},
		{client.Score{Type: client.ScoreTypeMate, Value: 2}, false, "mate 2"},
		{client.Score{Type: client.ScoreTypeMate, Value: 2}, true, "mate -2"}, // White mates: Black is mated
		{client.Score{Type: client.ScoreTypeMate, Value: -3}, true, "mate 3"}, // Black mates in 3
		{client.Score{Type: client.ScoreTypeCp, Value: 20, Bound: &lower}, false, "cp 20 lowerbound"},
		{client.Score{Type: client.ScoreTypeCp, Value: 20, Bound: &lower}, true, "cp -20 upperbound"},
		{client.Score{Type: client.ScoreTypeCp, Value: -5, Bound: &upper}, true, "cp 5 lowerbound"},
	}
	for _, tt := range tests {
		if got := uciScore(tt.s, tt.black); got != tt.want {
			t.Errorf("uciScore(%+v, black %v) = %q, want %q", tt.s, tt.black, got, tt.want)
		}
	}
}

func TestInfoLine(t *testing.T) {
	moves := []string{"e7e5", "g1f3"}
	pv := client.PV{Rank: 2, Depth: 12, Seldepth: 15, Eval: client.Score{Type: client.ScoreTypeCp, Value: 31},
		Moves: &moves, Wdl: &client.WDL{W: 100, D: 850, L: 50}}
	stats := depthStats{depth: 12, seldepth: 17, nodes: 69379, nps: 369037, timeMS: 188}
	got := infoLine(pv, stats, true, true)
	want := "info depth 12 seldepth 15 multipv 2 score cp -31 wdl 50 850 100 nodes 69379 nps 369037 time 188 pv e7e5 g1f3"
	if got != want {
		t.Errorf("infoLine:\n got %s\nwant %s", got, want)
	}
	if got := infoLine(pv, stats, false, false); got != "info depth 12 seldepth 15 multipv 2 score cp 31 nodes 69379 nps 369037 time 188 pv e7e5 g1f3" {
		t.Errorf("infoLine without WDL, White to move: %s", got)
	}
}

// request maps `go` and the GUI's options onto the service's search within the caps.
func TestRequest(t *testing.T) {
	fen := "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
	l := limits{depth: 20, multipv: 3, movetime: 10000}
	e := &client.Engines{Default: "sf-17.1"}
	e.Limits.Multipv = client.Range{Min: 1, Max: 10}
	opts := []client.EngineOption{
		{Name: "show_wdl", Type: client.EngineOptionTypeBoolean, UciOption: "UCI_ShowWDL", Default: false},
		{Name: "limit_strength", Type: client.EngineOptionTypeBoolean, UciOption: "UCI_LimitStrength", Default: false},
		{Name: "elo", Type: client.EngineOptionTypeInteger, UciOption: "UCI_Elo", Default: 1320},
		{Name: "hash_mb", Type: client.EngineOptionTypeInteger, UciOption: "Hash", Default: 16},
	}
	e.Options = &opts
	offered := optionsOf(e, "http://x/v1")
	tests := []struct {
		name string
		g    Go
		set  map[string]string
		want string
	}{
		{"depth", Go{Depth: 12}, nil, `{"depth":12,"fen":"F"}`},
		{"depth above the caps", Go{Depth: 40}, nil, `{"depth":20,"fen":"F"}`},
		{"infinite: the deepest allowed", Go{Infinite: true}, nil, `{"depth":20,"fen":"F"}`},
		{"movetime within the caps", Go{MoveTime: 60000}, nil, `{"depth":20,"fen":"F","movetime_ms":10000}`},
		{"clocks", Go{WTime: 60000, BTime: 1000, WInc: 1000, wtimeGiven: true, btimeGiven: true}, nil, `{"depth":20,"fen":"F","movetime_ms":2700}`},
		{"multipv within the caps", Go{Depth: 5}, map[string]string{"multipv": "8"}, `{"depth":5,"fen":"F","multipv":3}`},
		{"options", Go{Depth: 5}, map[string]string{"uci_showwdl": "true", "hash": "64", "uci_elo": "1500"},
			`{"depth":5,"fen":"F","options":{"hash_mb":64,"show_wdl":true}}`},
		{"elo with limit strength", Go{Depth: 5}, map[string]string{"uci_limitstrength": "true", "uci_elo": "1500", "engine": "sf-15.1"},
			`{"depth":5,"engine":"sf-15.1","fen":"F","options":{"elo":1500,"limit_strength":true}}`},
	}
	for _, tt := range tests {
		req := request(fen, tt.g, tt.set, offered, l, false)
		req.Fen = "F"
		got, _ := json.Marshal(req)
		if string(got) != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestBudget(t *testing.T) {
	tests := []struct {
		g     Go
		black bool
		want  int
	}{
		{Go{WTime: 60000, WInc: 0}, false, 1950},                // 60 s / 30 moves − 50 ms
		{Go{WTime: 60000, BTime: 9000, BInc: 2000}, true, 1750}, // 9 s / 30 + ¾ of 2 s − 50 ms
		{Go{WTime: 10000, MovesToGo: 1}, false, 4950},           // never more than half the clock
		{Go{WTime: 0}, false, 1},                                // a flag about to fall
	}
	for _, tt := range tests {
		if got := budget(tt.g, tt.black); got != tt.want {
			t.Errorf("budget(%+v, black %v) = %d, want %d", tt.g, tt.black, got, tt.want)
		}
	}
}
