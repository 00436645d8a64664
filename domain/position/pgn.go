package position

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Limits of ParsePGN.
const (
	MaxPGNBytes = 64 << 10
	MaxPGNPlies = 1024
)

// StartFEN is the standard starting position.
const StartFEN = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"

// Game is the main line of a PGN.
type Game struct {
	Start     *Position // from the FEN tag (with SetUp "1"), else the standard start
	Plies     []Ply     // main line, at most the maxPlies asked for
	End       *Position // position after the last ply in Plies
	Result    string    // "1-0", "0-1", "1/2-1/2", "*", or "" when the movetext has none
	Truncated bool      // the main line has more plies than were read
}

// Ply is one half-move of the main line.
type Ply struct {
	Number     int    // 1 for the first ply after Start
	GamePly    int    // the game's own ply number: 1 is White's first move, counted from Start's move number
	MoveNumber int    // PGN move number ("12" in "12." or "12...")
	Color      Color  // the side that played it
	FEN        string // canonical FEN of the position before the move
	Move       Move   // the move, UCI and SAN
}

// ParsePGN reads one game: tag pairs ([FEN "..."] sets the start; [Variant
// "chess960"] or "fischerandom" sets Chess960, as does the chess960 argument),
// then the movetext with move numbers, comments {...} and ; ..., variations
// (...) (skipped), NAGs $n and !? suffixes, and a result. A PGN holding more
// than one game is refused, saying how many; so are invalid UTF-8 and control
// characters other than tab, newline and carriage return. maxPlies bounds the
// plies read (<= 0 or above MaxPGNPlies means MaxPGNPlies); moves past it are not
// checked. A game whose moves would take the FEN tag's counters past what a FEN
// holds (100000) is refused, naming the ply. Errors are *Error with Field
// "pgn"; an illegal move is named by ply, move number and text, e.g.
// `ply 7 (4. Nxe5??): illegal move "Nxe5"`.
func ParsePGN(pgn string, chess960 bool, maxPlies int) (g *Game, err error) {
	defer func() {
		if r := recover(); r != nil { // last safety net around notnil; input is validated first
			recovered(r)
			g, err = nil, pgnErr("the game could not be read")
		}
	}()
	if len(pgn) > MaxPGNBytes {
		return nil, pgnErr("PGN is %d bytes long; at most %d are accepted", len(pgn), MaxPGNBytes)
	}
	if maxPlies <= 0 || maxPlies > MaxPGNPlies {
		maxPlies = MaxPGNPlies
	}
	if err := checkPGNText(pgn); err != nil {
		return nil, err
	}
	sc := pgnScanner{s: strings.TrimPrefix(pgn, "\ufeff")}

	// Tag pairs.
	var fenTag, variant string
	haveFEN := false
	for {
		sc.skipSpaceAndComments()
		if sc.err != nil {
			return nil, sc.err
		}
		if !sc.peek('[') {
			break
		}
		name, value, err := sc.tag()
		if err != nil {
			return nil, err
		}
		switch strings.ToLower(name) {
		case "fen":
			fenTag, haveFEN = value, true
		case "variant":
			variant = value
		}
	}
	switch v := strings.ToLower(strings.NewReplacer(" ", "", "-", "", "_", "").Replace(variant)); v {
	case "", "standard", "chess", "normal", "fromposition":
	case "chess960", "fischerandom", "fischerrandom", "960":
		chess960 = true
	default:
		return nil, pgnErr("variant %q is not supported (standard and chess960 are)", clip(variant))
	}

	var start *Position
	if haveFEN {
		start, err = Parse(fenTag, chess960)
		if err != nil {
			e := err.(*Error)
			return nil, &Error{Code: CodeInvalidPGN, Field: "pgn", Reason: "FEN tag: " + e.Reason}
		}
	} else {
		start, _ = Parse(StartFEN, chess960)
	}

	g = &Game{Start: start, End: start}
	cur := *start
	// Counted from the start's move number: 2*(fullmove-1)+1 is White's move.
	firstPly := 2*(start.fullmove-1) + 1
	if start.turn == Black {
		firstPly++
	}
	depth := 0 // variation nesting
	var buf [256]move
	for {
		sc.skipSpaceAndComments()
		if sc.err != nil {
			return nil, sc.err
		}
		if sc.done() {
			break
		}
		c := sc.s[sc.i]
		switch {
		case c == '(':
			depth++
			sc.i++
			continue
		case c == ')':
			if depth == 0 {
				return nil, pgnErr("unbalanced ')' at byte %d", sc.i)
			}
			depth--
			sc.i++
			continue
		case c == '[' && depth == 0:
			// tag pairs after movetext begin the next game (this one had no result)
			return nil, manyGames(1 + sc.countGames(false))
		case c == '$':
			sc.i++
			for !sc.done() && sc.s[sc.i] >= '0' && sc.s[sc.i] <= '9' {
				sc.i++
			}
			continue
		}
		tok := sc.word()
		if tok == "" { // a stray delimiter such as ']' or '}'
			if depth > 0 {
				sc.i++
				continue
			}
			return nil, pgnErr("unexpected %q at byte %d", sc.s[sc.i], sc.i)
		}
		if depth > 0 {
			continue
		}
		if isResult(tok) {
			g.Result = tok
			if more := sc.countGames(false); more > 0 {
				return nil, manyGames(1 + more)
			}
			return g, nil
		}
		tok = stripMoveNumber(tok)
		if strings.Trim(tok, ".!?") == "" || tok == "e.p." { // e.p. written apart from its capture
			continue
		}
		if len(g.Plies) == maxPlies {
			// the rest of this game is not checked, but a second game is still refused
			if n := sc.countGames(true); n > 1 {
				return nil, manyGames(n)
			}
			g.Truncated = true
			return g, nil
		}
		dots := "."
		if cur.turn == Black {
			dots = "..."
		}
		label := fmt.Sprintf("ply %d (%d%s %s)", len(g.Plies)+1, cur.fullmove, dots, clip(tok))
		if tok == "--" || tok == "Z0" || tok == "0000" {
			return nil, pgnErr("%s: null moves are not supported", label)
		}
		ms := cur.legalMoves(buf[:0])
		m, serr := cur.parseSAN(tok, ms)
		if serr != nil {
			return nil, pgnErr("%s: %s %q", label, serr.reason, clip(strings.TrimRight(tok, "+#!?")))
		}
		g.Plies = append(g.Plies, Ply{
			Number:     len(g.Plies) + 1,
			GamePly:    firstPly + len(g.Plies),
			MoveNumber: cur.fullmove,
			Color:      cur.turn,
			FEN:        cur.FEN(),
			Move:       Move{UCI: m.uci(cur.chess960), SAN: cur.sanOf(m, ms)},
		})
		next := cur.after(m)
		if over := next.counterOverflow(); over != "" {
			// The FEN tag set the counters: a game cannot take them past what a FEN holds.
			return nil, pgnErr("FEN tag: its counters leave no room for the game: %s would take %s, past %d, the most a FEN may hold", label, over, maxCounter)
		}
		cur = next
		g.End = &next
	}
	if depth > 0 {
		return nil, pgnErr("unterminated variation: missing ')'")
	}
	if len(g.Plies) == 0 && !haveFEN && strings.TrimSpace(pgn) == "" {
		return nil, pgnErr("PGN is empty")
	}
	return g, nil
}

