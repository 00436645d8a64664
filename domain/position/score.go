package position

// WhitePOV converts a score the engine reports from the side to move's point
// of view (centipawns or moves to mate) to White's: negated when Black is to
// move. Mate 0 (side to move is mated) stays 0.
func WhitePOV(sideToMove Color, v int) int {
	if sideToMove == Black {
		return -v
	}
	return v
}

// WDL is a per-mille win/draw/loss triple.
type WDL struct {
	W, D, L int
}

// WDLWhitePOV converts a WDL triple reported for the side to move to White's
// point of view: win and loss swap when Black is to move.
func WDLWhitePOV(sideToMove Color, w WDL) WDL {
	if sideToMove == Black {
		return WDL{W: w.L, D: w.D, L: w.W}
	}
	return w
}
