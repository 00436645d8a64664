package position

// Board representation: a 64-square mailbox, a1 = 0, b1 = 1, ..., h8 = 63
// (notnil/chess numbers its squares the same way). It serves FEN validation
// and output in both modes and the own Chess960 move generator; this is not
// a search engine.

// Color is the side to move or the owner of a piece.
type Color uint8

const (
	White Color = 0
	Black Color = 1
)

// String returns "white" or "black".
func (c Color) String() string {
	if c == Black {
		return "black"
	}
	return "white"
}

// Other returns the opposing colour.
func (c Color) Other() Color { return c ^ 1 }

// piece kinds.
const (
	noKind uint8 = iota
	pawn
	knight
	bishop
	rook
	queen
	king
)

// piece is colour<<3 | kind; 0 is an empty square.
type piece uint8

const noPiece piece = 0

func makePiece(c Color, kind uint8) piece { return piece(uint8(c)<<3 | kind) }
func (p piece) kind() uint8               { return uint8(p) & 7 }
func (p piece) color() Color              { return Color(p >> 3) }

const pieceLetters = " PNBRQK"

// fenLetter is the FEN letter of a non-empty piece.
func (p piece) fenLetter() byte {
	c := pieceLetters[p.kind()]
	if p.color() == Black {
		c += 'a' - 'A'
	}
	return c
}

func pieceFromFEN(c byte) piece {
	switch c {
	case 'P':
		return makePiece(White, pawn)
	case 'N':
		return makePiece(White, knight)
	case 'B':
		return makePiece(White, bishop)
	case 'R':
		return makePiece(White, rook)
	case 'Q':
		return makePiece(White, queen)
	case 'K':
		return makePiece(White, king)
	case 'p':
		return makePiece(Black, pawn)
	case 'n':
		return makePiece(Black, knight)
	case 'b':
		return makePiece(Black, bishop)
	case 'r':
		return makePiece(Black, rook)
	case 'q':
		return makePiece(Black, queen)
	case 'k':
		return makePiece(Black, king)
	}
	return noPiece
}

func fileOf(sq int8) int8 { return sq & 7 }
func rankOf(sq int8) int8 { return sq >> 3 }

func squareName(sq int8) string {
	return string([]byte{'a' + byte(fileOf(sq)), '1' + byte(rankOf(sq))})
}

// parseSquare reads "e4"; ok is false for anything else.
func parseSquare(s string) (int8, bool) {
	if len(s) != 2 || s[0] < 'a' || s[0] > 'h' || s[1] < '1' || s[1] > '8' {
		return -1, false
	}
	return int8(s[1]-'1')*8 + int8(s[0]-'a'), true
}

// backRank is the first square of c's home rank (a1 or a8).
func backRank(c Color) int8 {
	if c == Black {
		return 56
	}
	return 0
}

// Precomputed targets.
var (
	knightTargets [64][]int8
	kingTargets   [64][]int8
	// rays[sq][d] lists the squares from sq outwards in direction d; d < 4 are
	// orthogonal (rook) directions, d >= 4 diagonal (bishop) ones.
	rays [64][8][]int8
)

var rayDirs = [8][2]int8{{0, 1}, {0, -1}, {1, 0}, {-1, 0}, {1, 1}, {1, -1}, {-1, 1}, {-1, -1}}

func init() {
	knightD := [8][2]int8{{1, 2}, {2, 1}, {2, -1}, {1, -2}, {-1, -2}, {-2, -1}, {-2, 1}, {-1, 2}}
	for sq := int8(0); sq < 64; sq++ {
		f, r := fileOf(sq), rankOf(sq)
		for _, d := range knightD {
			if nf, nr := f+d[0], r+d[1]; nf >= 0 && nf < 8 && nr >= 0 && nr < 8 {
				knightTargets[sq] = append(knightTargets[sq], nr*8+nf)
			}
		}
		for i, d := range rayDirs {
			if nf, nr := f+d[0], r+d[1]; nf >= 0 && nf < 8 && nr >= 0 && nr < 8 {
				kingTargets[sq] = append(kingTargets[sq], nr*8+nf)
			}
			for nf, nr := f+d[0], r+d[1]; nf >= 0 && nf < 8 && nr >= 0 && nr < 8; nf, nr = nf+d[0], nr+d[1] {
				rays[sq][i] = append(rays[sq][i], nr*8+nf)
			}
		}
	}
}

// attackers counts (up to limit) the pieces of colour by attacking sq on board b.
func attackers(b *[64]piece, sq int8, by Color, limit int) int {
	n := 0
	f := fileOf(sq)
	// Pawns of colour by attack sq from one rank behind (from by's view).
	pr := rankOf(sq) - 1
	if by == Black {
		pr = rankOf(sq) + 1
	}
	if pr >= 0 && pr < 8 {
		p := makePiece(by, pawn)
		if f > 0 && b[pr*8+f-1] == p {
			n++
		}
		if f < 7 && b[pr*8+f+1] == p {
			n++
		}
		if n >= limit {
			return n
		}
	}
	kn := makePiece(by, knight)
	for _, t := range knightTargets[sq] {
		if b[t] == kn {
			if n++; n >= limit {
				return n
			}
		}
	}
	kg := makePiece(by, king)
	for _, t := range kingTargets[sq] {
		if b[t] == kg {
			if n++; n >= limit {
				return n
			}
		}
	}
	q := makePiece(by, queen)
	for d := 0; d < 8; d++ {
		slider := makePiece(by, rook)
		if d >= 4 {
			slider = makePiece(by, bishop)
		}
		for _, t := range rays[sq][d] {
			p := b[t]
			if p == noPiece {
				continue
			}
			if p == slider || p == q {
				if n++; n >= limit {
					return n
				}
			}
			break
		}
	}
	return n
}

func attacked(b *[64]piece, sq int8, by Color) bool { return attackers(b, sq, by, 1) > 0 }
