package ucibridge

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"chessd/client"
	"chessd/domain/position"
)

// Config is where the bridge sends its searches. The GUI may change both with the
// Server and Key options.
type Config struct {
	Server string // the API's base address, http://host:port/v1
	Key    string // empty: the keyless allowance
	// HTTP is the client for the API; nil: one without a timeout (a stream lasts as
	// long as its search).
	HTTP *http.Client
}

// stopGrace is how long a `stop` that arrives before the first depth is complete waits
// for it: a move from a real search is worth a moment; after that the first legal move
// is played.
const stopGrace = 5 * time.Second

// Bridge is one UCI session: one GUI on one pair of streams.
type Bridge struct {
	cfg     Config
	out     *lineWriter
	debug   bool
	set     map[string]string // options the GUI set, by lower-case name
	offered []option          // what `uci` announced
	engines *client.Engines   // GET /engines, fetched once per server
	caps    *limits           // what a search may ask, fetched once per server and key
	pos     *position.Position
	cur     *search
}

// New is a bridge to the service cfg names.
func New(cfg Config) *Bridge {
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{}
	}
	cfg.Server = client.ServerURL(cfg.Server)
	return &Bridge{cfg: cfg, set: map[string]string{}}
}

// Run reads UCI commands from in and answers on out until `quit`, the end of in, or
// ctx ends. A running search is stopped (and not charged) on the way out.
func (b *Bridge) Run(ctx context.Context, in io.Reader, out io.Writer) error {
	b.out = &lineWriter{w: out}
	b.pos = startPos()
	lines := make(chan string)
	done := make(chan struct{})
	defer close(done)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), 1<<20) // a long game's `position ... moves`
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-done:
				return
			}
		}
	}()
	defer b.stopSearch()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case line, ok := <-lines:
			if !ok || b.handle(ctx, line) {
				return nil
			}
		}
	}
}

// handle runs one command; true means quit.
func (b *Bridge) handle(ctx context.Context, line string) bool {
	c, err := Parse(line)
	if errors.Is(err, errEmpty) {
		return false
	}
	if err != nil {
		b.out.printf("info string %s", err)
		return false
	}
	switch c.Kind {
	case CmdUCI:
		b.uci(ctx)
	case CmdDebug:
		b.debug = c.On
	case CmdIsReady:
		b.out.printf("readyok") // nothing is ever pending that must finish first
	case CmdSetOption:
		b.setOption(c.Name, c.Value)
	case CmdNewGame:
		b.stopSearch()
		b.pos = startPos()
	case CmdPosition:
		b.stopSearch()
		b.position(c.FEN, c.Moves)
	case CmdGo:
		b.stopSearch()
		b.goSearch(ctx, c.Go)
	case CmdStop:
		b.stopSearch()
	case CmdPonderHit:
		if b.cur != nil {
			b.cur.release()
		}
	case CmdQuit:
		return true
	}
	return false
}

func (b *Bridge) api() (*client.ClientWithResponses, error) {
	return client.NewClientWithResponses(b.server(), client.WithHTTPClient(b.cfg.HTTP), client.WithKey(b.key()))
}

func (b *Bridge) server() string {
	if s, ok := b.set["server"]; ok && s != "" {
		return client.ServerURL(s)
	}
	return b.cfg.Server
}

func (b *Bridge) key() string {
	if k, ok := b.set["key"]; ok {
		return k
	}
	return b.cfg.Key
}

// uci announces the engine and its options (those of GET /engines).
func (b *Bridge) uci(ctx context.Context) {
	name := "chessd"
	if e, err := b.fetchEngines(ctx); err != nil {
		b.out.printf("info string cannot read the engines of %s: %s", b.server(), err)
	} else {
		for _, v := range e.Versions {
			if v.Id == e.Default {
				name = "chessd " + v.Name
			}
		}
	}
	b.offered = optionsOf(b.engines, b.server())
	b.out.printf("id name %s", name)
	b.out.printf("id author the Stockfish developers; hosted by chessd")
	for _, o := range b.offered {
		b.out.printf("%s", o.line())
	}
	b.out.printf("uciok")
}

