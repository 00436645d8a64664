package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"chessd/analysis"
	"chessd/domain"
	"chessd/engine"
	"chessd/ledger"
)

// Keyless calls (decisions.md: a small daily allowance per client address and a low
// depth cap; everything above needs a key).
const (
	KeylessPerDay     = 50
	KeylessMaxDepth   = 12
	KeylessMaxMultiPV = 3
)

// cost is what a costed answer says of money: what was charged for it (nothing for a
// keyless call) and what the call costs by the price table (cached or fresh).
type cost struct {
	CostUnits  int64  `json:"cost_units"` // charged
	CostUSD    string `json:"cost_usd"`
	PriceUnits int64  `json:"price_units"` // the price of this call, charged or not
	PriceUSD   string `json:"price_usd"`
}

func newCost(charged bool, units int64) cost {
	c := cost{PriceUnits: units, PriceUSD: usd(domain.USD(units)), CostUSD: usd(domain.USD(0))}
	if charged {
		c.CostUnits, c.CostUSD = units, c.PriceUSD
	}
	return c
}

// evalAnswer is the body of a 200 from POST /eval.
type evalAnswer struct {
	*analysis.Result
	cost
}

// bestMoveAnswer is the body of a 200 from POST /bestmove.
type bestMoveAnswer struct {
	BestMove    *string        `json:"bestmove"`
	BestMoveSAN *string        `json:"bestmove_san"`
	Ponder      string         `json:"ponder,omitempty"`
	Eval        analysis.Score `json:"eval"`
	Depth       int            `json:"depth"`
	Engine      string         `json:"engine"`
	Cached      bool           `json:"cached"`
	cost
}

func (s *Server) eval(w http.ResponseWriter, r *http.Request) {
	s.costed(w, r, domain.EndpointEval, func(res *analysis.Result, c cost) any {
		return evalAnswer{Result: res, cost: c}
	})
}

func (s *Server) bestMove(w http.ResponseWriter, r *http.Request) {
	s.costed(w, r, domain.EndpointBestMove, func(res *analysis.Result, c cost) any {
		return bestMoveAnswer{
			BestMove: res.BestMove, BestMoveSAN: res.BestMoveSAN, Ponder: res.Ponder, Eval: res.Eval,
			Depth: res.Depth, Engine: res.Engine, Cached: res.Cached, cost: c,
		}
	})
}

