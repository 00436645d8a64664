package position

import "fmt"

// Code classifies an Error. The set is closed; the HTTP layer maps every code to
// 400 with next_action fix_request (see Error).
type Code string

const (
	// CodeInvalidFEN: the FEN text cannot be read (syntax, field count, length).
	CodeInvalidFEN Code = "invalid_fen"
	// CodeIllegalPosition: the FEN reads but describes a position that cannot
	// occur (king count, side not to move in check, pawns on rank 1/8, castling
	// rights or en passant square that do not fit the board, too many pieces,
	// move counters that do not fit the rest of the FEN).
	CodeIllegalPosition Code = "illegal_position"
	// CodeInvalidMove: a move is not UCI text ("e2e4", "e7e8q").
	CodeInvalidMove Code = "invalid_move"
	// CodeIllegalMove: a well-formed move that is not legal in its position.
	CodeIllegalMove Code = "illegal_move"
	// CodeInvalidPGN: the PGN cannot be read, or one of its moves is illegal,
	// ambiguous or unreadable (Reason names the ply).
	CodeInvalidPGN Code = "invalid_pgn"
)

// Error is the package's only error type. Reason is a sentence for a client
// (problem+json detail and errors[].reason); Field names the input it is about:
// "fen", "pgn", "move" (Play) or "moves" (LineSAN). The HTTP layer may rename
// Field to its own JSON path (e.g. "fens[3]"). All codes are client errors (400),
// except that LineSAN on an engine's own PV failing is the service's fault.
type Error struct {
	Code   Code
	Field  string
	Reason string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s", e.Field, e.Reason)
}

func fenErr(format string, args ...any) *Error {
	return &Error{Code: CodeInvalidFEN, Field: "fen", Reason: fmt.Sprintf(format, args...)}
}

func illegalErr(format string, args ...any) *Error {
	return &Error{Code: CodeIllegalPosition, Field: "fen", Reason: fmt.Sprintf(format, args...)}
}