// checkPGNText applies the service's text rules to a PGN: valid UTF-8, and no control
// character but tab, newline and carriage return (so no NUL, which PostgreSQL cannot
// store, in anything taken from it, such as its tags).
func checkPGNText(pgn string) *Error {
	for i, r := range pgn {
		switch {
		case r == utf8.RuneError:
			if _, size := utf8.DecodeRuneInString(pgn[i:]); size == 1 {
				return pgnErr("PGN is not valid UTF-8 (byte %d)", i)
			}
		case r == '\t' || r == '\n' || r == '\r':
		case r < 0x20 || r >= 0x7f && r <= 0x9f:
			return pgnErr("PGN holds the control character %U at byte %d; only tab, newline and carriage return are allowed", r, i)
		}
	}
	return nil
}

func isResult(tok string) bool {
	switch tok {
	case "1-0", "0-1", "1/2-1/2", "*":
		return true
	}
	return false
}

func manyGames(n int) *Error {
	return pgnErr("the PGN holds %d games; send one game per request", n)
}

// countGames counts the games in the rest of the input, each a run of tag pairs and
// movetext ended by a result or by the next game's tag pairs. inGame: the scanner is
// inside a game's movetext, which counts as the first.
func (sc *pgnScanner) countGames(inGame bool) int {
	n, inMoves, depth := 0, inGame, 0
	for {
		sc.skipSpaceAndComments()
		if sc.err != nil { // an unterminated comment: the rest belongs to the game it is in
			sc.err = nil
			return n + 1
		}
		if sc.done() {
			break
		}
		switch c := sc.s[sc.i]; {
		case c == '(':
			depth++
			sc.i++
		case c == ')':
			depth = max(0, depth-1)
			sc.i++
		case c == '[' && depth == 0:
			if inMoves { // the previous game ended without a result
				n++
			}
			if _, _, err := sc.tag(); err != nil {
				sc.i++
			}
			inGame, inMoves = true, false
			continue
		case c == '$':
			sc.i++
		default:
			tok := sc.word()
			if tok == "" {
				sc.i++
			} else if depth == 0 && isResult(tok) {
				n++
				inGame, inMoves = false, false
				continue
			}
		}
		inGame, inMoves = true, true
	}
	if inGame {
		n++
	}
	return n
}

