package position

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxFENLength bounds the FEN text Parse reads; real FENs are under 100 bytes.
const MaxFENLength = 256

// maxCounter bounds the halfmove clock and fullmove number. A move never takes a
// counter past it: Play and ParsePGN refuse it (counterOverflow), so that every
// position's FEN parses back.
const maxCounter = 100000

// counterOverflow names the counter of p, a position just played, that has passed
// maxCounter, with its value ("the fullmove number to 100001"); "" when both fit.
func (p *Position) counterOverflow() string {
	switch {
	case p.fullmove > maxCounter:
		return fmt.Sprintf("the fullmove number to %d", p.fullmove)
	case p.halfmove > maxCounter:
		return fmt.Sprintf("the halfmove clock to %d", p.halfmove)
	}
	return ""
}

// Parse reads and validates a FEN, then (in standard chess) has notnil/chess
// decode it; see the package comment. Surrounding white space is ignored, fields
// may be separated by any run of white space, and a FEN of only the first four
// fields gets the counters "0 1" ("0 2" when White is to move with an en passant
// square: Black has made the double step, so move 1 is over). With chess960 the
// castling field may use X-FEN (KQkq: the outermost rook on that side) or
// Shredder-FEN rook files (HAha, Bb...); without it only KQkq with king on e1/e8
// and rooks on the corners. Every refusal is an *Error naming what is wrong.
func Parse(fen string, chess960 bool) (*Position, error) {
	return parse(fen, chess960, false)
}

// ParseStored reads a FEN that was accepted and stored before the move counters were
// checked against the en passant square (a job's position, submitted to an earlier
// release or to an older server during a rolling deploy): as Parse, except that the
// counters those rules refuse are repaired to what the pawn's double step the square
// records left them: a halfmove clock other than 0 becomes 0, and fullmove number 1
// with White to move becomes 2. Nothing else is relaxed, and a FEN Parse accepts
// reads the same. A request's FEN goes to Parse, which refuses such counters.
func ParseStored(fen string, chess960 bool) (*Position, error) {
	return parse(fen, chess960, true)
}