func (b *Bridge) fetchEngines(ctx context.Context) (*client.Engines, error) {
	if b.engines != nil {
		return b.engines, nil
	}
	api, err := b.api()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := api.ListEnginesWithResponse(ctx, nil)
	if err != nil {
		return nil, err
	}
	if err := client.Check(res.HTTPResponse, res.Body); err != nil {
		return nil, err
	}
	b.engines = res.JSON200
	return b.engines, nil
}

func (b *Bridge) setOption(name, value string) {
	lower := strings.ToLower(name)
	if b.offered == nil {
		b.offered = optionsOf(b.engines, b.server())
	}
	var o *option
	for i := range b.offered {
		if strings.ToLower(b.offered[i].name) == lower {
			o = &b.offered[i]
		}
	}
	if o == nil {
		b.out.printf("info string unknown option %q", clip(name))
		return
	}
	switch o.typ {
	case "spin":
		n, err := strconv.Atoi(value)
		if err != nil || n < o.min || n > o.max {
			b.out.printf("info string %s: %q is not a number from %d to %d", o.name, clip(value), o.min, o.max)
			return
		}
	case "check":
		if value != "true" && value != "false" {
			b.out.printf("info string %s: %q is not true or false", o.name, clip(value))
			return
		}
	case "combo":
		if !contains(o.vars, value) {
			b.out.printf("info string %s: %q is not one of %s", o.name, clip(value), strings.Join(o.vars, ", "))
			return
		}
	}
	if value == "<empty>" {
		value = ""
	}
	b.set[lower] = value
	switch lower {
	case "server":
		b.engines, b.caps = nil, nil
	case "key":
		b.caps = nil
	case "uci_chess960":
		b.pos = startPos() // the GUI sends the position again in the new mode
	}
}

// position sets up the position the next `go` searches.
func (b *Bridge) position(fen string, moves []string) {
	chess960 := b.set["uci_chess960"] == "true"
	if fen == "" {
		fen = startFEN
	}
	pos, err := position.Parse(fen, chess960)
	for i := 0; err == nil && i < len(moves); i++ {
		pos, _, err = pos.Play(moves[i])
	}
	if err != nil {
		b.out.printf("info string position: %s", err)
		b.pos = nil
		return
	}
	b.pos = pos
}

const startFEN = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"

func startPos() *position.Position {
	p, err := position.Parse(startFEN, false)
	if err != nil {
		panic(err) // the start position parses
	}
	return p
}

// limits are what a search may ask of the service: the plan's caps (GET /me) within
// the service's limits (GET /engines), or the keyless caps.
type limits struct {
	depth, multipv, movetime int
}

func (b *Bridge) limits(ctx context.Context) limits {
	if b.caps != nil {
		return *b.caps
	}
	l := limits{depth: 30, multipv: 10, movetime: 60000}
	if e, err := b.fetchEngines(ctx); err == nil {
		l = limits{depth: e.Limits.Depth.Max, multipv: e.Limits.Multipv.Max, movetime: e.Limits.MovetimeMs.Max}
		if b.key() == "" {
			l.depth, l.multipv = e.Limits.Keyless.MaxDepth, e.Limits.Keyless.MaxMultipv
		}
	}
	if b.key() != "" {
		// GET /me needs `usage:read`; a key without it keeps the service's limits, and a
		// search above its plan's caps is refused with 402 (told as info string).
		if api, err := b.api(); err == nil {
			mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			res, err := api.GetMeWithResponse(mctx, nil)
			cancel()
			if err == nil && res.JSON200 != nil {
				c := res.JSON200.Caps
				l.depth, l.multipv, l.movetime = min(l.depth, c.MaxDepth), min(l.multipv, c.MaxMultipv), min(l.movetime, c.MaxMovetimeMs)
			}
		}
	}
	b.caps = &l
	return l
}

