// Package position holds the service's chess rules: FEN parsing and
// validation, legal moves in standard chess and Chess960, UCI and SAN
// notation, engine PVs to SAN, PGN main lines, and the White-point-of-view
// conversion of engine scores. It is pure: no I/O, no engine.
//
// Positions are immutable values; every method is safe for concurrent use.
//
// # Which code does what
//
// The architecture fixes notnil/chess as the chess-rules library, so in
// standard chess (chess960 false) the rules run on it:
//   - Parse has notnil decode the position after our own validation has
//     passed (chess.Position.UnmarshalBinary from our board, which also
//     computes the check state; UnmarshalText for counters too wide for that
//     form), checked against notnil's own FEN decoder by TestNotnilBinary and
//     FuzzParse;
//   - legal moves (Position.ValidMoves), playing a move (Position.Update),
//     checkmate and stalemate (Position.Status), the check flag of a played
//     move, and SAN (AlgebraicNotation.Encode) in LegalMoves, Play, LineSAN
//     and ParsePGN come from notnil.
//
// Our own code keeps what notnil does not do or does too weakly:
//   - FEN syntax and validation (king count, side not to move in check, at
//     most two checkers, pawns on rank 1/8, piece counts, castling rights and
//     en passant square against the board, the counters against the side to
//     move and the en passant square), with messages naming the fault.
//     notnil accepts most of these positions and then misbehaves (it calls
//     an empty board stalemate, lets a king be captured, castles with a rook
//     it conjures or from an empty e1); it only ever sees validated input. InCheck of a parsed position is that validation's
//     attack test, since notnil exposes no in-check accessor; after a move it
//     is notnil's Check tag.
//   - Canonical FEN output (KQkq, en passant square only when a legal en
//     passant capture exists, asked of notnil's move list), and
//     InsufficientMaterial (notnil's test is private to its Game type).
//   - UCI text: matched against notnil's move list by squares rather than
//     with UCINotation.Decode, which formats the whole position into an error
//     value on every call (microseconds per move on the eval path); castling
//     stays e1g1, with king-takes-rook e1h1 also accepted.
//   - Reading PGN: the scanner, tags, limits, and resolving SAN tokens
//     leniently (0-0, a8Q, superfluous x) with precise errors (ambiguous,
//     promotion missing, by ply); the tokens are resolved against notnil's
//     legal moves and written back in notnil's SAN. notnil's PGN reader and
//     AlgebraicNotation.Decode are strict, slow (they encode every legal move
//     per token) and give no usable error.
//
// Chess960 (chess960 true) runs entirely on our own move generator, SAN
// writer and move application (movegen.go, san.go): notnil/chess has no
// Chess960 support. It cannot read Shredder-FEN or X-FEN castling rights for
// rooks off the corners, only generates castling with the king on e1/e8 and
// rooks on a/h, and writes castling as e1g1 rather than king-takes-rook. The
// standard-chess oracle test checks the own generator against notnil on
// every position it visits, and the Chess960 perft suites check it against
// published counts.
//
// Canonical FEN (FEN, Normalized): castling as KQkq in standard chess and as
// Shredder-FEN rook files (HAha) in Chess960, the way Stockfish prints them;
// the en passant square is written only when a legal en passant capture
// exists (Stockfish 17 drops it when no pawn attacks it; we also drop it when
// the only capture is illegal, e.g. a pinned pawn), so two FENs of the same
// position give the same Normalized key. Input en passant squares are still validated
// strictly (rank, pawn, empty squares) before being dropped.
package position

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/notnil/chess"
)

// Position is a validated chess position. The zero value is not usable; get
// one from Parse, Play or ParsePGN.
type Position struct {
	board    [64]piece
	castle   [2][2]int8 // castling rook square per [colour][0 king side, 1 queen side], -1 none
	kings    [2]int8
	ep       int8 // en passant target as read or made, -1 none
	turn     Color
	chess960 bool
	halfmove int
	fullmove int
	inCheck  bool      // the side to move is in check
	std      *stdState // standard chess: notnil's position; nil in Chess960
}

// Move is one legal move in UCI (as the engine prints it) and SAN.
type Move struct {
	UCI string
	SAN string
}

// Status of a position for the side to move.
type Status uint8

const (
	Ongoing Status = iota
	Checkmate
	Stalemate
)

func (s Status) String() string {
	switch s {
	case Checkmate:
		return "checkmate"
	case Stalemate:
		return "stalemate"
	}
	return "ongoing"
}

// FEN returns the canonical FEN with counters (see the package comment).
func (p *Position) FEN() string {
	var buf [96]byte
	return string(p.appendFEN(buf[:0], true))
}

