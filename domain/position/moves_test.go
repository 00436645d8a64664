package position

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
)

func TestStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		fen    string
		want   Status
		check  bool
		inMat  bool
		nMoves int
	}{
		{"start", StartFEN, Ongoing, false, false, 20},
		{"fool's mate", "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3", Checkmate, true, false, 0},
		{"back rank mate", "6k1/5ppp/8/8/8/8/8/K2R2r1 w - - 0 1", Ongoing, false, false, -1},
		{"stalemate", "7k/5Q2/6K1/8/8/8/8/8 b - - 0 1", Stalemate, false, false, 0},
		{"check with escape", "4k3/8/8/8/8/8/4r3/4K3 w - - 0 1", Ongoing, true, false, -1},
		{"K vs K", "4k3/8/8/8/8/8/8/4K3 w - - 0 1", Ongoing, false, true, 5},
		{"KB vs K", "4k3/8/8/8/8/8/8/2B1K3 w - - 0 1", Ongoing, false, true, -1},
		{"same-colour bishops", "3bk3/8/8/8/8/8/8/2B1K3 w - - 0 1", Ongoing, false, true, -1},
		{"opposite bishops", "2b1k3/8/8/8/8/8/8/2B1K3 w - - 0 1", Ongoing, false, false, -1},
		{"KNN vs K", "4k3/8/8/8/8/8/8/1NN1K3 w - - 0 1", Ongoing, false, false, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := mustParse(t, tt.fen, false)
			if got := p.Status(); got != tt.want {
				t.Errorf("Status() = %v, want %v", got, tt.want)
			}
			if p.InCheck() != tt.check {
				t.Errorf("InCheck() = %v, want %v", p.InCheck(), tt.check)
			}
			if p.InsufficientMaterial() != tt.inMat {
				t.Errorf("InsufficientMaterial() = %v, want %v", p.InsufficientMaterial(), tt.inMat)
			}
			if n := len(p.LegalMoves()); tt.nMoves >= 0 && n != tt.nMoves {
				t.Errorf("%d legal moves, want %d", n, tt.nMoves)
			}
		})
	}
}

func sanOf(t *testing.T, p *Position, uci string) string {
	t.Helper()
	_, m, err := p.Play(uci)
	if err != nil {
		t.Fatalf("Play(%q) on %s: %v", uci, p.FEN(), err)
	}
	return m.SAN
}

func TestSAN(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		fen      string
		chess960 bool
		uci      string
		wantUCI  string
		san      string
	}{
		{"pawn push", StartFEN, false, "e2e4", "e2e4", "e4"},
		{"knight", StartFEN, false, "g1f3", "g1f3", "Nf3"},
		{"castle short", "r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", false, "e1g1", "e1g1", "O-O"},
		{"castle short as king takes rook", "r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", false, "e1h1", "e1g1", "O-O"},
		{"castle long black", "r3k2r/8/8/8/8/8/8/R3K2R b KQkq - 0 1", false, "e8c8", "e8c8", "O-O-O"},
		{"castle with check", "5k2/8/8/8/8/8/8/4K2R w K - 0 1", false, "e1g1", "e1g1", "O-O+"},
		{"promotion", "8/4P3/8/8/8/8/k7/4K3 w - - 0 1", false, "e7e8q", "e7e8q", "e8=Q"},
		{"promotion gives check", "k7/4P3/8/8/8/8/8/4K3 w - - 0 1", false, "e7e8q", "e7e8q", "e8=Q+"},
		{"underpromotion capture", "3r3k/4P3/8/8/8/8/8/4K3 w - - 0 1", false, "e7d8n", "e7d8n", "exd8=N"},
		{"promotion mate", "k7/2P5/1K6/8/8/8/8/8 w - - 0 1", false, "c7c8q", "c7c8q", "c8=Q#"},
		{"file disambiguation", "4k3/8/8/8/8/8/8/1N2KN2 w - - 0 1", false, "b1d2", "b1d2", "Nbd2"},
		{"black knights", "r1bqkb1r/pppppppp/2n2n2/8/8/8/PPPPPPPP/RNBQKBNR b KQkq - 0 1", false, "c6e5", "c6e5", "Ne5"},
		{"rank disambiguation", "k7/8/8/8/8/8/4R3/4RK2 w - - 0 1", false, "e1e2", "", ""},
		{"R1e2", "k7/8/8/8/8/4R3/8/4RK2 w - - 0 1", false, "e1e2", "e1e2", "R1e2"},
		{"square disambiguation", "8/8/6k1/8/Q2Q4/8/8/Q3K3 w - - 0 1", false, "a4d1", "a4d1", "Qa4d1"},
		{"en passant", "rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3", false, "e5f6", "e5f6", "exf6"},
		{"fool's mate", "rnbqkbnr/pppp1ppp/8/4p3/6P1/5P2/PPPPP2P/RNBQKBNR b KQkq - 0 2", false, "d8h4", "d8h4", "Qh4#"},
		{"capture with check", "4k3/8/8/8/8/8/4p3/R3K3 w - - 0 1", false, "e1e2", "e1e2", "Kxe2"},
		// Chess960: king takes rook.
		{"960 start e1h1", "rnbqk2r/pppppppp/8/8/8/8/PPPPPPPP/RNBQK2R w HAha - 0 1", true, "e1h1", "e1h1", "O-O"},
		{"960 king stays", "1r4kr/8/8/8/8/8/8/1R4KR w HBhb - 0 1", true, "g1h1", "g1h1", "O-O"},
		{"960 king on b", "rk5r/8/8/8/8/8/8/RK5R w AHah - 0 1", true, "b1a1", "b1a1", "O-O-O"},
		{"960 rook adjacent long", "rk5r/8/8/8/8/8/8/RK5R w AHah - 0 1", true, "b1h1", "b1h1", "O-O"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := mustParse(t, tt.fen, tt.chess960)
			_, m, err := p.Play(tt.uci)
			if tt.san == "" {
				if err == nil {
					t.Fatalf("Play(%q) = %v, want error", tt.uci, m)
				}
				return
			}
			if err != nil {
				t.Fatalf("Play(%q): %v", tt.uci, err)
			}
			if m.UCI != tt.wantUCI || m.SAN != tt.san {
				t.Errorf("Play(%q) = %+v, want {%s %s}", tt.uci, m, tt.wantUCI, tt.san)
			}
			// LegalMoves agrees with Play.
			if !slices.Contains(p.LegalMoves(), m) {
				t.Errorf("LegalMoves() lacks %+v", m)
			}
		})
	}
}

