package position

import (
	"encoding/binary"
	"fmt"
	"strings"
	"sync"

	"github.com/notnil/chess"
)

// Standard chess runs on notnil/chess (see the package comment). This file is
// the bridge: decoding a validated FEN, listing and playing notnil's moves,
// SAN, status, and reading notnil's position back into our board for FEN
// output and error messages.
//
// Squares: notnil's chess.Square numbers a1 = 0 ... h8 = 63 like ours.
//
// Concurrency: notnil's Position caches its move list on the first
// ValidMoves call (an unsynchronised write), and its SAN writer and Status
// read that cache. A *chess.Position reachable from a shared *Position is
// therefore only touched through stdState.legal, which fills the cache once
// under a sync.Once; afterwards every notnil call on it only reads.

// recovered sees every panic that the safety nets around notnil catch. It
// does nothing in production; the tests make it re-panic, so that fuzzing
// reports such an input (to be refused by validation) instead of it being
// turned into an error.
var recovered = func(any) {}

// stdState is the notnil side of a standard-chess Position. Positions copied
// by value share it, which is fine: they describe the same position.
type stdState struct {
	pos   *chess.Position
	once  sync.Once
	moves []move // notnil's legal moves, converted; read-only once filled
}

func newStdState(pos *chess.Position) *stdState { return &stdState{pos: pos} }

// legal returns notnil's legal moves (shared, read-only; do not modify).
func (s *stdState) legal() []move {
	s.once.Do(func() { s.moves = convertMoves(s.pos.ValidMoves(), nil) })
	return s.moves
}

// convertMoves appends notnil's moves ms to out as our moves.
func convertMoves(ms []*chess.Move, out []move) []move {
	if out == nil {
		out = make([]move, 0, len(ms))
	}
	for _, m := range ms {
		out = append(out, convertMove(m))
	}
	return out
}

func convertMove(m *chess.Move) move {
	mv := move{from: int8(m.S1()), to: int8(m.S2()), rook: -1, nn: m}
	switch m.Promo() {
	case chess.Queen:
		mv.promo = queen
	case chess.Rook:
		mv.promo = rook
	case chess.Bishop:
		mv.promo = bishop
	case chess.Knight:
		mv.promo = knight
	}
	switch {
	case m.HasTag(chess.KingSideCastle):
		mv.flags = flagCastle
		mv.rook = mv.from + 3 // e1 -> h1, e8 -> h8
	case m.HasTag(chess.QueenSideCastle):
		mv.flags = flagCastle
		mv.rook = mv.from - 4 // e1 -> a1, e8 -> a8
	case m.HasTag(chess.EnPassant):
		mv.flags = flagCapture | flagEnPassant
	case m.HasTag(chess.Capture):
		mv.flags = flagCapture
	}
	return mv
}

// decodeNotnil has notnil/chess decode a position that Parse has already
// validated, given with its six FEN fields: from notnil's binary form when its
// counters fit it, else from the FEN (notnil reads six fields separated by
// single spaces). notnil's FEN decoder builds its board through
// maps, about 25 µs a position, most of a fresh FEN's parse; the binary form
// is decoded in about one. Either way notnil computes the check state. The
// recover is a last safety net only: validation runs first so that notnil
// never sees input it is known to mishandle.
func decodeNotnil(p *Position, fields []string) (pos *chess.Position, err *Error) {
	defer func() {
		if r := recover(); r != nil {
			recovered(r)
			pos, err = nil, fenErr("FEN could not be read by the chess library")
		}
	}()
	pos = new(chess.Position)
	if bin, ok := notnilBinary(p, fields[2]); ok {
		if e := pos.UnmarshalBinary(bin[:]); e != nil {
			return nil, fenErr("position refused by the chess library: %v", e)
		}
		return pos, nil
	}
	if e := pos.UnmarshalText([]byte(strings.Join(fields, " "))); e != nil {
		return nil, fenErr("FEN refused by the chess library: %v", e)
	}
	return pos, nil
}