// parse is Parse, or ParseStored when repair.
func parse(fen string, chess960, repair bool) (*Position, error) {
	if len(fen) > MaxFENLength {
		return nil, fenErr("FEN is %d bytes long; at most %d are accepted", len(fen), MaxFENLength)
	}
	var fields [7]string
	n := 0
	for rest := strings.TrimSpace(fen); rest != ""; {
		i := strings.IndexAny(rest, " \t\r\n")
		if i < 0 {
			i = len(rest)
		}
		if n == len(fields) {
			n++
			break
		}
		fields[n] = rest[:i]
		n++
		rest = strings.TrimLeft(rest[i:], " \t\r\n")
	}
	switch n {
	case 0:
		return nil, fenErr("FEN is empty")
	case 4:
		fields[4], fields[5] = "0", "1" // "0 2" with White to move and an en passant square, below
	case 6:
	default:
		if n > 6 {
			return nil, fenErr("FEN has more than 6 fields; expected placement, side to move, castling, en passant, halfmove clock and fullmove number")
		}
		return nil, fenErr("FEN has %d fields; expected 6 (placement, side to move, castling, en passant, halfmove clock, fullmove number) or the first 4", n)
	}

	p := &Position{ep: -1, chess960: chess960, castle: [2][2]int8{{-1, -1}, {-1, -1}}}
	if err := p.parsePlacement(fields[0]); err != nil {
		return nil, err
	}
	switch fields[1] {
	case "w":
		p.turn = White
	case "b":
		p.turn = Black
	default:
		return nil, fenErr("side to move %q must be \"w\" or \"b\"", fields[1])
	}
	castling := fields[2]
	if castling != "-" {
		for i := 0; i < len(castling); i++ {
			c := castling[i]
			switch {
			case strings.IndexByte("KQkq", c) >= 0:
			case (c >= 'A' && c <= 'H') || (c >= 'a' && c <= 'h'):
				if !chess960 {
					return nil, fenErr("castling field %q: rook-file letter %q is Shredder-FEN, valid only with chess960; standard chess uses KQkq", castling, c)
				}
			default:
				return nil, fenErr("castling field %q: invalid character %s (expected KQkq, rook files A-H/a-h with chess960, or -)", castling, charAt(castling, i))
			}
		}
		// After the letters: "€€" is 6 bytes but not 6 letters.
		if len(castling) > 4 {
			return nil, fenErr("castling field %q has more than 4 letters", castling)
		}
	}
	epText := fields[3]
	if epText != "-" {
		sq, ok := parseSquare(epText)
		if !ok {
			return nil, fenErr("en passant field %q must be a square such as e3, or -", epText)
		}
		p.ep = sq
		if n == 4 && p.turn == White {
			fields[5] = "2"
		}
	}
	var err error
	if p.halfmove, err = parseCounter(fields[4], "halfmove clock", 0); err != nil {
		return nil, err
	}
	if p.fullmove, err = parseCounter(fields[5], "fullmove number", 1); err != nil {
		return nil, err
	}

	if err := p.validateMaterial(); err != nil {
		return nil, err
	}
	if err := p.parseCastling(castling); err != nil {
		return nil, err
	}
	if err := p.validateEnPassant(); err != nil {
		return nil, err
	}
	if err := p.validateChecks(); err != nil {
		return nil, err
	}
	if repair && p.repairCounters() {
		fields[4], fields[5] = strconv.Itoa(p.halfmove), strconv.Itoa(p.fullmove)
	}
	if err := p.validateCounters(); err != nil {
		return nil, err
	}
	if !chess960 {
		np, err := decodeNotnil(p, fields[:6])
		if err != nil {
			return nil, err
		}
		p.std = newStdState(np)
	}
	return p, nil
}

// parseCounter reads a counter's digits. Leading zeros say nothing of its size
// ("0000001" is 1): only the digits after them are bounded.
func parseCounter(s, name string, min int) (int, error) {
	if s == "" {
		return 0, fenErr("%s %q must be a whole number", name, s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fenErr("%s %q must be a whole number", name, s)
		}
	}
	digits := strings.TrimLeft(s, "0")
	if len(digits) > 6 {
		return 0, fenErr("%s %q is too large (at most %d)", name, s, maxCounter)
	}
	v := 0
	for i := 0; i < len(digits); i++ {
		v = v*10 + int(digits[i]-'0')
	}
	if v > maxCounter {
		return 0, fenErr("%s %q is too large (at most %d)", name, s, maxCounter)
	}
	if v < min {
		return 0, fenErr("%s %q must be at least %d", name, s, min)
	}
	return v, nil
}

func (p *Position) parsePlacement(s string) *Error {
	rank, file := int8(7), int8(0)
	start := 0
	rankText := func(end int) string { return s[start:end] }
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == '/' {
			if file != 8 {
				end := i
				return fenErr("piece placement: rank %d (%q) describes %d squares; expected 8", rank+1, rankText(end), file)
			}
			if i == len(s) {
				break
			}
			if rank == 0 {
				return fenErr("piece placement %q has more than 8 ranks", s)
			}
			rank--
			file = 0
			start = i + 1
			continue
		}
		c := s[i]
		if c >= '1' && c <= '8' {
			file += int8(c - '0')
			if file > 8 {
				return fenErr("piece placement: rank %d (%q) describes more than 8 squares", rank+1, restOfRank(s, start))
			}
			continue
		}
		pc := pieceFromFEN(c)
		if pc == noPiece {
			return fenErr("piece placement: rank %d has invalid character %s (pieces are PNBRQK/pnbrqk, empty squares 1-8)", rank+1, charAt(s, i))
		}
		if file >= 8 {
			return fenErr("piece placement: rank %d (%q) describes more than 8 squares", rank+1, restOfRank(s, start))
		}
		p.board[rank*8+file] = pc
		file++
	}
	if rank != 0 {
		return fenErr("piece placement has %d ranks; expected 8 separated by '/'", 8-rank)
	}
	return nil
}

