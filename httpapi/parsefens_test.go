package httpapi

import (
	"fmt"
	"testing"

	"chessd/domain/position"
)

// A batch's FENs are parsed on several goroutines: each answer stays at its FEN's
// index, whatever the batch's size, and says what parsing it alone says.
func TestParseFENsKeepsEachAtItsIndex(t *testing.T) {
	good := []string{
		position.StartFEN,
		"r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R w KQkq - 0 1",
		"8/2p5/3p4/KP5r/1R3p1k/8/4P1P1/8 w - -", // four fields: the counters are added
	}
	bad := []string{"", "not a fen", "8/8/8/8/8/8/8/8 w - - 0 1"}
	for _, n := range []int{1, 7, 8, 9, 16, 17, 50} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			fens := make([]string, n)
			for i := range fens {
				if i%5 == 3 {
					fens[i] = bad[i%len(bad)]
				} else {
					fens[i] = good[i%len(good)]
				}
			}
			got := parseFENs(fens, false)
			if len(got) != n {
				t.Fatalf("%d answers for %d FENs", len(got), n)
			}
			for i, fen := range fens {
				want, err := position.Parse(fen, false)
				switch {
				case err != nil && got[i].err == nil:
					t.Fatalf("fens[%d] %q: accepted as %q, want refused (%v)", i, fen, got[i].fen, err)
				case err != nil && reason(got[i].err) != reason(err):
					t.Fatalf("fens[%d]: refused for %q, want %q", i, reason(got[i].err), reason(err))
				case err == nil && (got[i].err != nil || got[i].fen != want.FEN()):
					t.Fatalf("fens[%d]: %q (%v), want %q", i, got[i].fen, got[i].err, want.FEN())
				}
			}
		})
	}
}

// BenchmarkParseFENs is a 50-FEN batch's parsing, as POST /batch does it.
func BenchmarkParseFENs(b *testing.B) {
	fens := make([]string, 50)
	for i := range fens {
		fens[i] = "r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R w KQkq - 0 1"
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, r := range parseFENs(fens, false) {
			if r.err != nil {
				b.Fatal(r.err)
			}
		}
	}
}
