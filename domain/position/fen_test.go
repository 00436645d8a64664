package position

import (
	"errors"
	"strings"
	"testing"
)

func mustParse(t testing.TB, fen string, chess960 bool) *Position {
	t.Helper()
	p, err := Parse(fen, chess960)
	if err != nil {
		t.Fatalf("Parse(%q, %v): %v", fen, chess960, err)
	}
	return p
}

func TestParseRefuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		fen      string
		chess960 bool
		code     Code
		reason   string // substring the reason must contain
	}{
		// Syntax.
		{"empty", "   ", false, CodeInvalidFEN, "FEN is empty"},
		{"too long", strings.Repeat("8/", 200), false, CodeInvalidFEN, "at most 256"},
		{"3 fields", "8/8/8/8/8/8/8/8 w -", false, CodeInvalidFEN, "FEN has 3 fields"},
		{"5 fields", StartFEN[:len(StartFEN)-2], false, CodeInvalidFEN, "FEN has 5 fields"},
		{"7 fields", StartFEN + " x", false, CodeInvalidFEN, "more than 6 fields"},
		{"7 ranks", "rnbqkbnr/pppppppp/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", false, CodeInvalidFEN, "has 7 ranks"},
		{"9 ranks", "rnbqkbnr/pppppppp/8/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", false, CodeInvalidFEN, "more than 8 ranks"},
		{"short rank", "rnbqkbnr/ppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", false, CodeInvalidFEN, `rank 7 ("ppppppp") describes 7 squares`},
		{"long rank", "rnbqkbnr/pppppppp/9/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", false, CodeInvalidFEN, "rank 6 has invalid character '9'"},
		{"long rank digits", "rnbqkbnr/pppppppp/44p/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", false, CodeInvalidFEN, "rank 6 (\"44p\") describes more than 8 squares"},
		{"bad piece", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNX w KQkq - 0 1", false, CodeInvalidFEN, "rank 1 has invalid character 'X'"},
		// A character outside ASCII is quoted whole, not by its first byte ('â' of '€').
		{"non-ASCII piece", "4k3/8/8/8/8/8/8/4K€3 w - - 0 1", false, CodeInvalidFEN, "rank 1 has invalid character '€' (pieces"},
		{"non-UTF-8 piece", "4k3/8/8/8/8/8/8/4K\xff3 w - - 0 1", false, CodeInvalidFEN, "rank 1 has invalid character byte 0xff (not UTF-8) (pieces"},
		{"cut UTF-8 piece", "4k3/8/8/8/8/8/8/4K\xe2\x823 w - - 0 1", false, CodeInvalidFEN, "rank 1 has invalid character byte 0xe2 (not UTF-8)"},
		{"invisible castling char", "4k3/8/8/8/8/8/8/4K3 w \u200b- - 0 1", false, CodeInvalidFEN, `invalid character '\u200b' (expected`},
		{"non-ASCII castling chars", "4k3/8/8/8/8/8/8/4K3 w €€ - 0 1", false, CodeInvalidFEN, "invalid character '€' (expected"},
		{"non-UTF-8 castling", "4k3/8/8/8/8/8/8/4K3 w K\xe2 - 0 1", false, CodeInvalidFEN, "invalid character byte 0xe2 (not UTF-8) (expected"},
		{"bad side", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR x KQkq - 0 1", false, CodeInvalidFEN, `side to move "x"`},
		{"bad castling char", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkx - 0 1", false, CodeInvalidFEN, "invalid character 'x'"},
		{"shredder without 960", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w HAha - 0 1", false, CodeInvalidFEN, "valid only with chess960"},
		{"castling too long", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkqK - 0 1", false, CodeInvalidFEN, "more than 4 letters"},
		{"bad ep text", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq e9 0 1", false, CodeInvalidFEN, `en passant field "e9"`},
		{"bad halfmove", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - -1 1", false, CodeInvalidFEN, "halfmove clock"},
		{"huge halfmove", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 99999999999999999999 1", false, CodeInvalidFEN, "too large"},
		{"halfmove of 7 digits", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 1000000 1", false, CodeInvalidFEN, `halfmove clock "1000000" is too large (at most 100000)`},
		{"halfmove past the limit behind zeros", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 000100001 1", false, CodeInvalidFEN, `halfmove clock "000100001" is too large (at most 100000)`},
		{"fullmove zero with zeros", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 0000000", false, CodeInvalidFEN, `fullmove number "0000000" must be at least 1`},
		{"fullmove zero", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 0", false, CodeInvalidFEN, "fullmove number \"0\" must be at least 1"},
		// Kings.
		{"no white king", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQQBNR w kq - 0 1", false, CodeIllegalPosition, "white has 0 kings"},
		{"two black kings", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNk w - - 0 1", false, CodeIllegalPosition, "black has 2 kings"},
		// Pawns on the back ranks.
		{"white pawn on rank 8", "rnbqkbnP/pppppppp/8/8/8/8/PPPPPPP1/RNBQKBNR w KQq - 0 1", false, CodeIllegalPosition, "white pawn on h8"},
		{"black pawn on rank 1", "4k3/8/8/8/8/8/8/p3K3 w - - 0 1", false, CodeIllegalPosition, "black pawn on a1"},
		// Piece counts.
		{"9 pawns", "4k3/8/8/8/8/P7/PPPPPPPP/4K3 w - - 0 1", false, CodeIllegalPosition, "white has 9 pawns"},
		{"17 pieces", "4k3/8/8/8/8/QQQQQQQQ/QQQQQQQQ/4K3 w - - 0 1", false, CodeIllegalPosition, "white has 17 pieces"},
		{"too many promotions", "4k3/8/8/8/8/Q7/PPPPPPPP/Q3K3 w - - 0 1", false, CodeIllegalPosition, "8 pawns and 1 promoted pieces"},
		// Checks.
		{"side not to move in check", "4k3/4Q3/8/8/8/8/8/4K3 w - - 0 1", false, CodeIllegalPosition, "black king on e8 is in check, but it is white to move"},
		{"triple check", "4k3/8/8/8/8/3n1n2/8/4K2r w - - 0 1", false, CodeIllegalPosition, "attacked by 3 pieces"},
		// Castling rights.
		{"K without rook", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBN1 w KQkq - 0 1", false, CodeIllegalPosition, `castling right 'K' needs the white king on e1 and a white rook on h1`},
		{"q with moved king", "rnbq1bnr/ppppkppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQq - 0 1", false, CodeIllegalPosition, `castling right 'q' needs the black king on rank 8`},
		{"960 setup without 960", "bqnb1rkr/pp3ppp/3ppn2/2p5/5P2/P2P4/NPP1P1PP/BQ1BNRKR w KQkq - 2 9", false, CodeIllegalPosition, `castling right 'K' needs the white king on e1`},
		{"duplicate right", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KKkq - 0 1", false, CodeIllegalPosition, "two king-side castling rights"},
		{"960 duplicate right", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KHkq - 0 1", true, CodeIllegalPosition, "two king-side castling rights"},
		{"960 no rook on file", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w G - 0 1", true, CodeIllegalPosition, "castling right 'G' needs a white rook on g1"},
		{"960 no outer rook", "rnbqkbn1/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w k - 0 1", true, CodeIllegalPosition, "castling right 'k' needs a black rook on rank 8 on the king side"},
		// A Chess960 game starts mirror-symmetric with each king between its rooks, and a
		// right lives only while its king and rook stand where they started.
		{"960 king on the a-file, by file", "4k3/8/8/8/8/8/8/K6R w H - 0 1", true, CodeIllegalPosition, "castling right 'H' needs the white king on files b to g, between its rooks (a Chess960 king starts there), but it is on a1"},
		{"960 king on the a-file, X-FEN", "4k3/8/8/8/8/8/8/K6R w K - 0 1", true, CodeIllegalPosition, "castling right 'K' needs the white king on files b to g"},
		{"960 king on the h-file", "r6k/8/8/8/8/8/8/4K3 b a - 0 1", true, CodeIllegalPosition, "castling right 'a' needs the black king on files b to g, between its rooks (a Chess960 king starts there), but it is on h8"},
		{"960 kings on two files", "r2k3r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", true, CodeIllegalPosition, `castling field "KQkq" needs the white and black kings on the same file while both sides keep a right (a Chess960 game starts mirror-symmetric), but they are on e1 and d8`},
		{"960 kings on two files, one right each", "r2k4/8/8/8/8/8/8/4K2R w Ka - 0 1", true, CodeIllegalPosition, "needs the white and black kings on the same file"},
		{"960 queen-side rooks on two files", "1r2k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", true, CodeIllegalPosition, `castling field "KQkq" needs the white and black queen-side rooks on the same file (a Chess960 game starts mirror-symmetric), but they are on a1 and b8`},
		{"960 king-side rooks on two files", "r3k1r1/8/8/8/8/8/8/R3K2R w HAga - 0 1", true, CodeIllegalPosition, "needs the white and black king-side rooks on the same file"},
		// En passant.
		{"ep wrong rank", "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq e3 0 2", false, CodeIllegalPosition, "en passant square e3 is impossible with white to move; it must be on rank 6"},
		{"ep without pawn", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR b KQkq e3 0 1", false, CodeIllegalPosition, "needs a white pawn on e4"},
		{"ep pawn missing", "rnbqkbnr/pppp1ppp/8/4P3/8/8/PPPP1PPP/RNBQKBNR w KQkq e6 0 2", false, CodeIllegalPosition, "needs a black pawn on e5"},
		{"ep square occupied", "rnbqkb1r/pppp1ppp/4n3/4p3/8/8/PPPPPPPP/RNBQKBNR w KQkq e6 0 2", false, CodeIllegalPosition, "en passant square e6 must be empty"},
		{"ep origin occupied", "rnb1kbnr/ppppqppp/8/4p3/8/8/PPPPPPPP/RNBQKBNR w KQkq e6 0 2", false, CodeIllegalPosition, "e7, where the black pawn came from, is occupied"},
		// Counters: an en passant square means the last move was a pawn's double step,
		// which set the halfmove clock to 0 (and with White to move was Black's, so
		// move 1 is over).
		{"ep with a running clock", "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 5 3", false, CodeIllegalPosition,
			"halfmove clock 5 is impossible with the en passant square d6: black's last move was then a pawn's double step, which sets the clock to 0"},
		{"ep with a running clock, black to move", "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 1 1", false, CodeIllegalPosition,
			"halfmove clock 1 is impossible with the en passant square e3: white's last move"},
		{"ep with a running clock, chess960", "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w HAha d6 1 3", true, CodeIllegalPosition,
			"halfmove clock 1 is impossible with the en passant square d6"},
		{"ep before black has moved", "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 1", false, CodeIllegalPosition,
			"en passant square d6 is impossible at fullmove number 1 with white to move: black has not moved yet"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse(tt.fen, tt.chess960)
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("Parse(%q) error = %v, want *Error", tt.fen, err)
			}
			if pe.Code != tt.code || pe.Field != "fen" || !strings.Contains(pe.Reason, tt.reason) {
				t.Errorf("Parse(%q) = {%s %s %q}, want code %s, field fen, reason containing %q", tt.fen, pe.Code, pe.Field, pe.Reason, tt.code, tt.reason)
			}
		})
	}
}

func TestParseAccepts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		in         string
		chess960   bool
		fen        string // canonical
		normalized string
	}{
		{"start", StartFEN, false, StartFEN, "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq -"},
		{"four fields and spaces", "  rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR   w KQkq -\n", false, StartFEN, "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq -"},
		{"castling order", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w qkQK - 0 1", false, StartFEN, ""},
		{"start 960 X-FEN", StartFEN, true, "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w HAha - 0 1", ""},
		{"start 960 Shredder", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w HAha - 0 1", true, "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w HAha - 0 1", ""},
		{"960 inner rook by file", "1r2k1r1/8/8/8/8/8/8/RR2K1RR w BGbg - 0 1", true, "1r2k1r1/8/8/8/8/8/8/RR2K1RR w GBgb - 0 1", ""},
		// One side's rights say nothing of the other's king and rooks; opposite sides'
		// rooks need not share a file.
		{"960 kings on two files, one side's rights", "r2k3r/8/8/8/8/8/8/R3K2R w KQ - 0 1", true, "r2k3r/8/8/8/8/8/8/R3K2R w HA - 0 1", ""},
		{"960 opposite sides' rooks", "1r2k2r/8/8/8/8/8/8/R3K2R w Kq - 0 1", true, "1r2k2r/8/8/8/8/8/8/R3K2R w Hb - 0 1", ""},
		{"960 X-FEN outermost", "rr2k1rr/8/8/8/8/8/8/RR2K1RR w KQkq - 0 1", true, "rr2k1rr/8/8/8/8/8/8/RR2K1RR w HAha - 0 1", ""},
		{"ep kept when capturable", "rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3", false, "rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3", ""},
		{"ep dropped when no pawn can take", "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1", false, "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1", "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq -"},
		// The only capturer is pinned along the rank (king a5, rooks h5): dropped.
		{"ep dropped when capture illegal", "8/8/8/K2pP2r/8/8/8/4k3 w - d6 0 2", false, "8/8/8/K2pP2r/8/8/8/4k3 w - - 0 2", ""},
		// The counters at their bounds: an en passant square from Black's first move;
		// a clock past the plies played is let through (a game's FEN with its move
		// number set back to 1).
		{"clock past the plies", "4k3/8/8/8/8/8/8/4K2R w K - 37 1", false, "4k3/8/8/8/8/8/8/4K2R w K - 37 1", ""},
		{"ep after black's first move", "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 2", false, "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 2", ""},
		{"four fields with ep, white to move: move 2", "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6", false, "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 2", ""},
		{"four fields with ep, black to move: move 1", "rnbqkbnr/pppp1ppp/8/8/3Pp3/8/PPP1PPPP/RNBQKBNR b KQkq d3", false, "rnbqkbnr/pppp1ppp/8/8/3Pp3/8/PPP1PPPP/RNBQKBNR b KQkq d3 0 1", ""},
		{"clock of every ply, black to move", "4k3/8/8/8/8/8/8/4K3 b - - 1 1", false, "4k3/8/8/8/8/8/8/4K3 b - - 1 1", ""},
		{"clock of every ply, white to move", "4k3/8/8/8/8/8/8/4K3 w - - 2 2", false, "4k3/8/8/8/8/8/8/4K3 w - - 2 2", ""},
		{"largest clock", "4k3/8/8/8/8/8/8/4K3 w - - 100000 50001", false, "4k3/8/8/8/8/8/8/4K3 w - - 100000 50001", ""},
		// Leading zeros do not count against a counter's length ("0000001" is 1).
		{"counters with leading zeros", "4k3/8/8/8/8/8/8/4K3 w - - 0000001 00000000002", false, "4k3/8/8/8/8/8/8/4K3 w - - 1 2", ""},
		{"largest counters with leading zeros", "4k3/8/8/8/8/8/8/4K3 b - - 0000100000 000100000", false, "4k3/8/8/8/8/8/8/4K3 b - - 100000 100000", ""},
		{"promotion pending", "8/P6k/8/8/8/8/6Kp/8 w - - 0 1", false, "8/P6k/8/8/8/8/6Kp/8 w - - 0 1", ""},
		{"double check", "4k3/8/8/8/8/5n2/8/r3K3 w - - 0 1", false, "4k3/8/8/8/8/5n2/8/r3K3 w - - 0 1", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := mustParse(t, tt.in, tt.chess960)
			if got := p.FEN(); got != tt.fen {
				t.Errorf("FEN() = %q, want %q", got, tt.fen)
			}
			if tt.normalized != "" && p.Normalized() != tt.normalized {
				t.Errorf("Normalized() = %q, want %q", p.Normalized(), tt.normalized)
			}
			// Canonical output parses back to itself.
			if again := mustParse(t, p.FEN(), tt.chess960); again.FEN() != p.FEN() {
				t.Errorf("round trip %q -> %q", p.FEN(), again.FEN())
			}
		})
	}
}

// ParseStored repairs only the counters Parse refuses beside an en passant square
// (a job stored before the rules): the clock to 0, move 1 with White to move to 2.
// What Parse accepts reads the same; every other refusal stays.
func TestParseStored(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		in       string
		chess960 bool
		fen      string // canonical; "" when refused
		reason   string // the refusal's, when refused
	}{
		{"ep at move 1, white to move", "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 1", false,
			"rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 2", ""},
		{"ep at move 1 with a running clock", "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 5 1", false,
			"rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 2", ""},
		{"ep with a running clock", "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 5 3", false,
			"rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 3", ""},
		{"ep with a running clock, black to move", "rnbqkbnr/ppp1pppp/8/8/3pP3/8/PPPP1PPP/RNBQKBNR b KQkq e3 3 1", false,
			"rnbqkbnr/ppp1pppp/8/8/3pP3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1", ""},
		{"ep with a large clock", "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 100000 7", false,
			"rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 7", ""},
		{"ep with a running clock, chess960", "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w HAha d6 1 1", true,
			"rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w HAha d6 0 2", ""},
		// The square no pawn can take is dropped from the FEN as Parse drops it.
		{"ep no pawn can take, running clock", "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 2 1", false,
			"rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1", ""},
		// What Parse accepts reads the same.
		{"start", StartFEN, false, StartFEN, ""},
		{"ep after black's first move", "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 2", false,
			"rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 2", ""},
		{"clock past the plies without ep", "4k3/8/8/8/8/8/8/4K2R w K - 37 1", false, "4k3/8/8/8/8/8/8/4K2R w K - 37 1", ""},
		{"four fields with ep", "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6", false,
			"rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 2", ""},
		// Every other refusal stays, counters beside an en passant square or not.
		{"ep without its pawn", "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq d6 5 1", false, "", "needs a black pawn on d5"},
		{"ep on the wrong rank", "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq e3 4 1", false, "", "en passant square e3 is impossible with white to move"},
		{"unreadable clock beside ep", "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 x 1", false, "", `halfmove clock "x" must be a whole number`},
		{"clock too large beside ep", "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 100001 3", false, "", "too large"},
		{"fullmove 0 beside ep", "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 0", false, "", "must be at least 1"},
		{"side not to move in check", "4k3/4Q3/8/8/8/8/8/4K3 w - - 3 1", false, "", "is in check"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := ParseStored(tt.in, tt.chess960)
			if tt.fen == "" {
				var pe *Error
				if !errors.As(err, &pe) || pe.Field != "fen" || !strings.Contains(pe.Reason, tt.reason) {
					t.Fatalf("ParseStored(%q) = %v, want a refusal containing %q", tt.in, err, tt.reason)
				}
				if _, perr := Parse(tt.in, tt.chess960); perr == nil || perr.Error() != err.Error() {
					t.Errorf("Parse(%q) = %v, ParseStored %v: the refusals differ", tt.in, perr, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseStored(%q): %v", tt.in, err)
			}
			if got := p.FEN(); got != tt.fen {
				t.Errorf("FEN() = %q, want %q", got, tt.fen)
			}
			// The repaired FEN is one Parse accepts, as itself.
			if again := mustParse(t, p.FEN(), tt.chess960); again.FEN() != p.FEN() {
				t.Errorf("round trip %q -> %q", p.FEN(), again.FEN())
			}
		})
	}
}

func TestNormalizedEqualForSamePosition(t *testing.T) {
	t.Parallel()
	pairs := []struct {
		a, b     string
		chess960 bool
	}{
		{StartFEN, "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 5 40", false},
		{"rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1", "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq -", false},
		{StartFEN, "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w AHah - 0 1", true},
	}
	for _, pp := range pairs {
		a, b := mustParse(t, pp.a, pp.chess960), mustParse(t, pp.b, pp.chess960)
		if a.Normalized() != b.Normalized() {
			t.Errorf("Normalized differs: %q vs %q", a.Normalized(), b.Normalized())
		}
	}
	// With castling rights the modes differ (the engine's output does too);
	// without, they agree.
	if mustParse(t, StartFEN, true).Normalized() == mustParse(t, StartFEN, false).Normalized() {
		t.Error("standard and 960 start positions normalise equal")
	}
	noRights := "4k3/8/8/8/8/8/8/4K3 w - - 0 1"
	if mustParse(t, noRights, true).Normalized() != mustParse(t, noRights, false).Normalized() {
		t.Error("position without castling rights normalises differently per mode")
	}
}

func TestAccessors(t *testing.T) {
	t.Parallel()
	p := mustParse(t, "4k3/8/8/8/8/8/4r3/4K3 w - - 12 40", false)
	if p.SideToMove() != White || !p.InCheck() || p.HalfmoveClock() != 12 || p.FullmoveNumber() != 40 || p.Chess960() {
		t.Errorf("accessors: side %v check %v half %d full %d 960 %v", p.SideToMove(), p.InCheck(), p.HalfmoveClock(), p.FullmoveNumber(), p.Chess960())
	}
	if White.String() != "white" || Black.String() != "black" || White.Other() != Black {
		t.Error("Color")
	}
}

// A move never takes a counter past 100000, the most a FEN holds: Play refuses it
// (FindMove still finds the move) and ParsePGN refuses the game, naming its FEN tag,
// so that every position made parses back. Up to the limit the real numbers are
// carried.
func TestCountersStopAtTheLimit(t *testing.T) {
	t.Parallel()
	plays := []struct {
		name, fen string
		chess960  bool
		move      string
		next      string // the position after, when the move can be played
		reason    string // Play's refusal, otherwise
	}{
		{"last fullmove number", "4k3/8/8/8/8/8/8/4K3 w - - 99998 100000", false, "e1d2", "4k3/8/8/8/8/8/3K4/8 b - - 99999 100000", ""},
		{"fullmove number past the limit", "4k3/8/8/8/8/8/8/4K3 b - - 99999 100000", false, "e8d7", "",
			"e8d7 cannot be played here: it would take the fullmove number to 100001, past 100000, the most a FEN may hold"},
		{"last halfmove clock", "4k3/8/8/8/8/8/8/4K3 b - - 99999 50000", false, "e8d7", "8/3k4/8/8/8/8/8/4K3 w - - 100000 50001", ""},
		{"halfmove clock past the limit", "4k3/8/8/8/8/8/8/4K3 w - - 100000 50001", false, "e1d2", "",
			"e1d2 cannot be played here: it would take the halfmove clock to 100001"},
		{"a pawn move resets the clock at the limit", "4k3/8/8/8/8/8/4P3/4K3 w - - 100000 50001", false, "e2e3", "4k3/8/8/8/8/4P3/8/4K3 b - - 0 50001", ""},
		{"chess960, fullmove number past the limit", "4k3/8/8/8/8/8/8/4K3 b - - 0 100000", true, "e8d7", "", "it would take the fullmove number to 100001"},
		{"chess960, halfmove clock past the limit", "4k3/8/8/8/8/8/8/4K3 w - - 100000 50001", true, "e1d2", "", "it would take the halfmove clock to 100001"},
	}
	for _, tc := range plays {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := mustParse(t, tc.fen, tc.chess960)
			found, err := p.FindMove(tc.move)
			if err != nil || found.UCI != tc.move {
				t.Fatalf("FindMove(%s) = %+v, %v", tc.move, found, err)
			}
			n, played, err := p.Play(tc.move)
			if tc.reason != "" {
				var pe *Error
				if !errors.As(err, &pe) || pe.Field != "move" || !strings.Contains(pe.Reason, tc.reason) || n != nil {
					t.Fatalf("Play(%s) = %v, %v; want a refusal saying %q", tc.move, n, err, tc.reason)
				}
				return
			}
			if err != nil || played != found || n.FEN() != tc.next {
				t.Fatalf("Play(%s) = %v %+v, %v; want %s (%+v)", tc.move, n, played, err, tc.next, found)
			}
			mustParse(t, n.FEN(), tc.chess960) // parses back
		})
	}

	games := []struct {
		name, pgn string
		maxPlies  int
		end       string // the last position, when the game is read
		reason    string // the refusal, otherwise
	}{
		{"game up to the limit", `[FEN "3k4/8/8/8/8/8/3K4/8 w - - 99998 100000"] 100000. Ke2 *`, 10, "3k4/8/8/8/8/8/4K3/8 b - - 99999 100000", ""},
		{"game past the fullmove limit", `[FEN "3k4/8/8/8/8/8/3K4/8 b - - 99999 100000"] 100000... Kd7 100001. Ke2 *`, 10, "",
			"FEN tag: its counters leave no room for the game: ply 1 (100000... Kd7) would take the fullmove number to 100001, past 100000, the most a FEN may hold"},
		{"game past the halfmove limit, later in the game", `[FEN "3k4/8/8/8/8/8/3K4/8 b - - 99999 50000"] 50000... Kc7 50001. Ke2 *`, 10, "",
			"FEN tag: its counters leave no room for the game: ply 2 (50001. Ke2) would take the halfmove clock to 100001"},
		{"chess960 game past the fullmove limit", `[Variant "Chess960"] [FEN "3k4/8/8/8/8/8/3K4/8 b - - 0 100000"] 100000... Kd7 *`, 10, "",
			"ply 1 (100000... Kd7) would take the fullmove number to 100001"},
		{"game past the limit after the plies read: not checked", `[FEN "3k4/8/8/8/8/8/3K4/8 w - - 99998 100000"] 100000. Ke2 Kd7 100001. Ke3 *`, 1, "3k4/8/8/8/8/8/4K3/8 b - - 99999 100000", ""},
	}
	for _, tc := range games {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g, err := ParsePGN(tc.pgn, false, tc.maxPlies)
			if tc.reason != "" {
				var pe *Error
				if !errors.As(err, &pe) || pe.Code != CodeInvalidPGN || pe.Field != "pgn" || !strings.Contains(pe.Reason, tc.reason) {
					t.Fatalf("ParsePGN = %v; want a refusal saying %q", err, tc.reason)
				}
				return
			}
			if err != nil || g.End.FEN() != tc.end {
				t.Fatalf("ParsePGN = %v; end %v, want %s", err, g, tc.end)
			}
			for _, p := range g.Plies {
				mustParse(t, p.FEN, false)
			}
			mustParse(t, g.End.FEN(), false)
		})
	}
}