func pgnErr(format string, args ...any) *Error {
	return &Error{Code: CodeInvalidPGN, Field: "pgn", Reason: fmt.Sprintf(format, args...)}
}

// stripMoveNumber removes a leading "12." or "12..." (also glued: "12.e4").
func stripMoveNumber(tok string) string {
	i := 0
	for i < len(tok) && tok[i] >= '0' && tok[i] <= '9' {
		i++
	}
	if i == 0 {
		return tok
	}
	j := i
	for j < len(tok) && tok[j] == '.' {
		j++
	}
	if j == i && i < len(tok) {
		return tok // "0-0" and friends
	}
	if j == i { // a bare number: a move number without its dot
		return ""
	}
	return tok[j:]
}

type pgnScanner struct {
	s   string
	i   int
	err *Error
}

func (sc *pgnScanner) done() bool       { return sc.i >= len(sc.s) }
func (sc *pgnScanner) peek(c byte) bool { return sc.i < len(sc.s) && sc.s[sc.i] == c }

// skipSpaceAndComments skips white space, {comments}, ; comments and %
// escape lines.
func (sc *pgnScanner) skipSpaceAndComments() {
	for sc.i < len(sc.s) {
		switch c := sc.s[sc.i]; c {
		case ' ', '\t', '\r', '\n', '\f', '\v':
			sc.i++
		case '{':
			end := strings.IndexByte(sc.s[sc.i:], '}')
			if end < 0 {
				sc.err = pgnErr("unterminated comment: '{' at byte %d has no '}'", sc.i)
				return
			}
			sc.i += end + 1
		case ';':
			sc.skipLine()
		case '%':
			if sc.i == 0 || sc.s[sc.i-1] == '\n' {
				sc.skipLine()
				continue
			}
			return
		default:
			return
		}
	}
}

func (sc *pgnScanner) skipLine() {
	if end := strings.IndexByte(sc.s[sc.i:], '\n'); end >= 0 {
		sc.i += end + 1
	} else {
		sc.i = len(sc.s)
	}
}

// word reads a movetext token up to white space or a delimiter.
func (sc *pgnScanner) word() string {
	start := sc.i
	for sc.i < len(sc.s) {
		switch sc.s[sc.i] {
		case ' ', '\t', '\r', '\n', '\f', '\v', '{', '}', '(', ')', '[', ']', ';', '$':
			return sc.s[start:sc.i]
		}
		sc.i++
	}
	return sc.s[start:]
}

// tag reads [Name "value"].
func (sc *pgnScanner) tag() (string, string, *Error) {
	at := sc.i
	sc.i++ // '['
	for sc.i < len(sc.s) && (sc.s[sc.i] == ' ' || sc.s[sc.i] == '\t') {
		sc.i++
	}
	ns := sc.i
	for sc.i < len(sc.s) && (isAlnum(sc.s[sc.i]) || sc.s[sc.i] == '_') {
		sc.i++
	}
	name := sc.s[ns:sc.i]
	for sc.i < len(sc.s) && (sc.s[sc.i] == ' ' || sc.s[sc.i] == '\t') {
		sc.i++
	}
	if name == "" || !sc.peek('"') {
		return "", "", pgnErr("malformed tag pair at byte %d: expected [Name \"value\"]", at)
	}
	sc.i++
	var v strings.Builder
	for {
		if sc.done() || sc.s[sc.i] == '\n' {
			return "", "", pgnErr("unterminated value in tag pair %s at byte %d", clip(name), at)
		}
		c := sc.s[sc.i]
		sc.i++
		if c == '\\' && sc.i < len(sc.s) && (sc.s[sc.i] == '"' || sc.s[sc.i] == '\\') {
			v.WriteByte(sc.s[sc.i])
			sc.i++
			continue
		}
		if c == '"' {
			break
		}
		v.WriteByte(c)
	}
	for sc.i < len(sc.s) && (sc.s[sc.i] == ' ' || sc.s[sc.i] == '\t') {
		sc.i++
	}
	if !sc.peek(']') {
		return "", "", pgnErr("malformed tag pair %s at byte %d: missing ']'", clip(name), at)
	}
	sc.i++
	return name, v.String(), nil
}

func isAlnum(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}