// request turns `go` into the service's search: a depth (the deepest allowed when the
// GUI gave none), a movetime for movetime and the clocks, MultiPV and the engine
// options the GUI set. `infinite`, `ponder`, `nodes`, `mate` and a bare `go` search to
// the deepest depth allowed (the service bounds every search at 60 s).
func request(fen string, g Go, set map[string]string, offered []option, l limits, blackToMove bool) client.EvalRequest {
	req := client.EvalRequest{Fen: fen}
	depth := l.depth
	if g.Depth > 0 {
		depth = min(g.Depth, l.depth)
	}
	req.Depth = &depth
	movetime := 0
	switch {
	case g.MoveTime > 0:
		movetime = g.MoveTime
	case g.TimeControl() && !g.Infinite:
		movetime = budget(g, blackToMove)
	}
	if movetime > 0 {
		movetime = max(50, min(movetime, l.movetime))
		req.MovetimeMs = &movetime
	}
	if v, ok := set["multipv"]; ok {
		n, _ := strconv.Atoi(v)
		n = max(1, min(n, l.multipv))
		req.Multipv = &n
	}
	if v := set["engine"]; v != "" {
		req.Engine = &v
	}
	if v := set["path"]; v != "" {
		p := client.EnginePathChoice(v)
		req.Path = &p
	}
	opts := map[string]any{}
	for _, o := range offered {
		v, ok := set[strings.ToLower(o.name)]
		if !ok || o.service == "" {
			continue
		}
		if o.typ == "check" {
			opts[o.service] = v == "true"
		} else if n, err := strconv.Atoi(v); err == nil {
			opts[o.service] = n
		}
	}
	// UCI_Elo counts only with UCI_LimitStrength; the service reads elo as asking for it.
	if opts["limit_strength"] != true {
		delete(opts, "elo")
	}
	if len(opts) > 0 {
		raw, _ := json.Marshal(opts)
		json.Unmarshal(raw, &req.Options) //nolint:errcheck // the fields are the options' own
	}
	return req
}

// budget is the thinking time for a move under the GUI's clocks: an even share of
// what is left (30 moves when movestogo is not given) plus most of the increment,
// never more than half the clock, less 50 ms for the network.
func budget(g Go, blackToMove bool) int {
	left, inc := g.WTime, g.WInc
	if blackToMove {
		left, inc = g.BTime, g.BInc
	}
	moves := g.MovesToGo
	if moves <= 0 {
		moves = 30
	}
	t := min(left/moves+inc*3/4, left/2) - 50
	return max(t, 1)
}

// search is the running `go`.
type search struct {
	stopOnce, releaseOnce sync.Once
	stop                  chan struct{} // closed by `stop` (or a new command that needs the engine)
	released              chan struct{} // closed by `ponderhit`: a held bestmove may be told
	done                  chan struct{} // closed once bestmove is written
}

func (s *search) halt()    { s.stopOnce.Do(func() { close(s.stop) }) }
func (s *search) release() { s.releaseOnce.Do(func() { close(s.released) }) }

// stopSearch stops the running search, if any, and waits for its bestmove.
func (b *Bridge) stopSearch() {
	if b.cur == nil {
		return
	}
	b.cur.halt()
	<-b.cur.done
	b.cur = nil
}

func (b *Bridge) goSearch(ctx context.Context, g Go) {
	if b.pos == nil {
		b.out.printf("info string no valid position: send position first")
		b.out.printf("%s", bestMoveLine("", ""))
		return
	}
	pos := b.pos
	switch pos.Status() {
	case position.Checkmate:
		b.out.printf("info depth 0 score mate 0")
		b.out.printf("%s", bestMoveLine("", ""))
		return
	case position.Stalemate:
		b.out.printf("info depth 0 score cp 0")
		b.out.printf("%s", bestMoveLine("", ""))
		return
	}
	api, err := b.api()
	if err != nil {
		b.out.printf("info string %s", err)
		b.out.printf("%s", bestMoveLine("", ""))
		return
	}
	black := pos.SideToMove() == position.Black
	req := request(pos.FEN(), g, b.set, b.offered, b.limits(ctx), black)
	if b.debug {
		raw, _ := json.Marshal(req)
		b.out.printf("info string POST %s/eval %s", b.server(), raw)
	}
	s := &search{stop: make(chan struct{}), released: make(chan struct{}), done: make(chan struct{})}
	b.cur = s
	go b.run(ctx, api, s, req, pos, g.Infinite || g.Ponder, b.debug)
}

