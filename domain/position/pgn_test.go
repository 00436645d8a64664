package position

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestParsePGN(t *testing.T) {
	t.Parallel()
	const full = `[Event "Casual"]
[White "A \"quoted\" name"]
[Result "1-0"]
% an escape line
1. e4 {best by test} e5 $1 2. Nf3!? Nc6 (2... d6 3. d4 (3. Bc4) exd4) 3. Bb5 ; the Ruy
a6 4.Ba4 Nf6 5. O-O Be7 6... 1-0 {the end}`
	g, err := ParsePGN(full, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	var sans, ucis []string
	for i, p := range g.Plies {
		sans = append(sans, p.Move.SAN)
		ucis = append(ucis, p.Move.UCI)
		if p.Number != i+1 {
			t.Errorf("ply %d numbered %d", i+1, p.Number)
		}
	}
	if want := []string{"e4", "e5", "Nf3", "Nc6", "Bb5", "a6", "Ba4", "Nf6", "O-O", "Be7"}; !slices.Equal(sans, want) {
		t.Errorf("SAN %v, want %v", sans, want)
	}
	if ucis[8] != "e1g1" {
		t.Errorf("castling UCI %q", ucis[8])
	}
	if g.Result != "1-0" || g.Truncated || g.Start.FEN() != StartFEN {
		t.Errorf("result %q truncated %v start %s", g.Result, g.Truncated, g.Start.FEN())
	}
	if p := g.Plies[1]; p.FEN != "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1" || p.MoveNumber != 1 || p.Color != Black {
		t.Errorf("ply 2 = %+v", p)
	}
	if want := "r1bqk2r/1pppbppp/p1n2n2/4p3/B3P3/5N2/PPPP1PPP/RNBQ1RK1 w kq - 4 6"; g.End.FEN() != want {
		t.Errorf("end %s, want %s", g.End.FEN(), want)
	}

	// maxPlies truncates.
	g, err = ParsePGN(full, false, 3)
	if err != nil || len(g.Plies) != 3 || !g.Truncated || g.End.FEN() != "rnbqkbnr/pppp1ppp/8/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R b KQkq - 1 2" {
		t.Errorf("truncated: %v %+v", err, g)
	}
}

// GamePly counts the game's plies from its start's move number (1 is White's first
// move), up to the counters' limit; "e.p." written apart from its capture is an
// annotation, not a move.
func TestParsePGNGamePly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, pgn string
		ucis      []string
		plies     []int
	}{
		{"from the start", "1. e4 e5 2. Nf3 *", []string{"e2e4", "e7e5", "g1f3"}, []int{1, 2, 3}},
		{"black to move at move 7", `[FEN "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R b KQkq - 3 7"] 7... Nf6 8. d3 *`,
			[]string{"g8f6", "d2d3"}, []int{14, 15}},
		{"up to the counters' limit", `[FEN "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 99999"] 99999. e4 e5 100000. Nf3 *`,
			[]string{"e2e4", "e7e5", "g1f3"}, []int{199997, 199998, 199999}},
		{"e.p. apart", `[FEN "4k3/8/8/3pP3/8/8/8/4K3 w - d6 0 2"] 2. exd6 e.p. Kd7 *`, []string{"e5d6", "e8d7"}, []int{3, 4}},
		{"e.p. glued", `[FEN "4k3/8/8/3pP3/8/8/8/4K3 w - d6 0 2"] 2. exd6e.p. Kd7 *`, []string{"e5d6", "e8d7"}, []int{3, 4}},
	} {
		g, err := ParsePGN(tc.pgn, false, 50)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		var ucis []string
		var plies []int
		for _, p := range g.Plies {
			ucis, plies = append(ucis, p.Move.UCI), append(plies, p.GamePly)
		}
		if !slices.Equal(ucis, tc.ucis) || !slices.Equal(plies, tc.plies) {
			t.Errorf("%s: moves %v at plies %v, want %v at %v", tc.name, ucis, plies, tc.ucis, tc.plies)
		}
	}
}

func TestParsePGNFromFEN(t *testing.T) {
	t.Parallel()
	pgn := `[SetUp "1"]
[FEN "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"]

3. Bb5 a6 4. Bxc6 dxc6 5. O-O f6 6. d4 exd4 7. Nxd4 c5 8. Nb3 Qxd1 9. Rxd1 *`
	g, err := ParsePGN(pgn, false, 50)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Plies) != 13 || g.Plies[0].FEN != "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3" || g.Plies[0].MoveNumber != 3 || g.Result != "*" {
		t.Errorf("game from FEN: %d plies, first %+v, result %q", len(g.Plies), g.Plies[0], g.Result)
	}
	if g.Plies[3].Move.SAN != "dxc6" || g.Plies[12].Move.UCI != "f1d1" {
		t.Errorf("plies: %+v %+v", g.Plies[3], g.Plies[12])
	}
}

