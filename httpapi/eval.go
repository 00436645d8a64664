package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	gojson "github.com/goccy/go-json"

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
	c := cost{PriceUnits: units, PriceUSD: unitsUSDText(units), CostUSD: unitsUSDText(0)}
	if charged {
		c.CostUnits, c.CostUSD = units, c.PriceUSD
	}
	return c
}

// unitsUSDText is usd(ledger.UnitsUSD(units)), remembered: a costed call's price takes
// few values, and formatting a decimal was a measurable part of a cached answer.
func unitsUSDText(units int64) string {
	if v, ok := usdTexts.Load(units); ok {
		return v.(string)
	}
	text := usd(ledger.UnitsUSD(units))
	if usdTextsN.Add(1) <= 4096 { // bounded: past it, formatted each time
		usdTexts.Store(units, text)
	}
	return text
}

var (
	usdTexts  sync.Map // int64 units -> string
	usdTextsN atomic.Int64
)

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

// costed runs the shared path of /eval and /bestmove (docs/BILLING.md): credentials
// (optional), the request, plan caps or keyless limits, then the price reserved before
// any engine starts (a refusal spends no engine time), the Idempotency-Key claimed while
// the engine searches, the answer, and its charge settled after, off the response path.
func (s *Server) costed(w http.ResponseWriter, r *http.Request, ep domain.Endpoint, render func(*analysis.Result, cost) any) {
	stream := newEventStream(w, r) // nil: the plain JSON answer
	fail := func(err error) { s.fail(w, r, stream, err) }
	timing := newServerTiming()
	// Nothing of the body's is answered before the credentials are, and nothing is looked
	// up in the cache before the rate limits pass: a refused call costs the database
	// nothing (a flood of 429s cost a query each). When memory vouches for the key, the
	// body is read after it: a goroutine beside a check of a few microseconds cost about
	// 30 µs at concurrency 1, waking an idle core (docs/BENCHMARKS.md, session 36).
	// Otherwise it is read and checked while the key's versions are read (one round
	// trip): neither needs the other.
	var key *domain.Key
	var p prepared
	read := false
	if _, present, _ := bearer(r); present {
		var vouched bool
		var err error
		if key, vouched, err = s.authenticateVouched(r); !vouched {
			prep := make(chan prepared, 1)
			go func() { prep <- s.prepare(r, false) }()
			key, err = s.authenticateRemembered(r)
			p, read = <-prep, true
		}
		if err != nil {
			fail(err)
			return
		}
	}
	if key != nil && !key.HasScope(domain.ScopeEval) {
		fail(domain.Errorf(domain.CodeScope, "this key lacks the scope \"eval\""))
		return
	}
	scope := "ip:" + s.clientIP(r).String()
	if key != nil {
		scope = key.ID()
	}
	if !s.rateLimit(w, r, key, domain.ScopeEval) {
		return
	}
	timing.mark("auth") // the body and the cache's lookup are the request's (API.md)
	if !read {
		p = s.prepare(r, key == nil)
	}
	r.Body = io.NopCloser(bytes.NewReader(p.body)) // read again for the Idempotency-Key's hash
	idem, err := idempotencyRequest(r, scope)
	if err != nil {
		fail(err)
		return
	}
	if p.err != nil {
		fail(p.err)
		return
	}
	spec := p.spec
	// what needs no engine (a cached result, a finished game), found first so that its
	// lower price is what is reserved; a refused header reads nothing either
	known, hit, err := s.analysis.Lookup(r.Context(), spec)
	if err != nil {
		fail(err)
		return
	}
	call := domain.Call{Endpoint: ep, Depth: spec.Depth, MultiPV: spec.MultiPV, MoveTimeMS: spec.MoveTimeMS, Positions: 1}
	// The key is claimed only once the call may run (below), so a refusal here may meet
	// a retry of a call already answered, whose budget or allowance it spent, or whose
	// plan's caps were lowered since: that retry gets the first answer, charged nothing,
	// and one of a call still running is told to wait, as a claim would tell them.
	refuse := func(err error) {
		if idem != nil {
			first, lerr := s.meter.Answered(r.Context(), *idem)
			switch {
			case first != nil:
				s.replayTo(w, stream, *first)
				return
			case errors.As(lerr, new(*ledger.Refusal)):
				err = lerr
			case lerr != nil:
				s.logger.WarnContext(r.Context(), "look up Idempotency-Key after a refusal", "err", lerr)
			}
		}
		fail(err)
	}
	var reservation *ledger.Reservation
	var keyless func(answered bool)
	if key == nil {
		if spec.Depth > KeylessMaxDepth || spec.MultiPV > KeylessMaxMultiPV {
			refuse(keylessCaps(spec.Depth, spec.MultiPV))
			return
		}
		if keyless, err = s.meter.ReserveKeyless(r.Context(), s.limitAddr(r), s.keyless); err != nil {
			refuse(err)
			return
		}
	} else {
		plan := account(r.Context()).Plan()
		if err := plan.Limits().CheckCaps(plan, spec.Depth, spec.MultiPV, spec.MoveTimeMS); err != nil {
			refuse(err)
			return
		}
		reservation, err = s.meter.Reserve(r.Context(), ledger.Call{RequestID: requestID(r.Context()), Key: key,
			Account: account(r.Context()), Price: call, Cached: hit})
		if err != nil {
			refuse(err)
			return
		}
	}
	// Whatever ends this call without an answer gives back what it took: the reservation,
	// the keyless call, and the Idempotency-Key's claim (else its owner would renew it,
	// and retries be told to wait, for as long as this server lives).
	answered := false
	var claim *pendingClaim // the Idempotency-Key's, once asked for
	defer func() {
		if !answered {
			reservation.Cancel()
			if keyless != nil {
				keyless(false)
			}
			// a claim taken is given back, also when this handler panics: else this
			// server would renew it, and retries be told to wait, for as long as it lives
			if c := claim.result(); claim != nil && c.err == nil && c.first == nil {
				s.meter.Unclaim(r.Context(), *idem)
			}
		}
	}()
	timing.mark("request")

	// The Idempotency-Key's claim is written while the engine searches; a retry of a
	// finished or running request stops the search and is answered from the claim.
	ctx, stop := r.Context(), context.CancelFunc(func() {})
	if !hit || idem != nil { // something to stop: a search, or a claim that lost to a retry
		ctx, stop = context.WithCancel(r.Context())
		defer stop()
	}
	if idem != nil {
		claim = &pendingClaim{done: make(chan struct{})}
		go func() {
			defer close(claim.done)
			claim.first, claim.err = s.meter.Claim(ctx, *idem)
			if claim.err != nil || claim.first != nil {
				stop()
			}
		}()
	}
	if stream != nil {
		// A stream starts once the key is this request's: a replay is one result event.
		claim.result()
	}
	res := known
	if !hit {
		res, err = s.search(ctx, stop, spec, stream)
	}
	switch c := claim.result(); {
	case c.err != nil:
		fail(c.err)
		return
	case c.first != nil:
		s.replayTo(w, stream, *c.first)
		return
	case err != nil:
		fail(err)
		return
	}
	cached := res.Cached || res.Terminal != "" // no search ran: the cached price
	var units int64
	if reservation != nil {
		units = reservation.Units(cached)
	} else {
		price, err := ledger.Quote(call)
		if err != nil {
			fail(err)
			return
		}
		units = price.Charged(cached)
	}
	// goccy/go-json writes the JSON encoding/json does (FuzzAnswersEncodeAsEncodingJSON), faster:
	// a cached answer is mostly this
	body, err := gojson.Marshal(render(res, newCost(key != nil, units)))
	if err != nil {
		fail(err)
		return
	}
	if res.Search > 0 {
		timing.add("engine", res.Search)
	}
	timing.mark("analysis")
	if idem != nil {
		idem.Status, idem.Response = http.StatusOK, body
	}
	if reservation != nil {
		if err := reservation.Settle(ledger.Answered{Endpoint: ep, Engine: res.Engine, Path: res.Path, Cached: cached,
			Params:      ledger.Params{Depth: spec.Depth, MultiPV: spec.MultiPV, MoveTimeMS: spec.MoveTimeMS, Positions: 1, FEN: res.FEN},
			Idempotency: idem}); err != nil {
			fail(err)
			return
		}
	} else if idem != nil {
		if err := s.meter.Store(r.Context(), *idem); err != nil {
			s.logger.WarnContext(r.Context(), "store idempotent response", "err", err)
		}
	}
	answered = true
	if keyless != nil {
		keyless(true)
	}
	timing.write(w.Header())
	if stream != nil {
		stream.event("result", body) //nolint:errcheck // answered: the client went away at the last moment
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	w.Write(body) //nolint:errcheck // the client went away
	// Sent now, whole (its length is set: no chunks), rather than once this handler and
	// the middleware around it return: the access log line, the metrics and the
	// deferred clean-up run after the client has its answer.
	http.NewResponseController(w).Flush() //nolint:errcheck // the client went away
}

// keylessCaps refuses a keyless call above the keyless caps, naming each field above
// its cap with the cap (FieldError.Max).
func keylessCaps(depth, multipv int) error {
	e := domain.Errorf(domain.CodeKeylessExhausted,
		"without a key, depth is capped at %d and multipv at %d; sign up for a key (POST /v1/signup)", KeylessMaxDepth, KeylessMaxMultiPV)
	for _, c := range []struct {
		field      string
		asked, max int
	}{{"depth", depth, KeylessMaxDepth}, {"multipv", multipv, KeylessMaxMultiPV}} {
		if c.asked > c.max {
			e.Fields = append(e.Fields, domain.AboveCap(c.field, fmt.Sprintf("capped at %d without a key", c.max), c.max))
		}
	}
	return e
}

// prepared is what a costed call's request says, before its credentials are known.
type prepared struct {
	body []byte
	spec analysis.Spec
	err  error // the request's problem, answered after the credentials'
}

// prepare reads and checks a costed call's body (costed looks it up once the rate
// limits let it through). A keyless call's depth defaults to the keyless cap, so that
// a body with the defaults works without a key.
func (s *Server) prepare(r *http.Request, keyless bool) prepared {
	var p prepared
	body, err := io.ReadAll(r.Body)
	if err != nil {
		p.err = decodeReadError(err)
		return p
	}
	p.body = body
	var req analysis.Request
	if p.err = decodeBody(body, &req, false); p.err != nil {
		p.err = s.alsoInvalid(p.err, req)
		return p
	}
	if p.spec, p.err = analysis.Validate(req, s.analysis.Catalog()); p.err != nil {
		return p
	}
	if keyless && req.Depth == nil {
		p.spec.Depth = min(p.spec.Depth, KeylessMaxDepth)
	}
	return p
}

// alsoInvalid adds to a body's decoding problems (an unknown field, a wrong type, a
// member given twice) those of the fields it could read, the FEN included, so that one
// refusal names every bad field. req is what decoding filled in: each field it named
// is left out (nil), or, given twice, holds its last value.
func (s *Server) alsoInvalid(err error, req analysis.Request) error {
	if !fieldProblems(err) {
		return err
	}
	var more domain.Problems
	var de *domain.Error
	if _, verr := analysis.Validate(req, s.analysis.Catalog()); errors.As(verr, &de) {
		more = de.Fields
	}
	return withProblems(err, analysis.FENProblem(more, req))
}

// fieldProblems says whether err is a refusal of a body naming its fields, whose
// other fields can be checked too (decode filled in those it could read). A body that
// is not one JSON object (wholeBody) is refused as it is: nothing of it was read, and
// checking the empty request would add "fen: is required" to "malformed JSON".
func fieldProblems(err error) bool {
	var de *domain.Error
	return errors.As(err, &de) && de.Code == domain.CodeInvalid && len(de.Fields) > 0 && len(de.Fields) < maxProblems && !wholeBody(de)
}

// withProblems is the refusal err (see fieldProblems) with more's problems of fields
// it does not name already, up to maxProblems in all.
func withProblems(err error, more domain.Problems) error {
	var de *domain.Error
	if !errors.As(err, &de) || len(more) == 0 {
		return err
	}
	refused := func(field string) bool {
		// exactly: the decoder names a member as sent, and "DEPTH" (unknown) is not depth
		return slices.ContainsFunc(de.Fields, func(n domain.FieldError) bool { return n.Field == field })
	}
	p := domain.Problems(slices.Clone(de.Fields))
	for _, f := range more {
		if !refused(f.Field) && !consequent(refused, f) && len(p) < maxProblems {
			p = append(p, f)
		}
	}
	return p.Err()
}

// consequent says whether problem f comes only from a field the decoder refused, and
// so left at its zero value, not from what the client sent: a position refused as
// standard chess only (its reason says to set chess960) because chess960 was
// unreadable, or a job "with neither pgn nor fen" whose fen or pgn was there but of the
// wrong type.
func consequent(refused func(string) bool, f domain.FieldError) bool {
	position := f.Field == "fen" || f.Field == "pgn" || strings.HasPrefix(f.Field, "fens[")
	if position && strings.Contains(f.Reason, "chess960") && (refused("chess960") || refused("options.chess960")) {
		return true
	}
	return f.Field == "pgn" && f.Reason == noGame && (refused("fen") || refused("pgn"))
}

// pendingClaim is a costed call's Idempotency-Key claim, written while the engine
// searches.
type pendingClaim struct {
	done  chan struct{} // closed once first and err are set
	first *ledger.Stored
	err   error
}

// result waits for the claim's outcome: nothing claimed (first and err nil) for a
// request without an Idempotency-Key (c nil).
func (c *pendingClaim) result() pendingClaim {
	if c == nil {
		return pendingClaim{}
	}
	<-c.done
	return *c
}

// clientIP is the client's address: the connection's peer, or, when the peer is one
// of Config.TrustedProxies, the right-most X-Forwarded-For address that is not one
// (each proxy appends the address it saw, so a client can forge only entries to the
// left of those its proxies wrote). From any other peer X-Forwarded-For is ignored.
func (s *Server) clientIP(r *http.Request) netip.Addr {
	ip := peerIP(r)
	if !s.trusted(ip) {
		return ip
	}
	hops := r.Header.Values("X-Forwarded-For")
	for i := len(hops) - 1; i >= 0; i-- {
		list := strings.Split(hops[i], ",")
		for j := len(list) - 1; j >= 0; j-- {
			hop, err := netip.ParseAddr(strings.TrimSpace(list[j]))
			if err != nil {
				return ip // unreadable: the proxy's own address, not a guess
			}
			if hop = hop.Unmap(); !s.trusted(hop) {
				return hop
			}
			ip = hop
		}
	}
	return ip
}

func (s *Server) trusted(ip netip.Addr) bool {
	for _, p := range s.cfg.TrustedProxies {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// peerIP is the connection's peer address.
func peerIP(r *http.Request) netip.Addr {
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

// limitAddr is the address that per-address limits and the keyless allowance count:
// the client's IPv4 address, or its IPv6 address's /64, the block one subscriber
// usually gets whole (RFC 6177), so that rotating within it does not multiply them.
func (s *Server) limitAddr(r *http.Request) netip.Addr {
	ip := s.clientIP(r)
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.Addr()
	}
	return ip
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
			vj.Paths = append(vj.Paths, pathJSON{Path: p.Path, Name: p.Name, NNUE: p.NNUE, Options: analysis.OptionSchema(cat, p)})
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
			"keyless":     map[string]int{"calls_per_day": s.keyless, "max_depth": KeylessMaxDepth, "max_multipv": KeylessMaxMultiPV},
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
	// A parameter the endpoint's calls cannot have is refused, not ignored: a quote
	// with movetime_ms for a job (jobs take none) priced a call that cannot be made.
	applies := map[string]bool{"movetime_ms": !job, "items": ep == domain.EndpointBatch, "plies": ep == domain.EndpointAnalyze}
	for _, name := range []string{"movetime_ms", "items", "plies"} {
		if ok && !applies[name] && q.Has(name) {
			p.Add(name, fmt.Sprintf("does not apply to endpoint %s", ep))
		}
	}
	call := domain.Call{Endpoint: ep, Positions: 1}
	call.Depth = intParam("depth", defDepth, 1, maxDepth)
	call.MultiPV = intParam("multipv", 1, 1, maxPV)
	if !job {
		call.MoveTimeMS = intParam("movetime_ms", 0, analysis.MinMoveTime, analysis.MaxMoveTime)
	}
	switch ep {
	case domain.EndpointBatch:
		call.Positions = intParam("items", 1, 1, 50)
	case domain.EndpointAnalyze:
		call.Positions = intParam("plies", 1, 1, 50)
	}
	if err := p.Err(); err != nil {
		s.writeError(w, r, err)
		return
	}
	price, err := ledger.Quote(call)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"endpoint": ep, "units": price.Units, "usd": usd(price.USD),
		"cached_units": price.Charged(true), "cached_usd": usd(ledger.UnitsUSD(price.Charged(true))),
		"breakdown": map[string]any{
			"depth": call.Depth, "multipv": call.MultiPV, "movetime_ms": call.MoveTimeMS, "positions": call.Positions,
			"units_per_position": price.PerPosition, "cached_units_per_position": price.CachedUnits,
			"unit_usd": ledger.UnitPriceUSD.StringFixed(6),
		},
	})
}