// run streams one search: an info line per line of each completed depth, then
// bestmove. hold keeps bestmove until stop or ponderhit (infinite, ponder). A stop
// before the answer leaves the stream: the service stops the search and charges
// nothing.
func (b *Bridge) run(ctx context.Context, api *client.ClientWithResponses, s *search, req client.EvalRequest, pos *position.Position, hold, debug bool) {
	defer close(s.done)
	black := pos.SideToMove() == position.Black
	showWDL := req.Options != nil && req.Options.ShowWdl != nil && *req.Options.ShowWdl
	reqCtx, cancel := context.WithCancel(ctx)
	defer cancel()

	events := make(chan client.StreamEvent, 64)
	ended := make(chan error, 1)
	go func() {
		res, err := api.Eval(reqCtx, nil, req, client.Accept(client.MediaNDJSON))
		if err == nil {
			err = client.ReadStream(res, func(ev client.StreamEvent) error {
				select {
				case events <- ev:
					return nil
				case <-reqCtx.Done():
					return reqCtx.Err()
				}
			})
		}
		ended <- err
	}()

	var best, ponder string
	lastDepth := 0
	failed := false
	stopped := false
	var grace <-chan time.Time
	stop := s.stop // nil once seen
	// handle takes one event; true when the search is over.
	handle := func(ev client.StreamEvent) bool {
		switch ev.Event {
		case "depth":
			var d client.DepthProgress
			if json.Unmarshal(ev.Data, &d) != nil || len(d.Pvs) == 0 {
				return false
			}
			stats := depthStats{depth: d.Depth, seldepth: d.Seldepth, nodes: d.Nodes, nps: d.Nps, timeMS: d.TimeMs}
			for _, pv := range d.Pvs {
				b.out.printf("%s", infoLine(pv, stats, black, showWDL))
			}
			lastDepth = d.Depth
			best, ponder = lineMoves(d.Pvs[0])
			return stopped // a stop was waiting for this first depth
		case "result":
			var r client.Evaluation
			if err := json.Unmarshal(ev.Data, &r); err != nil {
				b.out.printf("info string unreadable answer: %s", err)
				failed = true
				return true
			}
			if r.Depth > lastDepth && r.Pvs != nil { // a cached answer streams no depths
				stats := depthStats{depth: r.Depth, seldepth: r.Seldepth, nodes: r.Nodes, timeMS: r.TimeMs}
				if r.TimeMs > 0 {
					stats.nps = r.Nodes * 1000 / r.TimeMs
				}
				for _, pv := range *r.Pvs {
					b.out.printf("%s", infoLine(pv, stats, black, showWDL))
				}
			}
			if r.Bestmove != nil {
				best, ponder = *r.Bestmove, ""
				if r.Ponder != nil {
					ponder = *r.Ponder
				}
			}
			if debug {
				b.out.printf("info string charged %d units (%s USD)", r.CostUnits, r.CostUsd)
			}
			return true
		case "error":
			var p client.Problem
			json.Unmarshal(ev.Data, &p) //nolint:errcheck // shown as far as it reads
			b.out.printf("info string %s", p.Error())
			failed = true
			return true
		}
		return false
	}

	for over := false; !over; {
		select {
		case ev := <-events:
			over = handle(ev)
		case err := <-ended:
			// every event was queued before the stream ended
			for len(events) > 0 && !over {
				over = handle(<-events)
			}
			if !over {
				if err != nil && !errors.Is(err, context.Canceled) {
					b.out.printf("info string %s", err)
				}
				failed = best == ""
				over = true
			}
		case <-stop:
			stop = nil
			stopped = true
			if best != "" {
				over = true
			} else {
				grace = time.After(stopGrace)
			}
		case <-grace:
			over = true
		}
	}
	cancel() // leaves the stream if the answer has not come: no charge

	if hold && !stopped {
		select { // UCI: bestmove only after stop or ponderhit
		case <-s.stop:
		case <-s.released:
		case <-ctx.Done():
		}
	}
	if best == "" && !failed {
		if ms := pos.LegalMoves(); len(ms) > 0 {
			best = ms[0].UCI // stopped before the first depth: any legal move
		}
	}
	b.out.printf("%s", bestMoveLine(best, ponder))
}

// lineMoves is a line's first move and the reply it expects.
func lineMoves(pv client.PV) (best, ponder string) {
	if pv.Moves == nil || len(*pv.Moves) == 0 {
		return "", ""
	}
	m := *pv.Moves
	if len(m) > 1 {
		return m[0], m[1]
	}
	return m[0], ""
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// lineWriter writes whole lines to the GUI from the command loop and the search.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, format+"\n", args...) //nolint:errcheck // a GUI that left reads nothing
}
