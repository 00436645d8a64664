package analysis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/domain"
	"chessd/domain/position"
	"chessd/engine"
	"chessd/memo"
)

// Score is an evaluation from White's point of view: centipawns, or moves to mate
// (negative: Black mates). Bound is "lower" or "upper" when the engine reported only a
// bound for the line.
type Score struct {
	Type  string `json:"type"`
	Value int    `json:"value"`
	Bound string `json:"bound,omitempty"`
}

// WDL is a win/draw/loss estimate in per mille, from White's point of view.
type WDL struct {
	W int `json:"w"`
	D int `json:"d"`
	L int `json:"l"`
}

// PV is one principal variation.
type PV struct {
	Rank     int      `json:"rank"`
	Eval     Score    `json:"eval"`
	Moves    []string `json:"moves"`
	MovesSAN []string `json:"moves_san"`
	Depth    int      `json:"depth"`
	SelDepth int      `json:"seldepth"`
	Nodes    int64    `json:"nodes"`
	WDL      *WDL     `json:"wdl,omitempty"`
}

// Result is a finished analysis.
type Result struct {
	FEN         string  `json:"fen"`
	Eval        Score   `json:"eval"`
	BestMove    *string `json:"bestmove"`
	BestMoveSAN *string `json:"bestmove_san"`
	Ponder      string  `json:"ponder,omitempty"`
	PVs         []PV    `json:"pvs"`
	Depth       int     `json:"depth"`
	SelDepth    int     `json:"seldepth"`
	Nodes       int64   `json:"nodes"`
	TimeMS      int64   `json:"time_ms"`
	Engine      string  `json:"engine"`
	EngineName  string  `json:"engine_name"`
	Path        string  `json:"path"`
	Cached      bool    `json:"cached"`
	// Terminal is set when the position is already over: no engine ran.
	Terminal string `json:"-"`
	// Search is the time spent in the engine pool (waiting for a process included);
	// zero when no engine ran. It feeds the Server-Timing header.
	Search time.Duration `json:"-"`
}

// Service answers analysis requests.
type Service struct {
	catalog  *engine.Catalog
	cache    *Cache
	cacheOff atomic.Bool
	logger   *slog.Logger
	flights  flights
	parsed   memo.Map // parseKey -> *parsedFEN, at most maxParsed
}

// DisableCache makes every request search afresh and store nothing: for benchmarks
// that compare the service with the raw engine.
func (s *Service) DisableCache() { s.cacheOff.Store(true) }

// EnableCache undoes DisableCache.
func (s *Service) EnableCache() { s.cacheOff.Store(false) }

// NewService builds a Service; pool holds the persistent eval cache.
func NewService(cat *engine.Catalog, pool *pgxpool.Pool, logger *slog.Logger) *Service {
	s := &Service{catalog: cat, cache: NewCache(pool, 20000, logger), logger: logger}
	s.parsed.Max = maxParsed
	return s
}

// Catalog is the engine catalog behind the service.
func (s *Service) Catalog() *engine.Catalog { return s.catalog }

// Cache is the service's eval cache.
func (s *Service) Cache() *Cache { return s.cache }

// Analyse answers spec: from the position itself when the game is over, from the cache
// when a deep enough result is stored, else from an engine of the pool at priority prio.
// useCache false skips the cache lookup (a result is still stored).
func (s *Service) Analyse(ctx context.Context, spec Spec, prio engine.Priority, useCache bool) (*Result, error) {
	return s.analyse(ctx, spec, prio, useCache, nil)
}

// analyse is Analyse, telling progress (when not nil) of each depth a search completes.
// A request that may use the cache waits for a search of the same position already
// running here rather than starting its own, and is answered as a cache hit.
func (s *Service) analyse(ctx context.Context, spec Spec, prio engine.Priority, useCache bool, progress func(*Progress)) (*Result, error) {
	parsed, err := s.parse(spec.FEN, spec.Chess960, spec.Stored)
	if err != nil {
		var pe *position.Error
		if errors.As(err, &pe) {
			return nil, domain.Invalid("fen", pe.Reason)
		}
		return nil, err
	}
	pos := parsed.pos
	if st := pos.Status(); st != position.Ongoing {
		return s.terminal(pos, spec), nil
	}
	key := cacheKey(parsed, spec)
	var fl *flight
	// A request with a time limit of its own neither waits for another's search (which
	// may take a minute) nor has others wait for one that may stop short.
	if useCache && progress == nil && s.cacheable(spec) && spec.MoveTimeMS == 0 {
		var lead bool
		if fl, lead = s.flights.join(key, spec.Depth, spec.MultiPV, prio); !lead {
			if res, ok := fl.wait(ctx, spec.Depth, spec.MultiPV); ok {
				return trim(res, parsed, spec, true), nil
			}
			fl = nil // it failed: this request searches on its own
		}
	}
	res, cached, shared, err := s.answer(ctx, pos, key, spec, prio, useCache, progress)
	if fl != nil {
		if err == nil && !shared {
			s.flights.land(key, fl, nil, errNotWhole) // those waiting search on their own
		} else {
			s.flights.land(key, fl, res, err)
		}
	}
	if err != nil {
		return nil, err
	}
	return trim(res, parsed, spec, cached), nil
}

