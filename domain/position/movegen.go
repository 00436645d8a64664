package position

// Our own move generator. Since standard chess runs on notnil/chess, this
// generates moves only in Chess960 (see the package comment for why notnil
// cannot); the attack test in board.go also serves FEN validation in both
// modes.

import "github.com/notnil/chess"

// move flags.
const (
	flagCapture uint8 = 1 << iota
	flagEnPassant
	flagDouble
	flagCastle
)

// move is the internal move. For castling, to is the king's destination and
// rook the castling rook's origin; UCI text depends on the mode (see uci).
// In standard chess nn is the notnil move it was converted from (see
// convertMove) and flagDouble is not set.
type move struct {
	from, to int8
	rook     int8
	promo    uint8 // kind, or noKind
	flags    uint8
	nn       *chess.Move
}

func (m move) isCastle() bool { return m.flags&flagCastle != 0 }

// castleSide of a castling move: 0 king side (g-file), 1 queen side (c-file).
func (m move) castleSide() int {
	if fileOf(m.to) == 6 {
		return 0
	}
	return 1
}

// uci writes the move as the engine does: e2e4, e7e8q, e1g1 (standard castling)
// or e1h1 (Chess960 castling, king takes rook).
func (m move) uci(chess960 bool) string {
	to := m.to
	if m.isCastle() && chess960 {
		to = m.rook
	}
	b := []byte{'a' + byte(fileOf(m.from)), '1' + byte(rankOf(m.from)), 'a' + byte(fileOf(to)), '1' + byte(rankOf(to))}
	if m.promo != noKind {
		b = append(b, "  nbrq"[m.promo])
	}
	return string(b)
}

var promoKinds = [4]uint8{queen, rook, bishop, knight}

// pseudoMoves appends every pseudo-legal move of the side to move (castling is
// appended fully checked for empty and unattacked squares; the king's
// destination is checked with all other moves by legal).
func (p *Position) pseudoMoves(out []move) []move {
	us := p.turn
	them := us.Other()
	b := &p.board
	for sq := int8(0); sq < 64; sq++ {
		pc := b[sq]
		if pc == noPiece || pc.color() != us {
			continue
		}
		switch pc.kind() {
		case pawn:
			out = p.pawnMoves(out, sq)
		case knight:
			for _, t := range knightTargets[sq] {
				out = addStep(out, b, sq, t, them)
			}
		case king:
			for _, t := range kingTargets[sq] {
				out = addStep(out, b, sq, t, them)
			}
		default:
			d0, d1 := 0, 8
			if pc.kind() == rook {
				d1 = 4
			} else if pc.kind() == bishop {
				d0 = 4
			}
			for d := d0; d < d1; d++ {
				for _, t := range rays[sq][d] {
					q := b[t]
					if q == noPiece {
						out = append(out, move{from: sq, to: t, rook: -1})
						continue
					}
					if q.color() == them {
						out = append(out, move{from: sq, to: t, rook: -1, flags: flagCapture})
					}
					break
				}
			}
		}
	}
	return p.castleMoves(out)
}

func addStep(out []move, b *[64]piece, from, to int8, them Color) []move {
	q := b[to]
	if q == noPiece {
		return append(out, move{from: from, to: to, rook: -1})
	}
	if q.color() == them {
		return append(out, move{from: from, to: to, rook: -1, flags: flagCapture})
	}
	return out
}

func (p *Position) pawnMoves(out []move, sq int8) []move {
	us := p.turn
	b := &p.board
	fwd, startRank, lastRank := int8(8), int8(1), int8(7)
	if us == Black {
		fwd, startRank, lastRank = -8, 6, 0
	}
	add := func(to int8, flags uint8) {
		if rankOf(to) == lastRank {
			for _, k := range promoKinds {
				out = append(out, move{from: sq, to: to, rook: -1, promo: k, flags: flags})
			}
			return
		}
		out = append(out, move{from: sq, to: to, rook: -1, flags: flags})
	}
	one := sq + fwd
	if one < 0 || one > 63 {
		return out // pawns never stand on the last rank after validation
	}
	if b[one] == noPiece {
		add(one, 0)
		if two := one + fwd; rankOf(sq) == startRank && b[two] == noPiece {
			out = append(out, move{from: sq, to: two, rook: -1, flags: flagDouble})
		}
	}
	f := fileOf(sq)
	for _, df := range [2]int8{-1, 1} {
		if f+df < 0 || f+df > 7 {
			continue
		}
		to := one + df
		if q := b[to]; q != noPiece && q.color() != us {
			add(to, flagCapture)
		} else if to == p.ep && q == noPiece {
			out = append(out, move{from: sq, to: to, rook: -1, flags: flagCapture | flagEnPassant})
		}
	}
	return out
}

