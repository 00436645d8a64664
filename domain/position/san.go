package position

import (
	"fmt"
	"strings"
)

// san writes legal move m in Standard Algebraic Notation; legal is the list of
// all legal moves of p (for disambiguation). Chess960 only: standard chess
// uses notnil's encoder (see sanOf).
func (p *Position) san(m move, legal []move) string {
	var b []byte
	if m.isCastle() {
		if m.castleSide() == 0 {
			b = append(b, "O-O"...)
		} else {
			b = append(b, "O-O-O"...)
		}
	} else {
		kind := p.board[m.from].kind()
		if kind == pawn {
			if m.flags&flagCapture != 0 {
				b = append(b, 'a'+byte(fileOf(m.from)), 'x')
			}
			b = append(b, squareName(m.to)...)
			if m.promo != noKind {
				b = append(b, '=', pieceLetters[m.promo])
			}
		} else {
			b = append(b, pieceLetters[kind])
			// Disambiguate among other pieces of the same kind reaching m.to.
			others, sameFile, sameRank := false, false, false
			for _, o := range legal {
				if o.to != m.to || o.from == m.from || o.isCastle() || p.board[o.from].kind() != kind {
					continue
				}
				others = true
				sameFile = sameFile || fileOf(o.from) == fileOf(m.from)
				sameRank = sameRank || rankOf(o.from) == rankOf(m.from)
			}
			if others {
				switch {
				case !sameFile:
					b = append(b, 'a'+byte(fileOf(m.from)))
				case !sameRank:
					b = append(b, '1'+byte(rankOf(m.from)))
				default:
					b = append(b, squareName(m.from)...)
				}
			}
			if m.flags&flagCapture != 0 {
				b = append(b, 'x')
			}
			b = append(b, squareName(m.to)...)
		}
	}
	n := p.apply(m)
	if n.checkersCount() > 0 {
		if n.hasLegalMove() {
			b = append(b, '+')
		} else {
			b = append(b, '#')
		}
	}
	return string(b)
}

// sanError is why a SAN token did not resolve; ambiguous lists the candidates.
type sanError struct {
	reason string
}

// parseSAN resolves SAN text (annotations and check marks already tolerated)
// against the legal moves of p. It accepts common variants: 0-0 for O-O, a
// promotion without '=', a missing or superfluous 'x', and a full origin square.
func (p *Position) parseSAN(tok string, legal []move) (move, *sanError) {
	s := strings.TrimRight(tok, "+#!?")
	s = strings.TrimSuffix(s, "e.p.")
	switch s {
	case "O-O", "0-0", "O-O-O", "0-0-0":
		side := 0
		if len(s) == 5 {
			side = 1
		}
		for _, m := range legal {
			if m.isCastle() && m.castleSide() == side {
				return m, nil
			}
		}
		return move{}, &sanError{"illegal move"}
	}
	if len(s) < 2 {
		return move{}, &sanError{"unreadable move"}
	}
	kind := pawn
	if i := strings.IndexByte("NBRQK", s[0]); i >= 0 {
		kind = uint8(i) + knight
		s = s[1:]
	}
	promo := noKind
	if kind == pawn && len(s) >= 3 {
		last := s[len(s)-1]
		if i := strings.IndexByte("NBRQnbrq", last); i >= 0 && (s[len(s)-2] == '=' || (s[len(s)-2] >= '1' && s[len(s)-2] <= '8')) {
			promo = promoFromLetter(last)
			s = strings.TrimSuffix(s[:len(s)-1], "=")
		}
	}
	if len(s) < 2 {
		return move{}, &sanError{"unreadable move"}
	}
	to, ok := parseSquare(s[len(s)-2:])
	if !ok {
		return move{}, &sanError{"unreadable move"}
	}
	fromFile, fromRank := int8(-1), int8(-1)
	for i := 0; i < len(s)-2; i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'h':
			fromFile = int8(c - 'a')
		case c >= '1' && c <= '8':
			fromRank = int8(c - '1')
		case c == 'x' || c == ':' || c == '-':
		default:
			return move{}, &sanError{"unreadable move"}
		}
	}
	if kind == pawn && fromFile < 0 {
		fromFile = fileOf(to) // a pawn push; captures name their file
	}
	var found move
	var cands []string
	for _, m := range legal {
		if m.isCastle() || m.to != to || p.board[m.from].kind() != kind {
			continue
		}
		if (fromFile >= 0 && fileOf(m.from) != fromFile) || (fromRank >= 0 && rankOf(m.from) != fromRank) {
			continue
		}
		if m.promo != promo {
			if promo == noKind && m.promo == queen {
				cands = append(cands, "") // remember that only the piece is missing
			}
			continue
		}
		found = m
		cands = append(cands, squareName(m.from))
	}
	n := 0
	for _, c := range cands {
		if c != "" {
			n++
		}
	}
	switch {
	case n == 1:
		return found, nil
	case n > 1:
		return move{}, &sanError{fmt.Sprintf("ambiguous move (pieces on %s can make it)", strings.Join(nonEmpty(cands), ", "))}
	case len(cands) > 0:
		return move{}, &sanError{"promotion piece missing"}
	}
	return move{}, &sanError{"illegal move"}
}

func nonEmpty(ss []string) []string {
	out := ss[:0:0]
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

func promoFromLetter(c byte) uint8 {
	switch c {
	case 'N', 'n':
		return knight
	case 'B', 'b':
		return bishop
	case 'R', 'r':
		return rook
	}
	return queen
}
