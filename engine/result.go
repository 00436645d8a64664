package engine

import (
	"errors"
	"sort"
	"time"
)

// Errors returned by this package. The HTTP layer maps ErrSaturated and ErrEngineFailed
// to 503 with Retry-After (next_action retry_after), ErrUnknownEngine to 400 fix_request
// (an id GET /engines does not list), and ErrClosed to 503. ErrInvalidOption and
// ErrInvalidSearch are a 500 there: package analysis validates every request against
// the same option lists and caps first, so the engine refusing one is a bug of ours.
var (
	// ErrSaturated: every process of the pool stayed busy for the whole queue wait.
	ErrSaturated = errors.New("engine: pool saturated")
	// ErrEngineFailed: the process died, hung past its deadline or broke the protocol.
	// It has been killed and is being replaced; retrying later is expected to work.
	ErrEngineFailed = errors.New("engine: engine process failed")
	// ErrInvalidOption: a request option the engine does not have, of a type requests
	// may not set, or outside the engine's (or the service's) range.
	ErrInvalidOption = errors.New("engine: invalid option")
	// ErrInvalidSearch: a search without limits or with negative ones.
	ErrInvalidSearch = errors.New("engine: invalid search")
	// ErrUnknownEngine: no such version or path installed.
	ErrUnknownEngine = errors.New("engine: unknown engine")
	// ErrClosed: the pool or catalog has been closed.
	ErrClosed = errors.New("engine: closed")
	// ErrPreempted: a Batch search was stopped to give its process to an interactive
	// one that would otherwise have waited; its caller runs it again.
	ErrPreempted = errors.New("engine: batch search preempted by an interactive one")
)

// Search describes one analysis request.
type Search struct {
	// FEN of the position; "" means the standard start position. The caller validates
	// it: an engine given an illegal FEN may crash (that then surfaces as ErrEngineFailed).
	FEN string
	// Moves played from FEN, UCI long algebraic.
	Moves []string
	// Depth limit in plies (0: none). With MoveTime too, whichever comes first.
	Depth int
	// MoveTime limit (0: none). Millisecond granularity.
	MoveTime time.Duration
	// MultiPV lines to report (0 or 1: one line). Overrides Options["MultiPV"].
	MultiPV int
	// Options are UCI option name -> value for this search only, e.g. "Skill Level": "3",
	// "UCI_ShowWDL": "true". Names match case-insensitively as UCI says. They are reset
	// to the engine's defaults before the process serves anyone else.
	Options map[string]string
	// Progress, when set, is called with each depth the search completes, in
	// increasing depth order (see progress.go). It runs on the goroutine that reads the
	// engine's output: it must not block.
	Progress func(*Progress)
}

// Line is one principal variation at the deepest depth the search completed for it.
type Line struct {
	MultiPV  int // rank, 1-based
	Depth    int
	SelDepth int
	Score    Score // raw, side to move's point of view
	WDL      *WDL  // only when UCI_ShowWDL is on
	Nodes    int64
	NPS      int64
	TimeMS   int64
	PV       []string
}

// Result of a finished search. BestMove is "" when the side to move has no legal move
// ("bestmove (none)"): then Lines holds the engine's depth-0 line, whose score is
// "mate 0" for checkmate and "cp 0" for stalemate.
type Result struct {
	BestMove string
	Ponder   string
	Lines    []Line // ordered by rank, 1..n
	Depth    int    // depth of the rank-1 line
	SelDepth int
	Nodes    int64  // nodes of the whole search (the last count the engine reported)
	TimeMS   int64  // engine-reported search time
	Engine   string // version id that answered ("sf-17.1"); set by Catalog.Search
	Path     Path   // path that answered (native or wasm); set by Catalog.Search
}

// lineCollector keeps, per MultiPV rank, the line to report.
//
// Choice rule: per rank, the deepest line with an exact score wins; a line at the same
// depth replaces an earlier one (the engine re-prints a rank as it improves). A bound-only
// line (lowerbound/upperbound, printed while an aspiration window fails) is used only
// when the rank has no exact line at all, because its score is not a value, only a limit,
// and a search stopped mid-iteration leaves such lines deeper than the last exact one.
type lineCollector struct {
	exact map[int]Line
	bound map[int]Line
	nodes int64
	time  int64
	heard bool // an info line came, parsed or not
}

func (c *lineCollector) add(in *Info) {
	if in.Nodes > c.nodes {
		c.nodes = in.Nodes
	}
	if in.TimeMS > c.time {
		c.time = in.TimeMS
	}
	// A line that reports a rank needs a depth and a score; "info depth 0 score mate 0"
	// (no PV) is how a mated position is reported, so the PV is optional.
	if !in.HasDepth || !in.HasScore {
		return
	}
	rank := in.MultiPV
	if rank <= 0 {
		rank = 1
	}
	l := Line{
		MultiPV: rank, Depth: in.Depth, SelDepth: in.SelDepth, Score: in.Score,
		WDL: in.WDL, Nodes: in.Nodes, NPS: in.NPS, TimeMS: in.TimeMS, PV: in.PV,
	}
	m := &c.exact
	if in.Score.Bound != BoundExact {
		m = &c.bound
	}
	if *m == nil {
		*m = make(map[int]Line, 4)
	}
	if old, ok := (*m)[rank]; !ok || l.Depth >= old.Depth {
		(*m)[rank] = l
	}
}

func firstMove(l Line) string {
	if len(l.PV) == 0 {
		return ""
	}
	return l.PV[0]
}

func (c *lineCollector) result(best, ponder string) *Result {
	r := &Result{BestMove: best, Ponder: ponder, Nodes: c.nodes, TimeMS: c.time}
	for _, l := range c.exact {
		r.Lines = append(r.Lines, l)
	}
	for rank, l := range c.bound {
		if _, ok := c.exact[rank]; !ok {
			r.Lines = append(r.Lines, l)
		}
	}
	sort.Slice(r.Lines, func(i, j int) bool { return r.Lines[i].MultiPV < r.Lines[j].MultiPV })
	// A search stopped while a new best move failed high leaves the old best's exact
	// line at rank 1 and the engine's bestmove only in a deeper bound line: rank 1 is
	// then that line, bound and all, so that the answer's line starts with its move.
	if len(r.Lines) > 0 && best != "" && firstMove(r.Lines[0]) != best {
		if b, ok := c.bound[1]; ok && firstMove(b) == best && b.Depth >= r.Lines[0].Depth {
			r.Lines[0] = b
		}
	}
	// Ranks taken from different depths may repeat a first move: each move keeps its
	// best rank, and the ranks close up.
	seen := make(map[string]bool, len(r.Lines))
	kept := r.Lines[:0]
	for _, l := range r.Lines {
		if m := firstMove(l); m != "" {
			if seen[m] {
				continue
			}
			seen[m] = true
		}
		l.MultiPV = len(kept) + 1
		kept = append(kept, l)
	}
	r.Lines = kept
	if len(r.Lines) > 0 {
		r.Depth = r.Lines[0].Depth
		r.SelDepth = r.Lines[0].SelDepth
	}
	return r
}