// charAt quotes the character starting at s[i] for an error message: the whole
// character, not its first byte ('€', not 'â'), or, where s is not UTF-8, the byte
// in hex.
func charAt(s string, i int) string {
	r, size := utf8.DecodeRuneInString(s[i:])
	if r == utf8.RuneError && size <= 1 {
		return fmt.Sprintf("byte 0x%02x (not UTF-8)", s[i])
	}
	return strconv.QuoteRune(r)
}

func restOfRank(s string, start int) string {
	if i := strings.IndexByte(s[start:], '/'); i >= 0 {
		return s[start : start+i]
	}
	return s[start:]
}

// validateMaterial: one king each, no pawn on rank 1/8, piece counts possible.
func (p *Position) validateMaterial() *Error {
	var count [2][7]int
	p.kings = [2]int8{-1, -1}
	for sq := int8(0); sq < 64; sq++ {
		pc := p.board[sq]
		if pc == noPiece {
			continue
		}
		c, k := pc.color(), pc.kind()
		count[c][k]++
		if k == king {
			p.kings[c] = sq
		}
		if k == pawn && (rankOf(sq) == 0 || rankOf(sq) == 7) {
			return illegalErr("%s pawn on %s: pawns cannot stand on rank 1 or 8", c, squareName(sq))
		}
	}
	for c := White; c <= Black; c++ {
		cnt := &count[c]
		if cnt[king] != 1 {
			return illegalErr("%s has %d kings; exactly one king per side is required", c, cnt[king])
		}
		total := 0
		for k := pawn; k <= king; k++ {
			total += cnt[k]
		}
		if total > 16 {
			return illegalErr("%s has %d pieces; at most 16 (pawns included) are possible", c, total)
		}
		if cnt[pawn] > 8 {
			return illegalErr("%s has %d pawns; at most 8 are possible", c, cnt[pawn])
		}
		extra := max(0, cnt[queen]-1) + max(0, cnt[rook]-2) + max(0, cnt[bishop]-2) + max(0, cnt[knight]-2)
		if cnt[pawn]+extra > 8 {
			return illegalErr("%s has %d pawns and %d promoted pieces (%d queens, %d rooks, %d bishops, %d knights); together at most 8 are possible",
				c, cnt[pawn], extra, cnt[queen], cnt[rook], cnt[bishop], cnt[knight])
		}
	}
	return nil
}