// answer finds spec's result in the cache (when useCache) or has an engine search it,
// storing what it found when it is whole (shared: it may answer others). The result is
// all the lines found, as stored: the caller trims it.
func (s *Service) answer(ctx context.Context, pos *position.Position, key string, spec Spec, prio engine.Priority, useCache bool, progress func(*Progress)) (res *Result, cached, shared bool, err error) {
	if useCache {
		if hit, ok := s.stored(ctx, key, spec); ok {
			return hit, true, true, nil
		}
	}
	search := engine.Search{FEN: pos.FEN(), Depth: spec.Depth, MultiPV: spec.MultiPV, Options: map[string]string{}}
	for k, v := range spec.UCIOptions {
		search.Options[k] = v
	}
	// WDL does not change the search, so always ask for it when the build has it: the
	// cached result can then serve requests with and without show_wdl.
	info, _ := pathInfo(s.catalog, spec.Engine, spec.Path)
	if _, ok := findOption(info.Options, "UCI_ShowWDL"); ok {
		search.Options["UCI_ShowWDL"] = "true"
	}
	if progress != nil {
		watchDepths(&search, pos, spec, progress)
	}
	search.MoveTime = SearchCap
	if spec.MoveTimeMS > 0 {
		search.MoveTime = time.Duration(spec.MoveTimeMS) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, search.MoveTime+30*time.Second)
	defer cancel()
	started := time.Now()
	raw, err := s.catalog.Search(ctx, spec.Engine, spec.Path, prio, search)
	if err != nil {
		return nil, false, false, engineError(err)
	}
	searched := time.Since(started)
	res, err = convert(pos, raw, info.Name)
	if err != nil {
		return nil, false, false, err
	}
	res.Search = searched
	shared = whole(res, pos, spec, search.MoveTime)
	if s.cacheable(spec) && shared {
		s.cache.Put(key, spec.MultiPV, res)
	}
	return res, false, shared, nil
}

// errNotWhole ends a flight whose search stopped short of what it was asked.
var errNotWhole = errors.New("analysis: the search stopped short of its depth or lines")

// whole says whether res is the whole search spec asked for: every line searched to
// spec's depth, and as many lines as asked or as the position has moves. Only a whole
// result is cached or given to requests waiting for its search. A search stopped by
// its time limit short of its depth reports the depth it was in, not one it completed;
// one stopped during its last depth can have its first lines at that depth (the one
// being searched perhaps only a bound) and the others a depth short, or every line at
// that depth from a partly searched last iteration. So a search whose
// engine time reached its limit (the request's movetime, or SearchCap) is not whole
// whatever depths its lines say.
func whole(res *Result, pos *position.Position, spec Spec, limit time.Duration) bool {
	if res.TimeMS >= limit.Milliseconds() {
		return false
	}
	for _, pv := range res.PVs {
		if pv.Depth < spec.Depth {
			return false
		}
	}
	return len(res.PVs) >= spec.MultiPV || len(res.PVs) == pos.LegalMoveCount()
}

// Lookup answers spec without an engine when it can: a finished game, or a cached
// result deep enough. ok is false when a search is needed (Analyse with useCache
// false then skips a second lookup). Costed calls price what Lookup found.
func (s *Service) Lookup(ctx context.Context, spec Spec) (res *Result, ok bool, err error) {
	parsed, err := s.parse(spec.FEN, spec.Chess960, spec.Stored)
	if err != nil {
		var pe *position.Error
		if errors.As(err, &pe) {
			return nil, false, domain.Invalid("fen", pe.Reason)
		}
		return nil, false, err
	}
	if st := parsed.pos.Status(); st != position.Ongoing {
		return s.terminal(parsed.pos, spec), true, nil
	}
	hit, ok := s.stored(ctx, cacheKey(parsed, spec), spec)
	if !ok {
		return nil, false, nil
	}
	return trim(hit, parsed, spec, true), true, nil
}