// Normalized returns the canonical FEN without the halfmove clock and fullmove
// number: equal for two FENs of the same position, for an evaluation cache key.
// It differs between the modes exactly when castling rights exist (KQkq vs
// HAha), which is when the engine's output differs.
func (p *Position) Normalized() string {
	var buf [96]byte
	return string(p.appendFEN(buf[:0], false))
}

// Chess960 reports the mode the position was parsed in.
func (p *Position) Chess960() bool { return p.chess960 }

// SideToMove is the colour to move.
func (p *Position) SideToMove() Color { return p.turn }

// InCheck reports whether the side to move is in check.
func (p *Position) InCheck() bool { return p.inCheck }

// HalfmoveClock is the number of plies since the last capture or pawn move
// (100 or more: a fifty-move draw can be claimed).
func (p *Position) HalfmoveClock() int { return p.halfmove }

// FullmoveNumber is the FEN's move number, starting at 1, increased after Black moves.
func (p *Position) FullmoveNumber() int { return p.fullmove }

// Status is Checkmate or Stalemate when the side to move has no legal move,
// else Ongoing.
func (p *Position) Status() Status {
	if p.std != nil {
		p.std.legal() // fill notnil's move cache once: Status then only reads it
		switch p.std.pos.Status() {
		case chess.Checkmate:
			return Checkmate
		case chess.Stalemate:
			return Stalemate
		}
		return Ongoing
	}
	if p.hasLegalMove() {
		return Ongoing
	}
	if p.inCheck {
		return Checkmate
	}
	return Stalemate
}

// InsufficientMaterial reports a dead draw by material: king against king with
// at most one minor piece, or only same-coloured bishops besides the kings.
func (p *Position) InsufficientMaterial() bool {
	minors, knights := 0, 0
	bishopColours := [2]bool{}
	for sq := int8(0); sq < 64; sq++ {
		switch p.board[sq].kind() {
		case pawn, rook, queen:
			return false
		case knight:
			minors++
			knights++
		case bishop:
			minors++
			bishopColours[(fileOf(sq)+rankOf(sq))&1] = true
		}
	}
	if minors <= 1 {
		return true
	}
	return knights == 0 && !(bishopColours[0] && bishopColours[1])
}

// LegalMoveCount is how many legal moves the side to move has (LegalMoves without
// writing them).
func (p *Position) LegalMoveCount() int {
	var buf [256]move
	return len(p.legalMoves(buf[:0]))
}

// LegalMoves lists every legal move, sorted by UCI text.
func (p *Position) LegalMoves() []Move {
	var buf [256]move
	ms := p.legalMoves(buf[:0])
	out := make([]Move, len(ms))
	for i, m := range ms {
		out[i] = Move{UCI: m.uci(p.chess960), SAN: p.sanOf(m, ms)}
	}
	slices.SortFunc(out, func(a, b Move) int { return strings.Compare(a.UCI, b.UCI) })
	return out
}

// Play applies one legal move given in UCI. In standard chess castling is
// e1g1, and king-takes-rook (e1h1) is accepted as well; in Chess960 castling
// is king-takes-rook only. The error (Field "move") names the move; a legal move
// that would take a counter past the most a FEN may hold (100000) is refused too,
// so that next's FEN parses back.
func (p *Position) Play(uci string) (next *Position, played Move, err error) {
	defer func() {
		if r := recover(); r != nil { // last safety net around notnil; input is validated first
			recovered(r)
			next, played, err = nil, Move{}, &Error{Code: CodeIllegalMove, Field: "move", Reason: fmt.Sprintf("%s could not be played", clip(uci))}
		}
	}()
	var buf [256]move
	ms := p.legalMoves(buf[:0])
	m, e := p.findUCI(uci, ms)
	if e != nil {
		e.Field = "move"
		return nil, Move{}, e
	}
	n := p.after(m)
	if over := n.counterOverflow(); over != "" {
		return nil, Move{}, &Error{Code: CodeIllegalMove, Field: "move",
			Reason: fmt.Sprintf("%s cannot be played here: it would take %s, past %d, the most a FEN may hold", m.uci(p.chess960), over, maxCounter)}
	}
	return &n, Move{UCI: m.uci(p.chess960), SAN: p.sanOf(m, ms)}, nil
}

// FindMove is the legal move uci names, read as Play reads it, in canonical UCI and
// SAN, without playing it (so also where Play refuses it for the counters). The
// error (Field "move") names the move.
func (p *Position) FindMove(uci string) (found Move, err error) {
	defer func() {
		if r := recover(); r != nil { // last safety net around notnil; input is validated first
			recovered(r)
			found, err = Move{}, &Error{Code: CodeIllegalMove, Field: "move", Reason: fmt.Sprintf("%s could not be read", clip(uci))}
		}
	}()
	var buf [256]move
	ms := p.legalMoves(buf[:0])
	m, e := p.findUCI(uci, ms)
	if e != nil {
		e.Field = "move"
		return Move{}, e
	}
	return Move{UCI: m.uci(p.chess960), SAN: p.sanOf(m, ms)}, nil
}

