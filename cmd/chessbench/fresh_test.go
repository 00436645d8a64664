package main

import (
	"testing"

	"chessd/domain/position"
)

// flipColours gives FENs the position parser accepts: the fullmove number one more
// when White moves instead of Black (an en passant square with White to move needs
// move 2), one less when Black moves instead of White; flipped back, the FEN returns,
// except White to move at move 1.
func TestFlipColours(t *testing.T) {
	for _, tc := range []struct{ in, want, back string }{ // back: "" for in
		{"rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1", "rnbqkbnr/pppp1ppp/8/4p3/8/8/PPPPPPPP/RNBQKBNR w KQkq e6 0 2", ""},
		{"rnbqkbnr/ppp1pppp/8/8/3pP3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 3", "rnbqkbnr/pppp1ppp/8/3Pp3/8/8/PPP1PPPP/RNBQKBNR w KQkq e6 0 4", ""},
		{"r3k2r/8/8/8/8/8/8/4K2R w Kq - 5 20", "4k2r/8/8/8/8/8/8/R3K2R b Qk - 5 19", ""},
		{"8/2p5/3p4/KP5r/1R3p1k/8/4P1P1/8 w - - 0 1", "8/4p1p1/8/1r3P1K/kp5R/3P4/2P5/8 b - - 0 1", "8/2p5/3p4/KP5r/1R3p1k/8/4P1P1/8 w - - 0 2"},
		{"8/2p5/3p4/KP5r/1R3p1k/8/4P1P1/8 b - - 3 1", "8/4p1p1/8/1r3P1K/kp5R/3P4/2P5/8 w - - 3 2", ""},
		{"rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3", "rnbqkbnr/pppp1ppp/8/4p3/8/8/PPPPPPPP/RNBQKBNR w KQkq e6", ""}, // four fields: Parse's counters
	} {
		got := flipColours(tc.in)
		if got != tc.want {
			t.Errorf("flipColours(%q) = %q, want %q", tc.in, got, tc.want)
		}
		back, want := flipColours(got), tc.back
		if want == "" {
			want = tc.in
		}
		if back != want {
			t.Errorf("flipping %q twice gives %q, want %q", tc.in, back, want)
		}
		for _, f := range []string{got, back} {
			if _, err := position.Parse(f, false); err != nil {
				t.Errorf("flipColours of %q: %q refused: %v", tc.in, f, err)
			}
		}
	}
}

// Every position the paired part searches is legal and distinct from every other.
func TestFreshPositions(t *testing.T) {
	fens := freshPositions()
	if len(fens) < 120 {
		t.Fatalf("%d fresh positions, want at least 120", len(fens))
	}
	seen := map[string]bool{}
	for _, f := range fens {
		p, err := position.Parse(f, false)
		if err != nil {
			t.Fatalf("%q: %v", f, err)
		}
		if k := p.Normalized(); seen[k] {
			t.Fatalf("%q repeats a position", f)
		} else {
			seen[k] = true
		}
	}
}
