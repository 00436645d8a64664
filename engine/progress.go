package engine

import "strconv"

// Progress is a running search when it completes a depth: every line the search has
// for that depth, as the final Result would report them had it stopped there.
type Progress struct {
	Depth    int // depth of the rank-1 line
	SelDepth int
	Nodes    int64 // nodes searched so far
	NPS      int64 // the engine's last reported speed
	TimeMS   int64 // engine-reported time so far
	Lines    []Line
}

// depthWatch tells a search's Progress callback of each completed depth.
//
// With MultiPV n the engine prints lines 1..n once it has searched every one of them
// at a depth, so a depth is complete when line n arrives with an exact score (a bound
// is printed while an aspiration window fails, before the line is done). The engine
// reports min(n, legal moves) lines: a caller that asks for more lines than the
// position has moves should lower n, else it hears only of the last depth, which is
// reported at bestmove when no line n announced it. Depths are reported once each, in
// increasing order.
type depthWatch struct {
	fn   func(*Progress)
	want int   // the rank that completes a depth
	last int   // the deepest depth reported
	nps  int64 // the last speed the engine reported
}

// newDepthWatch watches for s.Progress; opts are the search's validated options, one of
// which may set MultiPV. It is nil, and costs nothing, when nobody listens.
func newDepthWatch(s *Search, opts []optionValue) *depthWatch {
	if s.Progress == nil {
		return nil
	}
	w := &depthWatch{fn: s.Progress, want: 1}
	for _, ov := range opts {
		if ov.key == "multipv" {
			if n, err := strconv.Atoi(ov.value); err == nil && n > 1 {
				w.want = n
			}
		}
	}
	return w
}

// line sees one parsed info line, after col has taken it in.
func (w *depthWatch) line(in *Info, col *lineCollector) {
	if in.NPS > 0 {
		w.nps = in.NPS
	}
	if !in.HasDepth || !in.HasScore || in.Score.Bound != BoundExact || in.Depth <= w.last {
		return
	}
	if max(in.MultiPV, 1) != w.want {
		return
	}
	w.report(col.result("", ""))
}

// done sees the final result: its depth is reported if no line announced it (a
// search stopped by movetime mid-depth, or fewer lines than asked).
func (w *depthWatch) done(r *Result) {
	if r.Depth > w.last && len(r.Lines) > 0 {
		w.report(r)
	}
}

func (w *depthWatch) report(r *Result) {
	if r.Depth <= w.last {
		return
	}
	w.last = r.Depth
	w.fn(&Progress{Depth: r.Depth, SelDepth: r.SelDepth, Nodes: r.Nodes, NPS: w.nps, TimeMS: r.TimeMS, Lines: r.Lines})
}