// notnilBinary writes the standard-chess position p in the layout of notnil's
// Position.MarshalBinary: twelve bitboards (white king, queen, rook, bishop,
// knight, pawn, then black's), square a1 in the top bit, big-endian; the
// halfmove clock (one byte), the fullmove number (two), the en passant square
// and a flags byte (castling KQkq, black to move, en passant present). ok is
// false when a counter does not fit those widths. castling is the FEN's field,
// already validated (KQkq letters or -). TestNotnilBinary checks the layout
// against notnil's own encoding of the same FEN.
func notnilBinary(p *Position, castling string) (out [101]byte, ok bool) {
	if p.halfmove > 0xff || p.fullmove > 0xffff {
		return out, false
	}
	// Index of each of our piece kinds in notnil's order K Q R B N P.
	order := [...]int{pawn: 5, knight: 4, bishop: 3, rook: 2, queen: 1, king: 0}
	var bbs [12]uint64
	for sq, pc := range p.board {
		if pc == noPiece {
			continue
		}
		i := order[pc.kind()]
		if pc.color() == Black {
			i += 6
		}
		bbs[i] |= 1 << (63 - sq)
	}
	for i, bb := range bbs {
		binary.BigEndian.PutUint64(out[i*8:], bb)
	}
	out[96] = byte(p.halfmove)
	binary.BigEndian.PutUint16(out[97:], uint16(p.fullmove))
	var flags byte
	for i, c := range "KQkq" {
		if strings.ContainsRune(castling, c) {
			flags |= 1 << i
		}
	}
	if p.turn == Black {
		flags |= 1 << 4
	}
	if p.ep >= 0 {
		out[99] = byte(p.ep)
		flags |= 1 << 5
	}
	out[100] = flags
	return out, true
}

// notnilPiece converts a notnil piece to ours.
func notnilPiece(p chess.Piece) piece {
	var k uint8
	switch p.Type() {
	case chess.Pawn:
		k = pawn
	case chess.Knight:
		k = knight
	case chess.Bishop:
		k = bishop
	case chess.Rook:
		k = rook
	case chess.Queen:
		k = queen
	case chess.King:
		k = king
	default:
		return noPiece
	}
	if p.Color() == chess.Black {
		return makePiece(Black, k)
	}
	return makePiece(White, k)
}

// fromNotnil builds our Position from np, the notnil position after m was
// played from prev. Board, side to move, castling rights, en passant square,
// halfmove clock and the check flag all come from notnil; notnil keeps the
// fullmove number private, so it is counted here.
func fromNotnil(np *chess.Position, prev *Position, m move) Position {
	n := Position{ep: -1, castle: [2][2]int8{{-1, -1}, {-1, -1}}, std: newStdState(np)}
	b := np.Board()
	for sq := int8(0); sq < 64; sq++ {
		pc := notnilPiece(b.Piece(chess.Square(sq)))
		n.board[sq] = pc
		if pc.kind() == king {
			n.kings[pc.color()] = sq
		}
	}
	n.turn = White
	if np.Turn() == chess.Black {
		n.turn = Black
	}
	for _, c := range np.CastleRights().String() {
		switch c {
		case 'K':
			n.castle[White][0] = 7
		case 'Q':
			n.castle[White][1] = 0
		case 'k':
			n.castle[Black][0] = 63
		case 'q':
			n.castle[Black][1] = 56
		}
	}
	if sq := np.EnPassantSquare(); sq != chess.NoSquare {
		n.ep = int8(sq)
	}
	n.halfmove = np.HalfMoveClock() // may pass maxCounter: see counterOverflow
	n.fullmove = prev.fullmove
	if prev.turn == Black {
		n.fullmove++
	}
	n.inCheck = m.nn.HasTag(chess.Check)
	return n
}

// notnilSAN writes m, legal in s.pos, in SAN with notnil's encoder. The
// caller has called s.legal(), so the encoder only reads s.pos's move cache.
func notnilSAN(s *stdState, m move) string {
	return chess.AlgebraicNotation{}.Encode(s.pos, m.nn)
}

// notnilPieceAt reads one square of a notnil position (for error messages).
func notnilPieceAt(pos *chess.Position, sq int8) piece {
	return notnilPiece(pos.Board().Piece(chess.Square(sq)))
}

// lineSANStandard is LineSAN for standard chess: it walks notnil positions
// directly (notnil's Position.Update), without building our board per ply.
func (p *Position) lineSANStandard(line []string) (out []string, err error) {
	defer func() {
		if r := recover(); r != nil { // last safety net, see decodeNotnil
			recovered(r)
			out, err = nil, &Error{Code: CodeIllegalMove, Field: "moves", Reason: "the line could not be played"}
		}
	}()
	out = make([]string, 0, len(line))
	cur := p.std.pos
	ms := p.std.legal()
	turn := p.turn
	var buf [256]move
	for i, u := range line {
		if i > 0 {
			ms = convertMoves(cur.ValidMoves(), buf[:0])
		}
		m, e := findUCI(u, ms, false, turn, func(sq int8) piece { return notnilPieceAt(cur, sq) })
		if e != nil {
			e.Field = "moves"
			e.Reason = fmt.Sprintf("move %d: %s", i, e.Reason)
			return nil, e
		}
		out = append(out, chess.AlgebraicNotation{}.Encode(cur, m.nn))
		cur = cur.Update(m.nn)
		turn = turn.Other()
	}
	return out, nil
}