// cacheable says whether spec's results are kept and shared: not those of a weakened
// engine, nor any while the cache is off.
func (s *Service) cacheable(spec Spec) bool { return !spec.LimitStrength && !s.cacheOff.Load() }

// stored finds a cached result that answers spec, whole.
func (s *Service) stored(ctx context.Context, key string, spec Spec) (*Result, bool) {
	if !s.cacheable(spec) {
		return nil, false
	}
	return s.cache.Get(ctx, key, spec.Depth, spec.MultiPV)
}

// parsedFEN is a position with the two renderings every answer of it needs: its
// canonical FEN (the answer's) and its normalised one with its halfmove clock (the
// cache key's, see cacheKey).
type parsedFEN struct {
	pos             *position.Position
	fen, normalized string
}

// maxParsed bounds the parse memo: about 2.3 KB a position, and anyone may fill it
// (keyless calls parse before their allowance is checked), so 10,000 is 23 MB at most.
// A miss costs a few microseconds since Parse hands notnil its binary form.
const maxParsed = 10000

// parseKey is the parse memo's key: the text, its mode and its reading apart, since no
// text the caller sends may name another mode's entry, nor a request's FEN a stored
// one's (ParseStored accepts what Parse refuses).
type parseKey struct {
	fen      string
	chess960 bool
	stored   bool
}

// parse reads a FEN (a stored one with position.ParseStored, see Spec.Stored),
// remembering recent ones with their renderings: positions are immutable and safe to
// share, and a repeated FEN is the common case of a cached answer.
func (s *Service) parse(fen string, chess960, stored bool) (*parsedFEN, error) {
	key := parseKey{fen, chess960, stored}
	if p, ok := s.parsed.Load(key); ok {
		return p.(*parsedFEN), nil
	}
	read := position.Parse
	if stored {
		read = position.ParseStored
	}
	pos, err := read(fen, chess960)
	if err != nil {
		return nil, err
	}
	p := &parsedFEN{pos: pos, fen: pos.FEN(), normalized: pos.Normalized() + " " + strconv.Itoa(pos.HalfmoveClock())}
	s.parsed.Store(key, p)
	return p, nil
}

// terminal answers a position whose game is over without any engine: checkmate is
// mate 0 (decisions.md), stalemate a draw, and there is no best move.
func (s *Service) terminal(pos *position.Position, spec Spec) *Result {
	res := &Result{FEN: pos.FEN(), Eval: Score{Type: "cp"}, PVs: []PV{}, Engine: spec.Engine, Path: string(spec.Path)}
	if info, ok := pathInfo(s.catalog, spec.Engine, spec.Path); ok {
		res.EngineName = info.Name
	}
	res.Terminal = "stalemate"
	if pos.Status() == position.Checkmate {
		res.Eval.Type, res.Terminal = "mate", "checkmate"
	}
	return res
}

// convert turns the engine's answer (side to move's view, UCI) into ours.
func convert(pos *position.Position, raw *engine.Result, engineName string) (*Result, error) {
	stm := pos.SideToMove()
	res := &Result{
		FEN: pos.FEN(), Depth: raw.Depth, SelDepth: raw.SelDepth, Nodes: raw.Nodes, TimeMS: raw.TimeMS,
		Engine: raw.Engine, EngineName: engineName, Path: string(raw.Path), Ponder: raw.Ponder, PVs: make([]PV, 0, len(raw.Lines)),
	}
	for _, l := range raw.Lines {
		pv, err := pvOf(pos, stm, l, raw.Engine)
		if err != nil {
			return nil, err
		}
		res.PVs = append(res.PVs, pv)
	}
	if len(res.PVs) > 0 {
		res.Eval = res.PVs[0].Eval
	}
	if raw.BestMove != "" {
		// The best move opens the first line (a UCI engine's bestmove is its PV's
		// first move): that line's SAN is already written and checked. Playing it
		// again, for a position we would throw away, cost about 15 µs on the answer's
		// path (docs/BENCHMARKS.md, session 35).
		if pv := res.PVs; len(pv) > 0 && len(pv[0].Moves) > 0 && pv[0].Moves[0] == raw.BestMove {
			best, san := raw.BestMove, pv[0].MovesSAN[0]
			res.BestMove, res.BestMoveSAN = &best, &san
			return res, nil
		}
		// Found, not played: at the counters' limit (move 100000, Black to move) a
		// move cannot be played (position.Play), but it is still the best one.
		mv, err := pos.FindMove(raw.BestMove)
		if err != nil {
			return nil, fmt.Errorf("engine %s gave an illegal best move %q: %w", raw.Engine, raw.BestMove, err)
		}
		best, san := mv.UCI, mv.SAN
		res.BestMove, res.BestMoveSAN = &best, &san
	}
	return res, nil
}

