package cli

import (
	"fmt"
	"strings"

	"github.com/notnil/chess"

	"chessd/client"
)

// board draws the position of fen as text (notnil/chess's diagram, White at the
// bottom), or nothing when it cannot read the FEN.
func board(fen string) string {
	f := strings.Fields(fen)
	if len(f) >= 3 {
		f[2] = "-" // Chess960 castling fields (HAha) are beyond notnil; the diagram needs none
	}
	opt, err := chess.FEN(strings.Join(f, " "))
	if err != nil {
		return ""
	}
	return strings.TrimLeft(chess.NewGame(opt).Position().Board().Draw(), "\n")
}

// score is an evaluation for people, White's view: "+0.31", "-1.20", "#3", "#-2",
// with ≥/≤ for a bound.
func score(s client.Score) string {
	out := ""
	if s.Type == client.ScoreTypeMate {
		out = fmt.Sprintf("#%d", s.Value)
	} else {
		out = fmt.Sprintf("%+.2f", float64(s.Value)/100)
	}
	if s.Bound != nil {
		switch *s.Bound {
		case client.ScoreBoundLower:
			out = "≥" + out
		case client.ScoreBoundUpper:
			out = "≤" + out
		}
	}
	return out
}

// line is a PV in SAN with move numbers, from the position fen: "1. e4 e5 2. Nf3",
// "12... Kf8 13. Rd8#".
func line(fen string, san []string) string {
	f := strings.Fields(fen)
	black := len(f) > 1 && f[1] == "b"
	n := 1
	if len(f) > 5 {
		fmt.Sscan(f[5], &n) //nolint:errcheck // 1 when unreadable
	}
	var b strings.Builder
	for i, m := range san {
		if i > 0 {
			b.WriteByte(' ')
		}
		switch {
		case !black:
			fmt.Fprintf(&b, "%d. ", n)
		case i == 0:
			fmt.Fprintf(&b, "%d... ", n)
		}
		b.WriteString(m)
		if black {
			n++
		}
		black = !black
	}
	return b.String()
}

func deref[T any](p *T) (v T) {
	if p != nil {
		v = *p
	}
	return v
}
