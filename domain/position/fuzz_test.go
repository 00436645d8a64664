package position

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// Fuzz tests: no input panics, every refusal is an *Error, and what is
// accepted is self-consistent.

// A panic inside notnil/chess is turned into an error in production (see
// recovered); in tests it propagates, so fuzzing finds the input and
// validation can be made to refuse it.
func init() { recovered = func(r any) { panic(r) } }

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		StartFEN,
		"r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R w KQkq - 0 1",
		"bqnb1rkr/pp3ppp/3ppn2/2p5/5P2/P2P4/NPP1P1PP/BQ1BNRKR w HFhf - 2 9",
		"r2k3r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", "1r2k2r/8/8/8/8/8/8/R3K2R w KQq - 0 1",
		"4k3/8/8/8/8/8/8/K6R w H - 0 1",
		"rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3",
		"rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 5 1", // counters ParseStored repairs
		"4k3/8/8/8/8/8/8/4K3 w - - 0000300 0000002",                    // leading zeros; a clock notnil reads from the text
		"8/8/8/8/8/8/8/8 w - -", "", "k7/8/8/8/8/8/8/K7 b - - 99 50",
		"k7/8/8/8/8/8/8/K7 b - - 0 100000", "4k3/8/8/8/8/8/4P3/4K3 w - - 100000 50001", // counters at the limit
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, fen string, chess960 bool) {
		p, err := Parse(fen, chess960)
		checkParseStored(t, fen, chess960, p, err)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) || pe.Reason == "" || pe.Field != "fen" {
				t.Fatalf("Parse(%q) error %#v is not a filled *Error", fen, err)
			}
			return
		}
		out := p.FEN()
		storable(t, out) // a canonical FEN is stored in job events and charges
		q, err := Parse(out, chess960)
		if err != nil {
			t.Fatalf("canonical FEN %q of %q refused: %v", out, fen, err)
		}
		if q.FEN() != out || !strings.HasPrefix(out, p.Normalized()+" ") {
			t.Fatalf("not canonical: %q -> %q", out, q.FEN())
		}
		p.Status()
		p.InsufficientMaterial()
		if !chess960 {
			crossCheckOwnGenerator(t, p) // notnil and our generator agree
			checkNotnilDecode(t, fen)    // the binary hand-over is notnil's FEN decode
		}
		// Only a move that would take a counter past the limit is refused.
		atLimit := p.halfmove == maxCounter || p.fullmove == maxCounter && p.turn == Black
		for _, m := range p.LegalMoves() {
			n, pm, err := p.Play(m.UCI)
			if err != nil && atLimit {
				if f, ferr := p.FindMove(m.UCI); ferr != nil || f != m {
					t.Fatalf("%s: FindMove(%q) = %v, %v", out, m.UCI, f, ferr)
				}
				continue
			}
			if err != nil || pm != m {
				t.Fatalf("%s: Play(%q) = %v, %v", out, m.UCI, pm, err)
			}
			if _, err := Parse(n.FEN(), chess960); err != nil {
				t.Fatalf("%s after %s: %q refused: %v", out, m.UCI, n.FEN(), err)
			}
		}
	})
}

// checkParseStored checks ParseStored against Parse's answer (p, err) for fen: the
// same position where Parse accepts it; where Parse refuses it, the same refusal,
// except one of the counter rules beside an en passant square, whose FEN it repairs
// into one Parse accepts.
func checkParseStored(t *testing.T, fen string, chess960 bool, p *Position, err error) {
	t.Helper()
	s, serr := ParseStored(fen, chess960)
	switch {
	case err == nil:
		if serr != nil || s.FEN() != p.FEN() {
			t.Fatalf("ParseStored(%q) = %v, %v; Parse gave %q", fen, s, serr, p.FEN())
		}
	case serr != nil:
		if serr.Error() != err.Error() {
			t.Fatalf("ParseStored(%q) refused %v; Parse %v", fen, serr, err)
		}
	default:
		if r := err.Error(); !strings.Contains(r, "is impossible with the en passant square") && !strings.Contains(r, "is impossible at fullmove number 1") {
			t.Fatalf("ParseStored(%q) accepted what Parse refused for another reason: %v", fen, err)
		}
		if q, err := Parse(s.FEN(), chess960); err != nil || q.FEN() != s.FEN() {
			t.Fatalf("ParseStored(%q) gave %q, which Parse reads as %v, %v", fen, s.FEN(), q, err)
		}
	}
}