func TestChess960Castling(t *testing.T) {
	t.Parallel()
	// Standard start in 960 mode after clearing f1 and g1: castling is e1h1.
	p := mustParse(t, "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQK2R w KQkq - 0 1", true)
	moves := p.LegalMoves()
	var ucis []string
	for _, m := range moves {
		ucis = append(ucis, m.UCI)
	}
	if !slices.Contains(ucis, "e1h1") || slices.Contains(ucis, "e1g1") {
		t.Errorf("960 moves %v: want e1h1 and not e1g1", ucis)
	}
	if !slices.IsSorted(ucis) {
		t.Errorf("moves not sorted: %v", ucis)
	}
	n, m, err := p.Play("e1h1")
	if err != nil || m.SAN != "O-O" {
		t.Fatalf("Play(e1h1) = %v, %v", m, err)
	}
	if want := "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQ1RK1 b ha - 1 1"; n.FEN() != want {
		t.Errorf("after O-O: %s, want %s", n.FEN(), want)
	}
	if _, _, err := p.Play("e1g1"); err == nil || !strings.Contains(err.Error(), "king takes rook: e1h1") {
		t.Errorf("960 Play(e1g1) = %v, want a refusal pointing to e1h1", err)
	}
	// Standard mode, same position: e1g1.
	s := mustParse(t, "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQK2R w KQkq - 0 1", false)
	if n, m, err := s.Play("e1g1"); err != nil || m.UCI != "e1g1" || n.FEN() != "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQ1RK1 b kq - 1 1" {
		t.Errorf("standard O-O: %v %v %v", n, m, err)
	}

	tests := []struct {
		name  string
		fen   string
		uci   string // a castling move
		legal bool
		after string
	}{
		// King b1, rook a1 queen side: king goes to c1, rook to d1.
		{"long from b1", "1k6/8/8/8/8/8/8/RK6 w A - 0 1", "b1a1", true, "1k6/8/8/8/8/8/8/2KR4 b - - 1 1"},
		// King g1, rook h1: king stays, rook to f1.
		{"short king stays", "6k1/8/8/8/8/8/8/6KR w H - 0 1", "g1h1", true, "6k1/8/8/8/8/8/8/5RK1 b - - 1 1"},
		// King f1, rook g1: king to g1, rook to f1 (swap).
		{"swap", "k7/8/8/8/8/8/8/5KR1 w G - 0 1", "f1g1", true, "k7/8/8/8/8/8/8/5RK1 b - - 1 1"},
		// Long castling with king on f1, rook on b1: the king passes e1, d1.
		{"long path attacked", "3r2k1/8/8/8/8/8/8/1R3K2 w B - 0 1", "f1b1", false, ""},
		// The destination c1 is covered through b1 once the rook leaves it: the
		// queen on a1 would attack c1 (rook b1 goes to d1).
		{"destination uncovered by the rook", "6k1/8/8/8/8/8/8/qR2K3 w B - 0 1", "e1b1", false, ""},
		// A piece between rook and its destination blocks.
		{"blocked rook path", "6k1/8/8/8/8/8/8/RN2K3 w A - 0 1", "e1a1", false, ""},
		// In check: no castling.
		{"in check", "4r1k1/8/8/8/8/8/8/R3K3 w A - 0 1", "e1a1", false, ""},
		// Black 960 castling.
		{"black long", "1r4k1/8/8/8/8/8/8/6K1 b b - 0 1", "g8b8", true, "2kr4/8/8/8/8/8/8/6K1 w - - 1 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := mustParse(t, tt.fen, true)
			n, m, err := p.Play(tt.uci)
			if !tt.legal {
				if err == nil {
					t.Fatalf("Play(%q) = %+v, want illegal", tt.uci, m)
				}
				return
			}
			if err != nil {
				t.Fatalf("Play(%q): %v", tt.uci, err)
			}
			if !strings.HasPrefix(m.SAN, "O-O") || n.FEN() != tt.after {
				t.Errorf("Play(%q) = %+v -> %s, want castling -> %s", tt.uci, m, n.FEN(), tt.after)
			}
		})
	}
}

