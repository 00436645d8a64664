package position

import (
	"bytes"
	"strings"
	"testing"

	"github.com/notnil/chess"
)

// TestNotnilBinary checks that Parse hands notnil the position its own FEN
// decoder would have made: the same board, side, castling rights, en passant
// square and counters (compared through notnil's own binary encoding), the same
// legal moves in the same SAN, and the same status. Counters too wide for the
// binary form go through the FEN decoder and keep their values.
func TestNotnilBinary(t *testing.T) {
	t.Parallel()
	for _, fen := range []string{
		StartFEN,
		"r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R w KQkq - 0 1",
		"r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R b Qk - 7 42",
		"rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3",
		"rnbqkbnr/pppp1ppp/8/8/3Pp3/8/PPP1PPPP/RNBQKBNR b KQkq d3 0 2",
		"8/2p5/3p4/KP5r/1R3p1k/8/4P1P1/8 w - - 0 1",
		"k7/8/8/8/8/8/8/K7 b - - 255 65535",
		"7k/6Q1/6K1/8/8/8/8/8 b - - 0 1",     // checkmated
		"7k/8/6QK/8/8/8/8/8 b - - 0 1",       // stalemate
		"4k3/8/8/8/8/8/8/4K2R w K - 256 129", // halfmove clock too wide: FEN decoder
		"4k3/8/8/8/8/8/8/R3K3 b Q - 3 65536", // fullmove number too wide
	} {
		checkNotnilDecode(t, fen)
	}
}

// checkNotnilDecode compares the notnil position Parse made for fen (standard
// chess, accepted) with notnil's own decode of Parse's canonical six fields.
func checkNotnilDecode(t *testing.T, fen string) {
	t.Helper()
	p := mustParse(t, fen, false)
	fields := strings.Fields(fen)
	if len(fields) == 4 { // Parse's counters: "0 1", "0 2" with white to move and an en passant square
		fields = append(fields, "0", "1")
		if fields[1] == "w" && fields[3] != "-" {
			fields[5] = "2"
		}
	}
	want := new(chess.Position)
	if err := want.UnmarshalText([]byte(strings.Join(fields, " "))); err != nil {
		t.Fatalf("%s: notnil refuses it: %v", fen, err)
	}
	got := p.std.pos
	if got.HalfMoveClock() != want.HalfMoveClock() || got.Turn() != want.Turn() ||
		got.EnPassantSquare() != want.EnPassantSquare() || got.Board().String() != want.Board().String() {
		t.Fatalf("%s: decoded as %s, notnil's FEN decoder gives %s", fen, got, want)
	}
	for _, side := range []chess.Side{chess.KingSide, chess.QueenSide} {
		for _, c := range []chess.Color{chess.White, chess.Black} {
			if got.CastleRights().CanCastle(c, side) != want.CastleRights().CanCastle(c, side) {
				t.Fatalf("%s: castling %v %v differs: %s against %s", fen, c, side, got.CastleRights(), want.CastleRights())
			}
		}
	}
	if p.halfmove <= 0xff && p.fullmove <= 0xffff {
		gb, _ := got.MarshalBinary()
		wb, _ := want.MarshalBinary()
		if !bytes.Equal(gb, wb) {
			t.Fatalf("%s: binary form\n%x\nnotnil's\n%x", fen, gb, wb)
		}
	}
	if got.Status() != want.Status() {
		t.Fatalf("%s: status %v, notnil's FEN decoder %v", fen, got.Status(), want.Status())
	}
	gm, wm := got.ValidMoves(), want.ValidMoves()
	if len(gm) != len(wm) {
		t.Fatalf("%s: %d legal moves, notnil's FEN decoder %d", fen, len(gm), len(wm))
	}
	for i := range gm {
		g, w := chess.AlgebraicNotation{}.Encode(got, gm[i]), chess.AlgebraicNotation{}.Encode(want, wm[i])
		if g != w {
			t.Fatalf("%s: move %d is %s, notnil's FEN decoder %s", fen, i, g, w)
		}
	}
}