// pvOf turns one engine line into a PV: White's view, SAN beside UCI.
func pvOf(pos *position.Position, stm position.Color, l engine.Line, engineID string) (PV, error) {
	san, err := pos.LineSAN(l.PV)
	if err != nil {
		return PV{}, fmt.Errorf("engine %s gave a line that does not replay (%v): %w", engineID, l.PV, err)
	}
	pv := PV{Rank: l.MultiPV, Eval: whiteScore(stm, l.Score), Moves: l.PV, MovesSAN: san,
		Depth: l.Depth, SelDepth: l.SelDepth, Nodes: l.Nodes}
	if l.WDL != nil {
		w := position.WDLWhitePOV(stm, position.WDL{W: l.WDL.W, D: l.WDL.D, L: l.WDL.L})
		pv.WDL = &WDL{W: w.W, D: w.D, L: w.L}
	}
	if pv.Moves == nil {
		pv.Moves, pv.MovesSAN = []string{}, []string{}
	}
	return pv, nil
}

// whiteScore flips a side-to-move score to White's view; a bound flips with it.
func whiteScore(stm position.Color, s engine.Score) Score {
	out := Score{Type: "cp", Value: position.WhitePOV(stm, s.Value)}
	if s.Mate {
		out.Type = "mate"
	}
	bound := s.Bound
	if stm == position.Black {
		switch bound {
		case engine.BoundLower:
			bound = engine.BoundUpper
		case engine.BoundUpper:
			bound = engine.BoundLower
		}
	}
	switch bound {
	case engine.BoundLower:
		out.Bound = "lower"
	case engine.BoundUpper:
		out.Bound = "upper"
	}
	return out
}

// trim cuts a (possibly cached, possibly richer) result down to what spec asked for.
// The FEN is the request's own: a cached result was stored by a request for the same
// position that may have had another fullmove number.
func trim(r *Result, parsed *parsedFEN, spec Spec, cached bool) *Result {
	out := *r
	out.FEN = parsed.fen
	out.Cached = cached
	if cached {
		out.Search = 0
	}
	if len(out.PVs) > spec.MultiPV {
		out.PVs = out.PVs[:spec.MultiPV]
	}
	if !spec.ShowWDL {
		pvs := make([]PV, len(out.PVs))
		for i, pv := range out.PVs {
			pv.WDL = nil
			pvs[i] = pv
		}
		out.PVs = pvs
	}
	return &out
}

// engineError maps engine failures to the service's error codes.
func engineError(err error) error {
	switch {
	case errors.Is(err, engine.ErrSaturated):
		return &unavailable{msg: "every engine is busy; retry shortly", after: time.Second, err: err}
	case errors.Is(err, engine.ErrEngineFailed), errors.Is(err, engine.ErrClosed):
		return &unavailable{msg: "the engine failed during the search and is being replaced; retry", after: time.Second, err: err}
	case errors.Is(err, engine.ErrInvalidOption), errors.Is(err, engine.ErrInvalidSearch):
		// Not the client's mistake: Validate checks every field against the same option
		// lists and the same caps the pools enforce (Catalog.MaxHashMB), and the search
		// (FEN, depth, movetime, lines) is built here from a validated Spec. An engine
		// that refuses one anyway means our validation and the engine disagree (a bug,
		// or an executable replaced under a running server), so it is an internal error:
		// a 500 whose detail says nothing of the engine (the engine's words go to the
		// log with the request id), not a 400 telling the client to fix a request that
		// GET /engines says is valid, with no errors entry to fix it by.
		return fmt.Errorf("analysis: the engine refused a validated request: %w", err)
	}
	return err
}

// unavailable is a 503 with a Retry-After.
type unavailable struct {
	msg   string
	after time.Duration
	err   error
}

func (u *unavailable) Error() string { return u.msg }
func (u *unavailable) Unwrap() []error {
	return []error{u.err, &domain.Error{Code: domain.CodeUnavailable, Message: u.msg}}
}
func (u *unavailable) RetryAfter() time.Duration { return u.after }