// costed runs the shared path of /eval and /bestmove: credentials (optional), the
// Idempotency-Key, the request, plan caps or keyless limits, the analysis, its price,
// and the charge, which is committed (with the response, for the Idempotency-Key)
// before the client sees anything.
func (s *Server) costed(w http.ResponseWriter, r *http.Request, ep domain.Endpoint, render func(*analysis.Result, cost) any) {
	fail := func(err error) { s.writeError(w, r, err) }
	timing := newServerTiming()
	key, err := s.authenticateRemembered(r)
	if err != nil {
		fail(err)
		return
	}
	if key != nil && !key.HasScope(domain.ScopeEval) {
		fail(domain.Errorf(domain.CodeScope, "this key lacks the scope \"eval\""))
		return
	}
	scope := "ip:" + clientIP(r).String()
	if key != nil {
		scope = key.ID()
	}
	if !s.rateLimit(w, r, key) {
		return
	}
	timing.mark("auth")
	idem, done := s.checkIdempotency(w, r, scope)
	if done {
		return
	}
	var req analysis.Request
	if err := decode(r, &req, false); err != nil {
		fail(err)
		return
	}
	spec, err := analysis.Validate(req, s.analysis.Catalog())
	if err != nil {
		fail(err)
		return
	}
	var release func(error)
	if key == nil {
		if release, err = s.keylessAllowance(r, spec); err != nil {
			fail(err)
			return
		}
	} else if err := s.keyAllows(r, key, spec); err != nil {
		fail(err)
		return
	}
	timing.mark("request")
	res, err := s.analysis.Analyse(r.Context(), spec, engine.Interactive, true)
	if release != nil {
		release(err)
	}
	if err != nil {
		fail(err)
		return
	}
	price, err := domain.Quote(domain.Call{Endpoint: ep, Depth: spec.Depth, MultiPV: spec.MultiPV, MoveTimeMS: spec.MoveTimeMS, Positions: 1})
	if err != nil {
		fail(err)
		return
	}
	units := price.Units
	if res.Cached || res.Terminal != "" { // no search ran: the cached price
		units = price.CachedUnits
	}
	body, err := json.Marshal(render(res, newCost(key != nil, units)))
	if err != nil {
		fail(err)
		return
	}
	if res.Search > 0 {
		timing.add("engine", res.Search)
	}
	timing.mark("analysis")
	if key != nil {
		charge := ledger.Charge{
			RequestID: requestID(r.Context()), Key: key, Allowance: account(r.Context()).Plan().Limits().UnitsPerDay,
			Endpoint: ep, Engine: res.Engine, Path: res.Path, Cached: res.Cached || res.Terminal != "",
			Units: units, USD: domain.USD(units),
			Params: ledger.Params{Depth: spec.Depth, MultiPV: spec.MultiPV, MoveTimeMS: spec.MoveTimeMS, Positions: 1, FEN: res.FEN},
		}
		if idem.stored != nil {
			st := *idem.stored
			st.Status, st.Response = http.StatusOK, body
			charge.Idempotency = &st
		}
		out, err := s.charge(r, charge, spec)
		if err != nil {
			fail(err)
			return
		}
		if err := s.chargeRefusal(w, r, out, idem); err != nil || out.Err != nil {
			if err != nil {
				fail(err)
			}
			return
		}
		timing.mark("charge")
	} else {
		s.remember(r, idem, http.StatusOK, body)
	}
	timing.write(w.Header())
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(body) //nolint:errcheck // the client went away
}

// keyAllows checks what the key's plan and budget allow for spec, before any engine runs.
func (s *Server) keyAllows(r *http.Request, key *domain.Key, spec analysis.Spec) error {
	plan := account(r.Context()).Plan()
	if err := plan.Limits().CheckCaps(plan, spec.Depth, spec.MultiPV, spec.MoveTimeMS); err != nil {
		return err
	}
	return s.budgetLeft(r, key)
}

// charge charges a costed call with the versions its key and account were
// authenticated at. When either has changed since (the request was authenticated from
// memory), nothing was charged: the key is checked afresh in the database, with its
// scope, caps and budget, and charged as it is now.
func (s *Server) charge(r *http.Request, ch ledger.Charge, spec analysis.Spec) (ledger.Result, error) {
	for attempt := 0; ; attempt++ {
		ch.KeyVersion, ch.AccountVersion = ch.Key.Version(), account(r.Context()).Version()
		out, err := s.charger.Charge(r.Context(), ch)
		if err != nil || !errors.Is(out.Err, ledger.ErrStaleAuth) || attempt == 3 {
			return out, err
		}
		s.forgetCredential(r)
		key, err := s.authenticate(r)
		if err != nil {
			return ledger.Result{}, err
		}
		if key == nil || !key.HasScope(domain.ScopeEval) {
			return ledger.Result{}, domain.Errorf(domain.CodeScope, "this key lacks the scope \"eval\"")
		}
		if err := s.keyAllows(r, key, spec); err != nil {
			return ledger.Result{}, err
		}
		ch.Key, ch.Allowance = key, account(r.Context()).Plan().Limits().UnitsPerDay
	}
}

