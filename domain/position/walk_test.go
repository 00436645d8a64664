package position

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/notnil/chess"
)

// LineSAN through the memo of walked positions writes what notnil writes on
// fresh positions: the lines are overlapping stretches of random games (as a
// game analysed position by position gives), each written twice (the second
// time from remembered positions) and by several goroutines at once (run with
// -race, a shared notnil position touched outside stdState.legal shows up).
func TestLineSANThroughRememberedPositions(t *testing.T) {
	t.Parallel()
	type stretch struct {
		from *Position
		line []string
		want []string
	}
	var stretches []stretch
	rng := rand.New(rand.NewPCG(3, 4))
	for g := 0; g < 12; g++ {
		p := mustParse(t, StartFEN, false)
		var played []*Position
		var moves []string
		for ply := 0; ply < 80; ply++ {
			ms := p.LegalMoves()
			if len(ms) == 0 {
				break
			}
			u := ms[rng.IntN(len(ms))].UCI
			next, _, err := p.Play(u)
			if err != nil {
				t.Fatal(err)
			}
			played, moves = append(played, p), append(moves, u)
			p = next
		}
		for i := range played {
			line := moves[i:min(i+16, len(moves))]
			stretches = append(stretches, stretch{played[i], line, notnilLineSAN(t, played[i].FEN(), line)})
		}
	}
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			order := rand.New(rand.NewPCG(uint64(w), 5)).Perm(len(stretches))
			for pass := 0; pass < 2; pass++ {
				for _, i := range order {
					s := stretches[i]
					got, err := s.from.LineSAN(s.line)
					if err != nil || !slices.Equal(got, s.want) {
						t.Errorf("%s %v: LineSAN %v, %v; notnil %v", s.from.FEN(), s.line, got, err, s.want)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}

// notnilLineSAN writes line in SAN with notnil alone, on positions decoded
// afresh from fen.
func notnilLineSAN(t *testing.T, fen string, line []string) []string {
	t.Helper()
	opt, err := chess.FEN(fen)
	if err != nil {
		t.Fatal(err)
	}
	pos := chess.NewGame(opt).Position()
	var out []string
	for _, u := range line {
		var found *chess.Move
		for _, m := range pos.ValidMoves() {
			if (chess.UCINotation{}).Encode(pos, m) == u {
				found = m
			}
		}
		if found == nil {
			t.Fatalf("%s: notnil has no move %s", pos, u)
		}
		out = append(out, chess.AlgebraicNotation{}.Encode(pos, found))
		pos = pos.Update(found)
	}
	return out
}

// The memo gives one state to one position however it was reached, another
// to the same board with another side to move or other castling rights
// (other moves), and holds at most its limit.
func TestWalkMemo(t *testing.T) {
	t.Parallel()
	w := &walkMemo{limit: 3, m: map[string]*stdState{}}
	reach := func(moves ...string) *chess.Position {
		t.Helper()
		st := mustParse(t, StartFEN, false).std
		for _, u := range moves {
			m, e := findUCI(u, st.legal(), false, White, func(int8) piece { return noPiece })
			if e != nil {
				t.Fatal(e)
			}
			st = newStdState(st.pos.Update(m.nn))
		}
		return st.pos
	}
	a := w.state(reach("g1f3", "g8f6", "b1c3", "b8c6"))
	if b := w.state(reach("b1c3", "b8c6", "g1f3", "g8f6")); b != a {
		t.Error("a transposition got a state of its own")
	}
	if w.state(reach("e2e4")) == a {
		t.Error("another position got the first one's state")
	}
	same := &walkMemo{limit: 100, m: map[string]*stdState{}}
	for _, fens := range [][2]string{
		{StartFEN, "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR b KQkq - 0 1"},
		{"r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", "r3k2r/8/8/8/8/8/8/R3K2R w - - 0 1"},
	} {
		if same.state(mustParse(t, fens[0], false).std.pos) == same.state(mustParse(t, fens[1], false).std.pos) {
			t.Errorf("%s and %s share a state", fens[0], fens[1])
		}
	}
	for _, u := range []string{"d2d4", "c2c4", "g2g3", "b2b3"} {
		w.state(reach(u))
		if len(w.m) > w.limit {
			t.Fatalf("%d positions remembered, limit %d", len(w.m), w.limit)
		}
	}
}
