package position

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/notnil/chess"
)

// TestAgainstNotnil plays random games in standard chess and checks, in every
// position, that the legal moves (UCI) and their SAN equal those of a fresh
// notnil/chess decode of our FEN (so the FEN output, the UCI formatting and
// the state carried across Play are right), and that our own generator, which
// serves Chess960, agrees with notnil on the same position.
func TestAgainstNotnil(t *testing.T) {
	t.Parallel()
	starts := []string{
		StartFEN,
		"r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R w KQkq - 0 1",
		"8/2p5/3p4/KP5r/1R3p1k/8/4P1P1/8 w - - 0 1",
		"rnbq1k1r/pp1Pbppp/2p5/8/2B5/8/PPP1NnPP/RNBQK2R w KQ - 1 8",
		"r3k2r/Pppp1ppp/1b3nbN/nP6/BBP1P3/q4N2/Pp1P2PP/R2Q1RK1 w kq - 0 1",
	}
	games := 60
	if testing.Short() {
		games = 10
	}
	rng := rand.New(rand.NewPCG(1, 2))
	positions := 0
	for g := 0; g < games; g++ {
		p := mustParse(t, starts[g%len(starts)], false)
		for ply := 0; ply < 120; ply++ {
			ours := p.LegalMoves()
			opt, err := chess.FEN(p.FEN())
			if err != nil {
				t.Fatalf("notnil refuses our FEN %s: %v", p.FEN(), err)
			}
			pos := chess.NewGame(opt).Position()
			var theirs []Move
			for _, m := range pos.ValidMoves() {
				theirs = append(theirs, Move{UCI: chess.UCINotation{}.Encode(pos, m), SAN: chess.AlgebraicNotation{}.Encode(pos, m)})
			}
			slices.SortFunc(theirs, func(a, b Move) int {
				if a.UCI < b.UCI {
					return -1
				}
				if a.UCI > b.UCI {
					return 1
				}
				return 0
			})
			if !slices.Equal(ours, theirs) {
				t.Fatalf("%s:\nours   %v\nnotnil %v", p.FEN(), ours, theirs)
			}
			if want := pos.Status(); (want == chess.Checkmate) != (p.Status() == Checkmate) || (want == chess.Stalemate) != (p.Status() == Stalemate) {
				t.Fatalf("%s: Status %v, notnil %v", p.FEN(), p.Status(), want)
			}
			crossCheckOwnGenerator(t, p)
			positions++
			if len(ours) == 0 {
				break
			}
			next, _, err := p.Play(ours[rng.IntN(len(ours))].UCI)
			if err != nil {
				t.Fatal(err)
			}
			p = next
		}
	}
	t.Logf("%d positions agree", positions)
}

// crossCheckOwnGenerator plays the standard position p through our own
// generator (Chess960 mode, where KQkq with rooks on the corners means the
// same rights) and compares it with p, which runs on notnil: the SAN of every
// legal move, check, status, and the FEN apart from the castling field.
func crossCheckOwnGenerator(t *testing.T, p *Position) {
	t.Helper()
	q, err := Parse(p.FEN(), true)
	if err != nil {
		t.Fatalf("%s refused in 960 mode: %v", p.FEN(), err)
	}
	sans := func(ms []Move) []string {
		var out []string
		for _, m := range ms {
			out = append(out, m.SAN)
		}
		slices.Sort(out)
		return out
	}
	if a, b := sans(p.LegalMoves()), sans(q.LegalMoves()); !slices.Equal(a, b) {
		t.Fatalf("%s:\nnotnil SAN %v\nown SAN    %v", p.FEN(), a, b)
	}
	if p.InCheck() != (q.checkersCount() > 0) || p.InCheck() != q.InCheck() || p.Status() != q.Status() {
		t.Fatalf("%s: notnil check %v status %v, own check %v status %v", p.FEN(), p.InCheck(), p.Status(), q.InCheck(), q.Status())
	}
	pf, qf := strings.Fields(p.FEN()), strings.Fields(q.FEN())
	pf[2], qf[2] = "", ""
	if !slices.Equal(pf, qf) {
		t.Fatalf("FEN differs apart from castling: %s vs %s", p.FEN(), q.FEN())
	}
}
