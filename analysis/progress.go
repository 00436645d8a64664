package analysis

import (
	"context"

	"chessd/domain/position"
	"chessd/engine"
)

// Progress is one depth a running search has completed, in the answer's terms: White's
// view, SAN beside UCI, WDL only when asked. Eval and WDL are the rank-1 line's.
type Progress struct {
	Depth    int   `json:"depth"`
	SelDepth int   `json:"seldepth"`
	Eval     Score `json:"eval"`
	WDL      *WDL  `json:"wdl,omitempty"`
	Nodes    int64 `json:"nodes"`
	NPS      int64 `json:"nps"`
	TimeMS   int64 `json:"time_ms"`
	PVs      []PV  `json:"pvs"`
}

// AnalyseProgress is Analyse that also calls progress with each depth the search
// completes, in increasing order, before it returns the answer. Nothing is reported
// when no search runs (a finished game, a cache hit). progress runs on the engine's
// reading path: it must hand the value on without blocking.
func (s *Service) AnalyseProgress(ctx context.Context, spec Spec, prio engine.Priority, useCache bool, progress func(*Progress)) (*Result, error) {
	return s.analyse(ctx, spec, prio, useCache, progress)
}

// watchDepths asks the engine for each completed depth of search and converts it for
// progress. The engine prints at most one line per legal move, and a depth is complete
// at its last line, so MultiPV is lowered to the number of legal moves: the engine does
// the same by itself, so the search and its answer are unchanged.
func watchDepths(search *engine.Search, pos *position.Position, spec Spec, progress func(*Progress)) {
	if n := len(pos.LegalMoves()); search.MultiPV > n {
		search.MultiPV = n
	}
	stm := pos.SideToMove()
	search.Progress = func(raw *engine.Progress) {
		p := &Progress{Depth: raw.Depth, SelDepth: raw.SelDepth, Nodes: raw.Nodes, NPS: raw.NPS, TimeMS: raw.TimeMS,
			PVs: make([]PV, 0, len(raw.Lines))}
		for _, l := range raw.Lines {
			pv, err := pvOf(pos, stm, l, spec.Engine)
			if err != nil {
				return // the final answer reports a line that does not replay
			}
			if !spec.ShowWDL {
				pv.WDL = nil
			}
			p.PVs = append(p.PVs, pv)
		}
		if len(p.PVs) > 0 {
			p.Eval, p.WDL = p.PVs[0].Eval, p.PVs[0].WDL
		}
		progress(p)
	}
}