func TestParsePGNChess960(t *testing.T) {
	t.Parallel()
	pgn := `[Variant "Chess960"]
[FEN "rk5r/pppppppp/8/8/8/8/PPPPPPPP/RK5R w AHah - 0 1"]

1. O-O O-O-O 2. Rae1`
	g, err := ParsePGN(pgn, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !g.Start.Chess960() || len(g.Plies) != 3 {
		t.Fatalf("960 game: %+v", g)
	}
	if g.Plies[0].Move.UCI != "b1h1" || g.Plies[1].Move.UCI != "b8a8" || g.Plies[1].Move.SAN != "O-O-O" {
		t.Errorf("960 castling plies %+v %+v", g.Plies[0], g.Plies[1])
	}
	if want := "2kr3r/pppppppp/8/8/8/8/PPPPPPPP/4RRK1 b - - 3 2"; g.End.FEN() != want {
		t.Errorf("end %s, want %s", g.End.FEN(), want)
	}
}

func TestParsePGNErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		pgn    string
		reason string
	}{
		{"illegal move names ply", "1. e4 e5 2. Nf3 Nc6 3. Bc4 Nf6 4. Nxd5?? Nxe4", `ply 7 (4. Nxd5??): illegal move "Nxd5"`},
		{"black ply", "1. e4 e5 2. d4 Kf9", `ply 4 (2... Kf9): unreadable move "Kf9"`},
		{"ambiguous", `[FEN "4k3/8/8/8/8/8/8/1N2KN2 w - - 0 1"] 1. Nd2`, `ply 1 (1. Nd2): ambiguous move (pieces on b1, f1 can make it) "Nd2"`},
		{"missing promotion", `[FEN "4k3/P7/8/8/8/8/8/4K3 w - - 0 1"] 1. a8`, "promotion piece missing"},
		{"bad FEN tag", `[FEN "8/8/8/8/8/8/8/8 w - - 0 1"] *`, "FEN tag: white has 0 kings"},
		{"unterminated comment", "1. e4 {oops", "unterminated comment"},
		{"unbalanced", "1. e4 ) e5", "unbalanced ')'"},
		{"open variation", "1. e4 (1. d4 d5", "unterminated variation"},
		{"bad tag", `[Event "x`, "unterminated value"},
		{"variant", `[Variant "Crazyhouse"] 1. e4`, `variant "Crazyhouse" is not supported`},
		{"null move", "1. e4 --", "null moves are not supported"},
		{"empty", "  ", "PGN is empty"},
		{"too large", strings.Repeat(" ", MaxPGNBytes+1), "at most 65536"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParsePGN(tt.pgn, false, 0)
			var pe *Error
			if !errors.As(err, &pe) || pe.Code != CodeInvalidPGN || pe.Field != "pgn" || !strings.Contains(pe.Reason, tt.reason) {
				t.Errorf("ParsePGN error = %v, want reason containing %q", err, tt.reason)
			}
		})
	}
}

func TestParsePGNLenient(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		pgn  string
		san  []string
	}{
		{"castling with zeros", `[FEN "r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1"] 1. 0-0 0-0-0`, []string{"O-O", "O-O-O"}},
		{"promotion without =", `[FEN "8/P6k/8/8/8/8/8/K7 w - - 0 1"] 1. a8Q`, []string{"a8=Q"}},
		{"spaced dots and glued numbers", "1.e4 1... e5 2.Nf3", []string{"e4", "e5", "Nf3"}},
		{"check marks and suffixes", "1. e4 e5 2. Qh5 Nc6 3. Bc4 Nf6?? 4. Qxf7# 1-0", []string{"e4", "e5", "Qh5", "Nc6", "Bc4", "Nf6", "Qxf7#"}},
		{"no result", "1. d4", []string{"d4"}},
		{"tags only", `[Event "x"]`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g, err := ParsePGN(tt.pgn, false, 0)
			if err != nil {
				t.Fatal(err)
			}
			var sans []string
			for _, p := range g.Plies {
				sans = append(sans, p.Move.SAN)
			}
			if !slices.Equal(sans, tt.san) {
				t.Errorf("SAN %v, want %v", sans, tt.san)
			}
		})
	}
}