// chargeRefusal turns a refused charge into the client's answer (a replay for a used
// Idempotency-Key); it writes nothing when the charge went through.
func (s *Server) chargeRefusal(w http.ResponseWriter, r *http.Request, out ledger.Result, idem idempotency) error {
	var dup *ledger.DuplicateError
	switch {
	case out.Err == nil:
		return nil
	case errors.As(out.Err, &dup):
		s.replay(w, r, *idem.stored, dup.Stored)
		return nil
	case errors.Is(out.Err, ledger.ErrBudget):
		return domain.Errorf(domain.CodeBudget, "this call would exceed the key's budget (%v); raise it with PATCH /v1/keys/%s", out.Err, principal(r.Context()).ID())
	case errors.Is(out.Err, ledger.ErrAllowance):
		plan := account(r.Context()).Plan()
		return domain.Errorf(domain.CodeUpgrade, "the %s plan's daily allowance of %d units is used up for today (UTC)", plan, plan.Limits().UnitsPerDay)
	case errors.Is(out.Err, ledger.ErrStaleAuth):
		// the key kept changing while we charged (see charge): nothing was charged
		return domain.Errorf(domain.CodeUnavailable, "the key changed while this call was being charged; nothing was charged, retry")
	}
	return out.Err
}

// budgetLeft refuses early, before any engine runs, a key whose budget is already
// spent. It is only a shortcut: the charge itself checks atomically.
func (s *Server) budgetLeft(r *http.Request, key *domain.Key) error {
	if key.BudgetUnits() == nil && key.BudgetUSD() == nil {
		return nil
	}
	var exhausted bool
	err := s.pool.QueryRow(r.Context(), `SELECT (budget_units IS NOT NULL AND spent_units + held_units >= budget_units)
		OR (budget_usd IS NOT NULL AND spent_usd + held_usd >= budget_usd) FROM key_balances WHERE key_id = $1`, key.ID()).Scan(&exhausted)
	if err != nil {
		return err
	}
	if exhausted {
		return domain.Errorf(domain.CodeBudget, "the key's budget is spent; raise it with PATCH /v1/keys/%s", key.ID())
	}
	return nil
}

// keylessAllowance enforces the keyless caps and takes one call from the client
// address's daily allowance in one conditional statement, so concurrent calls cannot
// overdraw it. The returned function gives the call back when the analysis failed.
func (s *Server) keylessAllowance(r *http.Request, spec analysis.Spec) (func(error), error) {
	if spec.Depth > KeylessMaxDepth || spec.MultiPV > KeylessMaxMultiPV {
		return nil, domain.Errorf(domain.CodeKeylessExhausted,
			"without a key, depth is capped at %d and multipv at %d; sign up for a key (POST /v1/signup)", KeylessMaxDepth, KeylessMaxMultiPV)
	}
	ip := clientIP(r)
	day := time.Now().UTC().Format(time.DateOnly)
	var calls int
	err := s.pool.QueryRow(r.Context(), `INSERT INTO keyless_usage (ip, day, calls) VALUES ($1, $2, 1)
		ON CONFLICT (ip, day) DO UPDATE SET calls = keyless_usage.calls + 1 WHERE keyless_usage.calls < $3
		RETURNING calls`, ip, day, KeylessPerDay).Scan(&calls)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return nil, err
		}
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, domain.Errorf(domain.CodeKeylessExhausted,
				"the keyless allowance of %d calls a day for your address is used up; sign up for a key (POST /v1/signup)", KeylessPerDay)
		}
		return nil, err
	}
	return func(failed error) {
		if failed == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
		defer cancel()
		if _, err := s.pool.Exec(ctx, `UPDATE keyless_usage SET calls = calls - 1 WHERE ip = $1 AND day = $2 AND calls > 0`, ip, day); err != nil {
			s.logger.Warn("keyless allowance refund failed", "err", err)
		}
	}, nil
}

// clientIP is the connection's peer address. Behind a proxy, configure it to pass the
// real address; we do not trust X-Forwarded-For from the open internet.
func clientIP(r *http.Request) netip.Addr {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.IPv4Unspecified()
	}
	return ip.Unmap()
}

