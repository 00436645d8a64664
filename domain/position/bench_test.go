package position

import "testing"

const benchFEN = "r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R w KQkq - 0 1"

func BenchmarkParse(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(benchFEN, false); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseNormalized(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		p, err := Parse(benchFEN, false)
		if err != nil {
			b.Fatal(err)
		}
		_ = p.Normalized()
	}
}

func BenchmarkLineSAN(b *testing.B) {
	p, err := Parse(StartFEN, false)
	if err != nil {
		b.Fatal(err)
	}
	pv := []string{"e2e4", "e7e5", "g1f3", "b8c6", "f1b5", "a7a6", "b5a4", "g8f6", "e1g1", "f8e7", "f1e1", "b7b5", "a4b3", "d7d6", "c2c3", "e8g8", "h2h3", "c6a5", "b3c2", "c7c5"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.LineSAN(pv); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkLegalMoves(b *testing.B) {
	p, err := Parse(benchFEN, false)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = p.LegalMoves()
	}
}

// The benchmarks above reuse one parsed position; an eval request parses a
// fresh one, so these measure the whole path.

func BenchmarkParseLegalMoves(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		p, err := Parse(benchFEN, false)
		if err != nil {
			b.Fatal(err)
		}
		_ = p.LegalMoves()
	}
}

func BenchmarkParseLineSAN(b *testing.B) {
	pv := []string{"e2e4", "e7e5", "g1f3", "b8c6", "f1b5", "a7a6", "b5a4", "g8f6", "e1g1", "f8e7", "f1e1", "b7b5", "a4b3", "d7d6", "c2c3", "e8g8", "h2h3", "c6a5", "b3c2", "c7c5"}
	b.ReportAllocs()
	for b.Loop() {
		p, err := Parse(StartFEN, false)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.LineSAN(pv); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParsePGN(b *testing.B) {
	const pgn = `1. e4 e5 2. Nf3 Nc6 3. Bb5 a6 4. Ba4 Nf6 5. O-O Be7 6. Re1 b5 7. Bb3 d6 8. c3 O-O
9. h3 Na5 10. Bc2 c5 11. d4 Qc7 12. Nbd2 cxd4 13. cxd4 Nc6 14. Nb3 a5 15. Be3 a4
16. Nbd2 Bd7 17. Rc1 Qb7 18. Qe2 Rfe8 19. Bd3 exd4 20. Nxd4 Nxd4 *`
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParsePGN(pgn, false, 0); err != nil {
			b.Fatal(err)
		}
	}
}
