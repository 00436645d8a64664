package main

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
)

// freshPositions are the paired and null parts' positions: the fixed positions and
// the games' (jobPositions), then each of them with the colours swapped (flipColours).
// A swapped position is another position with a search of the same kind, so the
// parts get twice as many distinct positions without hand-picked ones.
func freshPositions() []string {
	base := append(append([]string(nil), positions...), jobPositions()...)
	seen := make(map[string]bool, 2*len(base))
	var out []string
	for _, list := range [][]string{base, mapFENs(base, flipColours)} {
		for _, f := range list {
			if !seen[f] {
				seen[f] = true
				out = append(out, f)
			}
		}
	}
	return out
}

func mapFENs(fens []string, f func(string) string) []string {
	out := make([]string, len(fens))
	for i, s := range fens {
		out[i] = f(s)
	}
	return out
}

// flipColours mirrors a FEN top to bottom and swaps the colours: White's pieces become
// Black's on the mirrored squares, the other side moves, castling rights and the en
// passant square follow. The fullmove number follows the side to move as a game's
// would: one more when White moves instead of Black (Black's move ended the move), one
// less (at least 1) when Black moves instead of White; the halfmove clock stays. So an
// en passant square with White to move comes at move 2 or later, as position.Parse
// requires, and flipping twice gives the FEN back, except White to move at move 1
// (back at move 2).
func flipColours(fen string) string {
	f := strings.Fields(fen)
	if len(f) < 4 {
		panic(fmt.Sprintf("flipColours: %q", fen))
	}
	ranks := strings.Split(f[0], "/")
	for i, j := 0, len(ranks)-1; i < j; i, j = i+1, j-1 {
		ranks[i], ranks[j] = ranks[j], ranks[i]
	}
	f[0] = swapCase(strings.Join(ranks, "/"))
	f[1] = map[string]string{"w": "b", "b": "w"}[f[1]]
	if f[2] != "-" {
		var c strings.Builder
		swapped := swapCase(f[2])
		for _, r := range "KQkq" { // canonical order
			if strings.ContainsRune(swapped, r) {
				c.WriteRune(r)
			}
		}
		f[2] = c.String()
	}
	if f[3] != "-" {
		f[3] = f[3][:1] + map[byte]string{'3': "6", '6': "3"}[f[3][1]]
	}
	if len(f) == 6 {
		n, err := strconv.Atoi(f[5])
		if err != nil {
			panic(fmt.Sprintf("flipColours: %q", fen))
		}
		if f[1] == "w" {
			n++
		} else {
			n = max(1, n-1)
		}
		f[5] = strconv.Itoa(n)
	}
	return strings.Join(f, " ")
}

func swapCase(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsUpper(r) {
			return unicode.ToLower(r)
		}
		return unicode.ToUpper(r)
	}, s)
}
