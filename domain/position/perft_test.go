package position

import "testing"

// perft counts leaf nodes of the legal move tree to depth d. In standard
// chess this runs on notnil (moves and Update), in Chess960 on our generator.
func perft(p *Position, d int) int {
	var buf [256]move
	ms := p.legalMoves(buf[:0])
	if d == 1 {
		return len(ms)
	}
	n := 0
	for _, m := range ms {
		c := p.after(m)
		n += perft(&c, d-1)
	}
	return n
}

func TestPerft(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		fen      string
		chess960 bool
		nodes    []int // perft(1), perft(2), ...
	}{
		{"start", StartFEN, false, []int{20, 400, 8902, 197281}},
		{"start as 960", StartFEN, true, []int{20, 400, 8902, 197281}},
		{"kiwipete", "r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R w KQkq - 0 1", false, []int{48, 2039, 97862, 4085603}},
		{"kiwipete as 960", "r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R w KQkq - 0 1", true, []int{48, 2039, 97862}},
		{"position 3", "8/2p5/3p4/KP5r/1R3p1k/8/4P1P1/8 w - - 0 1", false, []int{14, 191, 2812, 43238, 674624}},
		{"position 4", "r3k2r/Pppp1ppp/1b3nbN/nP6/BBP1P3/q4N2/Pp1P2PP/R2Q1RK1 w kq - 0 1", false, []int{6, 264, 9467}},
		{"position 4 mirrored", "r2q1rk1/pP1p2pp/Q4n2/bbp1p3/Np6/1B3NBn/pPPP1PPP/R3K2R b KQ - 0 1", false, []int{6, 264, 9467}},
		{"position 5", "rnbq1k1r/pp1Pbppp/2p5/8/2B5/8/PPP1NnPP/RNBQK2R w KQ - 1 8", false, []int{44, 1486, 62379}},
		{"position 6", "r4rk1/1pp1qppp/p1np1n2/2b1p1B1/2B1P1b1/P1NP1N2/1PP1QPPP/R4RK1 w - - 0 10", false, []int{46, 2079, 89890}},
		// Chess960 (CPW "Chess960 Perft Results").
		{"960 bqnb1rkr", "bqnb1rkr/pp3ppp/3ppn2/2p5/5P2/P2P4/NPP1P1PP/BQ1BNRKR w HFhf - 2 9", true, []int{21, 528, 12189, 326672, 8146062}},
		{"960 2nnrbkr", "2nnrbkr/p1qppppp/8/1ppb4/6PP/3PP3/PPP2P2/BQNNRBKR w HEhe - 1 9", true, []int{21, 807, 18002, 667366}},
		{"960 b1q1rrkb", "b1q1rrkb/pppppppp/3nn3/8/P7/1PPP4/4PPPP/BQNNRKRB w GE - 1 9", true, []int{20, 479, 10471, 273318}},
		{"960 qbbnnrkr", "qbbnnrkr/2pp2pp/p7/1p2pp2/8/P3PP2/1PPP1KPP/QBBNNR1R w hf - 0 9", true, []int{22, 593, 13440, 382958}},
		{"960 b1qr1krb", "b1qr1krb/pp1ppppp/n2n4/8/2p5/2P3P1/PP1PPP1P/BNQRNKRB w GDgd - 0 1", true, []int{28, 707, 19721}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := Parse(tt.fen, tt.chess960)
			if err != nil {
				t.Fatal(err)
			}
			for d, want := range tt.nodes {
				if testing.Short() && want > 1000000 {
					continue
				}
				if got := perft(p, d+1); got != want {
					t.Errorf("perft(%d) = %d, want %d", d+1, got, want)
				}
			}
		})
	}
}