// LineSAN converts a line of UCI moves played from p (an engine PV) to SAN.
// It stops at the first move that is unreadable or illegal with an *Error
// (Field "moves") naming its index (0-based) and text.
func (p *Position) LineSAN(line []string) ([]string, error) {
	if p.std != nil {
		return p.lineSANStandard(line)
	}
	out := make([]string, 0, len(line))
	cur := *p
	var buf [256]move
	for i, u := range line {
		ms := cur.legalMoves(buf[:0])
		m, err := cur.findUCI(u, ms)
		if err != nil {
			err.Field = "moves"
			err.Reason = fmt.Sprintf("move %d: %s", i, err.Reason)
			return nil, err
		}
		out = append(out, cur.san(m, ms))
		cur = cur.after(m)
	}
	return out, nil
}

// legalMoves lists the legal moves of the side to move: notnil's in standard
// chess (a shared slice: read only, buf unused), our generator's in Chess960
// (appended to buf).
func (p *Position) legalMoves(buf []move) []move {
	if p.std != nil {
		return p.std.legal()
	}
	return p.ownLegalMoves(buf)
}

// sanOf writes m, one of p's legal moves ms, in SAN: notnil's encoder in
// standard chess, ours in Chess960.
func (p *Position) sanOf(m move, ms []move) string {
	if p.std != nil {
		return notnilSAN(p.std, m)
	}
	return p.san(m, ms)
}

// after returns the position after m, one of p's legal moves: notnil's
// Position.Update in standard chess, our apply in Chess960.
func (p *Position) after(m move) Position {
	if p.std != nil {
		return fromNotnil(p.std.pos.Update(m.nn), p, m)
	}
	n := p.apply(m)
	n.inCheck = n.checkersCount() > 0
	return n
}

// findUCI matches UCI text against the legal moves ms of p.
func (p *Position) findUCI(s string, ms []move) (move, *Error) {
	return findUCI(s, ms, p.chess960, p.turn, func(sq int8) piece { return p.board[sq] })
}

// findUCI matches UCI text against the legal moves ms of a position with
// turn to move; pieceAt reads its board for the error message.
func findUCI(s string, ms []move, chess960 bool, turn Color, pieceAt func(int8) piece) (move, *Error) {
	if len(s) < 4 || len(s) > 5 {
		return move{}, &Error{Code: CodeInvalidMove, Reason: fmt.Sprintf("%q is not a UCI move (like e2e4 or e7e8q)", clip(s))}
	}
	from, ok1 := parseSquare(s[:2])
	to, ok2 := parseSquare(s[2:4])
	promo := noKind
	if len(s) == 5 {
		switch s[4] {
		case 'q', 'Q':
			promo = queen
		case 'r', 'R':
			promo = rook
		case 'b', 'B':
			promo = bishop
		case 'n', 'N':
			promo = knight
		default:
			ok1 = false
		}
	}
	if !ok1 || !ok2 {
		return move{}, &Error{Code: CodeInvalidMove, Reason: fmt.Sprintf("%q is not a UCI move (like e2e4 or e7e8q)", s)}
	}
	for _, m := range ms {
		if m.from != from || m.promo != promo {
			continue
		}
		if m.isCastle() {
			// Chess960: king takes rook only. Standard: e1g1, or e1h1.
			if to == m.rook || (!chess960 && to == m.to) {
				return m, nil
			}
			continue
		}
		if m.to == to {
			return m, nil
		}
	}
	reason := fmt.Sprintf("%s is not a legal move for %s in this position", s, turn)
	for _, m := range ms {
		if chess960 && m.isCastle() && m.from == from && m.to == to {
			reason += fmt.Sprintf(" (in Chess960 castling is written king takes rook: %s)", m.uci(true))
		}
	}
	if pc := pieceAt(from); pc == noPiece {
		reason = fmt.Sprintf("%s is not a legal move: %s is empty", s, s[:2])
	} else if pc.color() != turn {
		reason = fmt.Sprintf("%s is not a legal move: the piece on %s is %s's, and %s is to move", s, s[:2], pc.color(), turn)
	}
	return move{}, &Error{Code: CodeIllegalMove, Reason: reason}
}

// clip shortens text quoted back to a client, at a character's start: cutting
// inside one ('€' is 3 bytes) left a broken character in the message.
func clip(s string) string {
	if len(s) <= 16 {
		return s
	}
	i := 16
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "..."
}
