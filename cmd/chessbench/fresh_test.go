package main

import (
	"testing"

	"chessd/domain/position"
)

func TestFlipColours(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1", "rnbqkbnr/pppp1ppp/8/4p3/8/8/PPPPPPPP/RNBQKBNR w KQkq e6 0 1"},
		{"r3k2r/8/8/8/8/8/8/4K2R w Kq - 5 20", "4k2r/8/8/8/8/8/8/R3K2R b Qk - 5 20"},
		{"8/2p5/3p4/KP5r/1R3p1k/8/4P1P1/8 w - - 0 1", "8/4p1p1/8/1r3P1K/kp5R/3P4/2P5/8 b - - 0 1"},
	} {
		if got := flipColours(tc.in); got != tc.want {
			t.Errorf("flipColours(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if back := flipColours(flipColours(tc.in)); back != tc.in {
			t.Errorf("flipping %q twice gives %q", tc.in, back)
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