func TestPlayErrors(t *testing.T) {
	t.Parallel()
	p := mustParse(t, StartFEN, false)
	tests := []struct {
		uci    string
		code   Code
		reason string
	}{
		{"e2e5", CodeIllegalMove, "e2e5 is not a legal move for white"},
		{"e3e4", CodeIllegalMove, "e3 is empty"},
		{"e7e5", CodeIllegalMove, "the piece on e7 is black's"},
		{"e2", CodeInvalidMove, `"e2" is not a UCI move`},
		{"e2e4x", CodeInvalidMove, `"e2e4x" is not a UCI move`},
		{"i2i4", CodeInvalidMove, "not a UCI move"},
		{"0000", CodeInvalidMove, "not a UCI move"},
	}
	for _, tt := range tests {
		t.Run(tt.uci, func(t *testing.T) {
			t.Parallel()
			_, _, err := p.Play(tt.uci)
			var pe *Error
			if !errors.As(err, &pe) || pe.Code != tt.code || pe.Field != "move" || !strings.Contains(pe.Reason, tt.reason) {
				t.Errorf("Play(%q) error = %#v, want %s containing %q", tt.uci, err, tt.code, tt.reason)
			}
		})
	}
}

func TestLineSAN(t *testing.T) {
	t.Parallel()
	p := mustParse(t, StartFEN, false)
	got, err := p.LineSAN([]string{"e2e4", "e7e5", "g1f3", "b8c6", "f1b5", "g8f6", "e1g1", "f6e4"})
	want := []string{"e4", "e5", "Nf3", "Nc6", "Bb5", "Nf6", "O-O", "Nxe4"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("LineSAN = %v, %v; want %v", got, err, want)
	}
	_, err = p.LineSAN([]string{"e2e4", "e7e5", "e1e2", "e8e7", "e2e3", "e7e5"})
	var pe *Error
	if !errors.As(err, &pe) || pe.Field != "moves" || !strings.HasPrefix(pe.Reason, "move 5: e7e5 is not a legal move") {
		t.Errorf("LineSAN illegal = %v", err)
	}
	if got, err := p.LineSAN(nil); err != nil || len(got) != 0 {
		t.Errorf("LineSAN(nil) = %v, %v", got, err)
	}
	// Fool's mate ends with #.
	got, err = p.LineSAN([]string{"f2f3", "e7e5", "g2g4", "d8h4"})
	if err != nil || got[3] != "Qh4#" {
		t.Errorf("fool's mate: %v %v", got, err)
	}
	// 960 PV with king-takes-rook castling.
	q := mustParse(t, "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQK2R w KQkq - 0 1", true)
	got, err = q.LineSAN([]string{"e2e4", "e7e5", "e1h1"})
	if err != nil || !slices.Equal(got, []string{"e4", "e5", "O-O"}) {
		t.Errorf("960 line: %v %v", got, err)
	}
}

func TestScorePOV(t *testing.T) {
	t.Parallel()
	tests := []struct {
		side Color
		in   int
		want int
	}{
		{White, 35, 35}, {Black, 35, -35}, {White, -3, -3}, {Black, -2, 2}, {Black, 0, 0},
	}
	for _, tt := range tests {
		if got := WhitePOV(tt.side, tt.in); got != tt.want {
			t.Errorf("WhitePOV(%v, %d) = %d, want %d", tt.side, tt.in, got, tt.want)
		}
	}
	w := WDL{W: 700, D: 250, L: 50}
	if got := WDLWhitePOV(White, w); got != w {
		t.Errorf("WDLWhitePOV(white) = %v", got)
	}
	if got := WDLWhitePOV(Black, w); got != (WDL{W: 50, D: 250, L: 700}) {
		t.Errorf("WDLWhitePOV(black) = %v", got)
	}
}

// TestConcurrentUse shares positions between goroutines (run with -race): in
// standard chess notnil fills a move cache lazily, which Position guards.
func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	fens := []string{
		StartFEN,
		"rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3",
		"rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3",
	}
	for _, fen := range fens {
		p := mustParse(t, fen, false)
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				switch g % 4 {
				case 0:
					_ = p.LegalMoves()
				case 1:
					_ = p.Status()
				case 2:
					_ = p.FEN()
				case 3:
					if ms := p.LegalMoves(); len(ms) > 0 {
						if _, _, err := p.Play(ms[0].UCI); err != nil {
							t.Error(err)
						}
						if _, err := p.LineSAN([]string{ms[len(ms)-1].UCI}); err != nil {
							t.Error(err)
						}
					}
				}
			}()
		}
		wg.Wait()
	}
}