// parseCastling fills p.castle from a syntactically checked castling field.
func (p *Position) parseCastling(s string) *Error {
	if s == "-" {
		return nil
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		color := White
		if c >= 'a' {
			color = Black
		}
		home := backRank(color)
		k := p.kings[color]
		if rankOf(k) != rankOf(home) {
			return illegalErr("castling right %q needs the %s king on rank %d, but it is on %s", c, color, rankOf(home)+1, squareName(k))
		}
		// A Chess960 king starts between its rooks, so one with a right left (never
		// moved) stands on files b to g.
		if f := fileOf(k); p.chess960 && (f == 0 || f == 7) {
			return illegalErr("castling right %q needs the %s king on files b to g, between its rooks (a Chess960 king starts there), but it is on %s",
				c, color, squareName(k))
		}
		myRook := makePiece(color, rook)
		side, r := 0, int8(-1)
		switch c {
		case 'K', 'k', 'Q', 'q':
			kingSide := c == 'K' || c == 'k'
			if !kingSide {
				side = 1
			}
			if !p.chess960 {
				corner := home + 7
				if !kingSide {
					corner = home
				}
				if k != home+4 || p.board[corner] != myRook {
					return illegalErr("castling right %q needs the %s king on %s and a %s rook on %s (for other setups set chess960)",
						c, color, squareName(home+4), color, squareName(corner))
				}
				r = corner
				break
			}
			// X-FEN: the outermost rook on that side of the king.
			if kingSide {
				for s := home + 7; s > k; s-- {
					if p.board[s] == myRook {
						r = s
						break
					}
				}
			} else {
				for s := home; s < k; s++ {
					if p.board[s] == myRook {
						r = s
						break
					}
				}
			}
			if r < 0 {
				dir := "king side (towards h)"
				if !kingSide {
					dir = "queen side (towards a)"
				}
				return illegalErr("castling right %q needs a %s rook on rank %d on the %s of the king on %s", c, color, rankOf(home)+1, dir, squareName(k))
			}
		default: // Shredder-FEN rook file, chess960 only (checked by Parse)
			f := int8(c - 'A')
			if color == Black {
				f = int8(c - 'a')
			}
			r = home + f
			if p.board[r] != myRook {
				return illegalErr("castling right %q needs a %s rook on %s", c, color, squareName(r))
			}
			if r < k {
				side = 1
			}
		}
		if p.castle[color][side] >= 0 {
			name := "king-side"
			if side == 1 {
				name = "queen-side"
			}
			return illegalErr("castling field %q gives %s two %s castling rights", s, color, name)
		}
		p.castle[color][side] = r
	}
	if p.chess960 {
		return p.checkMirroredCastling(s)
	}
	return nil
}

// checkMirroredCastling refuses Chess960 rights the two sides cannot hold together. A
// Chess960 game starts mirror-symmetric and a right lives only while its king and rook
// stand where they started: if both sides keep a right, their kings share a file, and a
// right on the same side held by both uses the same rook file. (Standard chess fixes
// every square, which parseCastling checks right by right.)
func (p *Position) checkMirroredCastling(field string) *Error {
	has := func(c Color) bool { return p.castle[c][0] >= 0 || p.castle[c][1] >= 0 }
	if !has(White) || !has(Black) {
		return nil
	}
	wk, bk := p.kings[White], p.kings[Black]
	if fileOf(wk) != fileOf(bk) {
		return illegalErr("castling field %q needs the white and black kings on the same file while both sides keep a right (a Chess960 game starts mirror-symmetric), but they are on %s and %s",
			field, squareName(wk), squareName(bk))
	}
	for side, name := range [2]string{"king-side", "queen-side"} {
		wr, br := p.castle[White][side], p.castle[Black][side]
		if wr >= 0 && br >= 0 && fileOf(wr) != fileOf(br) {
			return illegalErr("castling field %q needs the white and black %s rooks on the same file (a Chess960 game starts mirror-symmetric), but they are on %s and %s",
				field, name, squareName(wr), squareName(br))
		}
	}
	return nil
}

// validateEnPassant: the square must be behind a pawn of the side not to move
// that just advanced two squares.
func (p *Position) validateEnPassant() *Error {
	if p.ep < 0 {
		return nil
	}
	them := p.turn.Other()
	wantRank, dir := int8(5), int8(-8) // white to move: square on rank 6, pawn below it on rank 5
	if p.turn == Black {
		wantRank, dir = 2, 8
	}
	name := squareName(p.ep)
	if rankOf(p.ep) != wantRank {
		return illegalErr("en passant square %s is impossible with %s to move; it must be on rank %d", name, p.turn, wantRank+1)
	}
	if p.board[p.ep] != noPiece {
		return illegalErr("en passant square %s must be empty", name)
	}
	if p.board[p.ep+dir] != makePiece(them, pawn) {
		return illegalErr("en passant square %s needs a %s pawn on %s that has just advanced two squares", name, them, squareName(p.ep+dir))
	}
	if origin := p.ep - dir; p.board[origin] != noPiece {
		return illegalErr("en passant square %s is impossible: %s, where the %s pawn came from, is occupied", name, squareName(origin), them)
	}
	return nil
}