// castleMoves appends the castling moves whose squares are empty and whose
// king origin and path are not attacked. Works for standard chess and Chess960
// alike: the king ends on g/c, the rook on f/d of the home rank.
func (p *Position) castleMoves(out []move) []move {
	us := p.turn
	k := p.kings[us]
	for side := 0; side < 2; side++ {
		r := p.castle[us][side]
		if r < 0 {
			continue
		}
		home := backRank(us)
		kd, rd := home+6, home+5
		if side == 1 {
			kd, rd = home+2, home+3
		}
		if !p.spanEmpty(k, kd, k, r) || !p.spanEmpty(r, rd, k, r) {
			continue
		}
		if p.checkersCount() > 0 {
			return out
		}
		step := int8(1)
		if kd < k {
			step = -1
		}
		safe := true
		for s := k + step; s != kd && k != kd; s += step {
			if attacked(&p.board, s, us.Other()) {
				safe = false
				break
			}
		}
		if safe {
			out = append(out, move{from: k, to: kd, rook: r, flags: flagCastle})
		}
	}
	return out
}

// spanEmpty reports whether every square from a to b inclusive is empty, the
// castling king and rook (squares k and r) excepted.
func (p *Position) spanEmpty(a, b, k, r int8) bool {
	if a > b {
		a, b = b, a
	}
	for s := a; s <= b; s++ {
		if s != k && s != r && p.board[s] != noPiece {
			return false
		}
	}
	return true
}

// checkersCount is the number of enemy pieces attacking the side to move's king.
func (p *Position) checkersCount() int {
	return attackers(&p.board, p.kings[p.turn], p.turn.Other(), 3)
}

// apply returns the position after m, which must be pseudo-legal.
func (p *Position) apply(m move) Position {
	n := *p
	n.std = nil // Chess960 only; standard chess plays through notnil (after)
	us := p.turn
	b := &n.board
	pc := b[m.from]
	n.ep = -1
	n.halfmove++ // may pass maxCounter: see counterOverflow
	if m.isCastle() {
		home := backRank(us)
		kd, rd := home+6, home+5
		if m.castleSide() == 1 {
			kd, rd = home+2, home+3
		}
		b[m.from], b[m.rook] = noPiece, noPiece
		b[kd], b[rd] = makePiece(us, king), makePiece(us, rook)
		n.kings[us] = kd
		n.castle[us] = [2]int8{-1, -1}
	} else {
		if m.flags&flagCapture != 0 || pc.kind() == pawn {
			n.halfmove = 0
		}
		b[m.to], b[m.from] = pc, noPiece
		switch {
		case m.flags&flagEnPassant != 0:
			b[m.to-8+16*int8(us)] = noPiece
		case m.promo != noKind:
			b[m.to] = makePiece(us, m.promo)
		case m.flags&flagDouble != 0:
			n.ep = (m.from + m.to) / 2
		}
		if pc.kind() == king {
			n.kings[us] = m.to
			n.castle[us] = [2]int8{-1, -1}
		}
		for c := 0; c < 2; c++ {
			for s := 0; s < 2; s++ {
				if r := n.castle[c][s]; r == m.from || r == m.to {
					n.castle[c][s] = -1
				}
			}
		}
	}
	if us == Black {
		n.fullmove++
	}
	n.turn = us.Other()
	return n
}

// legal reports whether pseudo-legal m leaves the mover's king safe.
func (p *Position) legal(m move) bool {
	n := p.apply(m)
	return !attacked(&n.board, n.kings[p.turn], n.turn)
}

// ownLegalMoves appends the legal moves of the side to move (Chess960).
func (p *Position) ownLegalMoves(out []move) []move {
	start := len(out)
	out = p.pseudoMoves(out)
	keep := out[:start]
	for _, m := range out[start:] {
		if p.legal(m) {
			keep = append(keep, m)
		}
	}
	return keep
}

// hasLegalMove stops at the first legal move.
func (p *Position) hasLegalMove() bool {
	var buf [256]move
	for _, m := range p.pseudoMoves(buf[:0]) {
		if p.legal(m) {
			return true
		}
	}
	return false
}

// effectiveEP is the en passant square if a legal en passant capture exists,
// else -1 (see Normalized). Legality is notnil's in standard chess.
func (p *Position) effectiveEP() int8 {
	if p.ep < 0 {
		return -1
	}
	us := p.turn
	from := p.ep - 8
	if us == Black {
		from = p.ep + 8
	}
	f := fileOf(p.ep)
	for _, df := range [2]int8{-1, 1} {
		if f+df < 0 || f+df > 7 {
			continue
		}
		s := from + df
		if p.board[s] != makePiece(us, pawn) {
			continue // no pawn beside the one that advanced: no capture to ask about
		}
		if p.std != nil {
			for _, m := range p.std.legal() {
				if m.flags&flagEnPassant != 0 {
					return p.ep
				}
			}
			return -1
		}
		if p.legal(move{from: s, to: p.ep, rook: -1, flags: flagCapture | flagEnPassant}) {
			return p.ep
		}
	}
	return -1
}