func (s *Server) engines(w http.ResponseWriter, r *http.Request) {
	cat := s.analysis.Catalog()
	type pathJSON struct {
		Path    engine.Path           `json:"path"`
		Name    string                `json:"name"`
		NNUE    []string              `json:"nnue"`
		Options []analysis.OptionSpec `json:"options"`
	}
	type versionJSON struct {
		ID      string                `json:"id"`
		Version string                `json:"version"`
		Name    string                `json:"name"`
		NNUE    []string              `json:"nnue"`
		Paths   []pathJSON            `json:"paths"`
		Options []analysis.OptionSpec `json:"options"`
	}
	var versions []versionJSON
	var defaultOptions []analysis.OptionSpec
	for _, v := range cat.Versions() {
		vj := versionJSON{ID: v.ID, Version: v.Version, Name: v.Name, NNUE: v.NNUE}
		for _, p := range v.Paths {
			vj.Paths = append(vj.Paths, pathJSON{Path: p.Path, Name: p.Name, NNUE: p.NNUE, Options: analysis.OptionSchema(p)})
		}
		vj.Options = vj.Paths[0].Options
		if v.ID == cat.Default() {
			defaultOptions = vj.Options
		}
		versions = append(versions, vj)
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"default": cat.Default(), "versions": versions, "options": defaultOptions,
		"limits": map[string]any{
			"depth":       map[string]int{"min": 1, "max": analysis.MaxDepth, "default": analysis.DefaultDepth},
			"multipv":     map[string]int{"min": 1, "max": analysis.MaxMultiPV, "default": 1},
			"movetime_ms": map[string]int{"min": analysis.MinMoveTime, "max": analysis.MaxMoveTime},
			"keyless":     map[string]int{"calls_per_day": KeylessPerDay, "max_depth": KeylessMaxDepth, "max_multipv": KeylessMaxMultiPV},
		},
	})
}

// price answers GET /price with the same function that prices every charge.
func (s *Server) price(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var p domain.Problems
	ep, ok := domain.ParseEndpoint(q.Get("endpoint"))
	if !ok {
		p.Add("endpoint", "must be eval, bestmove, analyze or batch")
	}
	job := ep == domain.EndpointAnalyze || ep == domain.EndpointBatch
	maxDepth, maxPV, defDepth := analysis.MaxDepth, analysis.MaxMultiPV, analysis.DefaultDepth
	if job {
		maxDepth, maxPV = 14, 3
	}
	intParam := func(name string, def, lo, hi int) int {
		v := q.Get(name)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			p.Add(name, fmt.Sprintf("must be an integer from %d to %d", lo, hi))
			return def
		}
		return n
	}
	call := domain.Call{Endpoint: ep, Positions: 1}
	call.Depth = intParam("depth", defDepth, 1, maxDepth)
	call.MultiPV = intParam("multipv", 1, 1, maxPV)
	call.MoveTimeMS = intParam("movetime_ms", 0, analysis.MinMoveTime, analysis.MaxMoveTime)
	switch ep {
	case domain.EndpointBatch:
		call.Positions = intParam("items", 1, 1, 50)
	case domain.EndpointAnalyze:
		call.Positions = intParam("plies", 1, 1, 50)
	}
	for _, name := range []string{"endpoint", "depth", "multipv", "movetime_ms", "items", "plies"} {
		delete(q, name)
	}
	for name := range q {
		p.Add(name, "is not a parameter of /price")
	}
	if err := p.Err(); err != nil {
		s.writeError(w, r, err)
		return
	}
	price, err := domain.Quote(call)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"endpoint": ep, "units": price.Units, "usd": usd(price.USD),
		"cached_units": price.CachedUnits * int64(call.Positions), "cached_usd": usd(domain.USD(price.CachedUnits * int64(call.Positions))),
		"breakdown": map[string]any{
			"depth": call.Depth, "multipv": call.MultiPV, "movetime_ms": call.MoveTimeMS, "positions": call.Positions,
			"units_per_position": price.PerPosition, "cached_units_per_position": price.CachedUnits,
			"unit_usd": domain.UnitPriceUSD.StringFixed(6),
		},
	})
}