// validateCounters: an en passant square says the last move was a pawn's double step,
// which set the halfmove clock to 0; with White to move that step was Black's, so move
// 1 is over. A clock larger than the plies the fullmove number allows is let through:
// it is as impossible, but FENs copied from a game with the move number set back to 1
// carry one, and common tools accept them (docs/API.md).
func (p *Position) validateCounters() *Error {
	if p.ep < 0 {
		return nil
	}
	name := squareName(p.ep)
	if p.halfmove != 0 {
		return illegalErr("halfmove clock %d is impossible with the en passant square %s: %s's last move was then a pawn's double step, which sets the clock to 0",
			p.halfmove, name, p.turn.Other())
	}
	if p.turn == White && p.fullmove == 1 {
		return illegalErr("en passant square %s is impossible at fullmove number 1 with white to move: black has not moved yet (the number is 2 after black's first move)", name)
	}
	return nil
}

// repairCounters sets the counters validateCounters refuses as the double step behind
// the en passant square left them (ParseStored): the halfmove clock to 0, and with
// White to move the fullmove number 1 to 2. It says whether it changed either.
func (p *Position) repairCounters() bool {
	if p.ep < 0 {
		return false
	}
	changed := false
	if p.halfmove != 0 {
		p.halfmove, changed = 0, true
	}
	if p.turn == White && p.fullmove == 1 {
		p.fullmove, changed = 2, true
	}
	return changed
}

func (p *Position) validateChecks() *Error {
	them := p.turn.Other()
	if attacked(&p.board, p.kings[them], p.turn) {
		return illegalErr("the %s king on %s is in check, but it is %s to move", them, squareName(p.kings[them]), p.turn)
	}
	n := p.checkersCount()
	if n > 2 {
		return illegalErr("the %s king on %s is attacked by %d pieces; at most 2 checkers are possible", p.turn, squareName(p.kings[p.turn]), n)
	}
	p.inCheck = n > 0
	return nil
}

// appendFEN writes the canonical FEN; counters only when withCounters.
func (p *Position) appendFEN(b []byte, withCounters bool) []byte {
	for r := int8(7); r >= 0; r-- {
		empty := byte(0)
		for f := int8(0); f < 8; f++ {
			pc := p.board[r*8+f]
			if pc == noPiece {
				empty++
				continue
			}
			if empty > 0 {
				b = append(b, '0'+empty)
				empty = 0
			}
			b = append(b, pc.fenLetter())
		}
		if empty > 0 {
			b = append(b, '0'+empty)
		}
		if r > 0 {
			b = append(b, '/')
		}
	}
	if p.turn == White {
		b = append(b, " w "...)
	} else {
		b = append(b, " b "...)
	}
	b = p.appendCastling(b)
	b = append(b, ' ')
	if ep := p.effectiveEP(); ep >= 0 {
		b = append(b, squareName(ep)...)
	} else {
		b = append(b, '-')
	}
	if withCounters {
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(p.halfmove), 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(p.fullmove), 10)
	}
	return b
}

// appendCastling writes KQkq in standard chess and Shredder-FEN rook files
// (HAha), as Stockfish prints them with UCI_Chess960, in Chess960.
func (p *Position) appendCastling(b []byte) []byte {
	start := len(b)
	for c := White; c <= Black; c++ {
		for side := 0; side < 2; side++ {
			r := p.castle[c][side]
			if r < 0 {
				continue
			}
			var l byte
			if p.chess960 {
				l = 'A' + byte(fileOf(r))
			} else {
				l = "KQ"[side]
			}
			if c == Black {
				l += 'a' - 'A'
			}
			b = append(b, l)
		}
	}
	if len(b) == start {
		b = append(b, '-')
	}
	return b
}
