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

// Line is one principal variation as the engine last reported it (see lineCollector).
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
// Choice rule: per rank, the line the engine printed last. Stockfish prints all its
// ranks together, in rank order, each time it completes one and once more when it stops,
// so the last batch is its final state: distinct moves, each rank's line at the depth the
// engine has for it. A search stopped mid-depth leaves a batch whose ranks come from two
// depths (those searched at the last depth, the rest repeated from the one before), and
// the rank being searched may have only a bound, which Line.Score.Bound says. Older lines
// must not be mixed in: the deepest exact line of a rank whose last line is a bound can
// be a move another rank now holds, and dropping the repeat lost that rank's move.
type lineCollector struct {
	ranks map[int]heardLine
	seq   int // lines taken so far
	nodes int64
	time  int64
	heard bool // an info line came, parsed or not
}

// heardLine is a rank's line and when it came (lineCollector.seq).
type heardLine struct {
	Line
	seq int
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
	if c.ranks == nil {
		c.ranks = make(map[int]heardLine, 4)
	}
	c.seq++
	c.ranks[rank] = heardLine{Line: Line{
		MultiPV: rank, Depth: in.Depth, SelDepth: in.SelDepth, Score: in.Score,
		WDL: in.WDL, Nodes: in.Nodes, NPS: in.NPS, TimeMS: in.TimeMS, PV: in.PV,
	}, seq: c.seq}
}

func firstMove(l Line) string {
	if len(l.PV) == 0 {
		return ""
	}
	return l.PV[0]
}

func (c *lineCollector) result(best, ponder string) *Result {
	r := &Result{BestMove: best, Ponder: ponder, Nodes: c.nodes, TimeMS: c.time}
	// A move at two ranks can only come from an output that is not whole batches (a
	// rank the last batch left out): the later line is the engine's newer word on it.
	newest := make(map[string]int, len(c.ranks))
	for _, h := range c.ranks {
		if m := firstMove(h.Line); m != "" && h.seq > newest[m] {
			newest[m] = h.seq
		}
	}
	for _, h := range c.ranks {
		if m := firstMove(h.Line); m == "" || newest[m] == h.seq {
			r.Lines = append(r.Lines, h.Line)
		}
	}
	sort.Slice(r.Lines, func(i, j int) bool { return r.Lines[i].MultiPV < r.Lines[j].MultiPV })
	for i := range r.Lines {
		r.Lines[i].MultiPV = i + 1
	}
	if len(r.Lines) > 0 {
		r.Depth = r.Lines[0].Depth
		r.SelDepth = r.Lines[0].SelDepth
	}
	return r
}