func FuzzLineSAN(f *testing.F) {
	f.Add(StartFEN, false, "e2e4 e7e5 g1f3 b8c6 f1c4 g8f6 e1g1")
	f.Add("bqnb1rkr/pp3ppp/3ppn2/2p5/5P2/P2P4/NPP1P1PP/BQ1BNRKR w HFhf - 2 9", true, "e1f3 f6e4 g1h1 a7a5")
	f.Add("8/P6k/8/8/8/8/6Kp/8 w - - 0 1", false, "a7a8q h2h1n a8b8 0000")
	f.Fuzz(func(t *testing.T, fen string, chess960 bool, line string) {
		p, err := Parse(fen, chess960)
		if err != nil {
			return
		}
		moves := strings.Fields(line)
		sans, err := p.LineSAN(moves)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) || pe.Field != "moves" {
				t.Fatalf("LineSAN error %#v", err)
			}
			return
		}
		if len(sans) != len(moves) {
			t.Fatalf("%d SAN for %d moves", len(sans), len(moves))
		}
	})
}

func FuzzParsePGN(f *testing.F) {
	f.Add(`[Event "x"] [FEN "r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1"] 1. O-O {c} O-O-O (1... Kd8 $2) 2. Rf7 ; x
1-0`, false, 10)
	f.Add("1. e4 e5 2. Nf3 Nc6 3. Bb5 a6 4. Ba4 Nf6 5. O-O Be7 *", false, 0)
	f.Add(`[Variant "Chess960"][FEN "rk5r/pppppppp/8/8/8/8/PPPPPPPP/RK5R w AHah - 0 1"] 1. O-O O-O-O`, false, 3)
	f.Add("1. e4 (1. d4 {x} (1. c4)) e5?! 2. f4!! $14 exf4 3. e5=Q", true, 50)
	f.Add(`[FEN "3k4/8/8/8/8/8/3K4/8 w - - 99998 100000"] 100000. Ke2 Kd7 *`, false, 5)
	f.Fuzz(func(t *testing.T, pgn string, chess960 bool, maxPlies int) {
		g, err := ParsePGN(pgn, chess960, maxPlies)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) || pe.Field != "pgn" || pe.Reason == "" {
				t.Fatalf("ParsePGN error %#v", err)
			}
			return
		}
		if g.Start == nil || g.End == nil || len(g.Plies) > MaxPGNPlies {
			t.Fatalf("bad game %+v", g)
		}
		// The plies replay from the start, and what a job stores of them is storable.
		var line []string
		// Every FEN it gives parses back in the game's mode.
		chess960 = g.Start.Chess960()
		for _, p := range g.Plies {
			line = append(line, p.Move.UCI)
			storable(t, p.FEN+p.Move.UCI+p.Move.SAN)
			if _, err := Parse(p.FEN, chess960); err != nil {
				t.Fatalf("ply %d's FEN %q refused: %v", p.Number, p.FEN, err)
			}
		}
		if _, err := Parse(g.End.FEN(), chess960); err != nil {
			t.Fatalf("the last position's FEN %q refused: %v", g.End.FEN(), err)
		}
		if g.Result != "" && !isResult(g.Result) {
			t.Fatalf("result %q", g.Result)
		}
		if _, err := g.Start.LineSAN(line); err != nil {
			t.Fatalf("plies do not replay: %v", err)
		}
	})
}

// storable fails when s could not be stored as PostgreSQL text in an event: invalid
// UTF-8, NUL or another control character.
func storable(t *testing.T, s string) {
	t.Helper()
	if !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r >= 0x7f && r <= 0x9f }) {
		t.Fatalf("%q is not storable text", s)
	}
}
