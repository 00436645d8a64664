package ucibridge

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
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
	// HTTP is the client for the API; nil: httpClient's.
	HTTP *http.Client
}

// Bridge is one UCI session: one GUI on one pair of streams.
type Bridge struct {
	cfg     Config
	out     *lineWriter
	debug   bool
	set     map[string]string // options the GUI set, by lower-case name
	offered []option          // what `uci` announced (or the Server option's server offers)
	pos     *position.Position
	posErr  error        // why pos is nil: the last position line could not be read or played
	cur     *search      // the last search started; its bestmove may still be to come
	lines   <-chan input // the GUI's lines; nil once they ended
	queued  []input      // lines read while the command loop awaited a lookup: run next

	// Searches read and learn these beside the command loop, which only resets them.
	mu      sync.Mutex
	gen     int             // counts Server and Key changes: what older reads found is dropped
	engines *client.Engines // GET /engines, once read for this server
	caps    *limits         // GET /engines and GET /me, once both answered for this server and key
	learned limits          // caps the service named when it refused a search (0: none)
	lowered string          // the last lowering told (lowering's note) for this server and key
}

// New is a bridge to the service cfg names.
func New(cfg Config) *Bridge {
	if cfg.HTTP == nil {
		cfg.HTTP = client.HTTPClient()
	}
	cfg.Server = client.ServerURL(cfg.Server)
	return &Bridge{cfg: cfg, set: map[string]string{}}
}

// Run reads UCI commands from in and answers on out until `quit`, the end of in, or
// ctx ends. A running search is left on the way out, without a bestmove (UCI: quit
// means exit as soon as possible): its request is cancelled, so the service stops the
// engine and charges nothing.
func (b *Bridge) Run(ctx context.Context, in io.Reader, out io.Writer) error {
	b.out = &lineWriter{w: out}
	ctx, quit := context.WithCancel(ctx) // the searches run under it
	b.pos = startPos()
	lines := make(chan input)
	done := make(chan struct{})
	defer close(done)
	go func() {
		defer close(lines)
		r := bufio.NewReaderSize(in, 64<<10)
		for {
			l, err := readLine(r)
			if err != nil {
				return
			}
			select {
			case lines <- l:
			case <-done:
				return
			}
		}
	}()
	defer func() { // every search is left; the last ends after every earlier one
		quit()
		if b.cur != nil {
			<-b.cur.done
		}
	}()
	b.lines = lines
	for {
		if len(b.queued) == 0 {
			if b.lines == nil { // ended while a lookup was awaited
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case line, ok := <-b.lines:
				if !ok {
					return nil
				}
				b.queued = append(b.queued, line)
			}
		}
		line := b.queued[0]
		b.queued = b.queued[1:]
		if b.handle(ctx, line) {
			return ctx.Err()
		}
	}
}

// maxLine is the most of a line the bridge reads (a long game's `position … moves` is
// far shorter); the rest of a longer line is skipped.
const maxLine = 1 << 20

// input is one line from the GUI; cut: it was longer than maxLine, and text is its
// beginning.
type input struct {
	text string
	cut  bool
}

// readLine reads a line without its "\n" or "\r\n", keeping at most maxLine bytes of
// it. A last line without "\n" is a line too.
func readLine(r *bufio.Reader) (input, error) {
	var line []byte
	cut := false
	for {
		chunk, err := r.ReadSlice('\n')
		chunk = bytes.TrimSuffix(chunk, []byte("\n"))
		if !cut {
			if room := maxLine - len(line); len(chunk) > room {
				chunk, cut = chunk[:room], true
			}
			line = append(line, chunk...)
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
		case err != nil:
			return input{}, err
		}
		return input{text: string(bytes.TrimSuffix(line, []byte("\r"))), cut: cut}, nil
	}
}

// handle runs one command; true means quit. Of a line longer than maxLine only its
// beginning is read (UCI: what cannot be read is ignored): a position line, or one
// whose command is not read, leaves no position (the GUI's is not the one before);
// a go is searched without the rest, a GUI waits for its bestmove.
func (b *Bridge) handle(ctx context.Context, in input) bool {
	line := in.text
	if in.cut { // its last word may be cut short
		line = line[:strings.LastIndexAny(line, " \t")+1]
	}
	c, err := Parse(line)
	if in.cut {
		cutErr := fmt.Errorf("a line longer than 1 MiB ignored (%q)", clip(in.text))
		switch {
		case errors.Is(err, errEmpty):
			b.out.printf("info string %s", cutErr)
			b.pos, b.posErr = nil, cutErr
			return false
		case c.Kind == CmdGo:
			err = errors.Join(err, errors.New("go: a line longer than 1 MiB: what it held past 1 MiB is ignored"))
		default:
			err = cutErr
		}
	}
	if errors.Is(err, errEmpty) {
		return false
	}
	// A go is searched without what could not be read (its search tells it): a GUI
	// waits for bestmove.
	if err != nil && c.Kind != CmdGo {
		b.out.printf("info string %s", err)
		if c.Kind == CmdPosition { // the GUI's position is not the one before: none to search
			b.stopSearch()
			b.pos, b.posErr = nil, err
		}
		return false
	}
	switch c.Kind {
	case CmdUCI:
		return b.uci(ctx)
	case CmdDebug:
		b.debug = c.On
	case CmdIsReady:
		b.out.printf("readyok") // searches and their lookups run beside the command loop
	case CmdSetOption:
		return b.setOption(ctx, c.Name, c.Value)
	case CmdNewGame:
		b.stopSearch()
		b.pos = startPos()
	case CmdPosition:
		b.stopSearch()
		b.position(c.FEN, c.Moves)
	case CmdGo:
		b.stopSearch()
		b.goSearch(ctx, c.Go, err)
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
	return b.apiFor(b.server(), b.key())
}

func (b *Bridge) apiFor(server, key string) (*client.ClientWithResponses, error) {
	return client.NewClientWithResponses(server, client.WithHTTPClient(b.cfg.HTTP), client.WithKey(key))
}

func (b *Bridge) server() string {
	if s, ok := b.set["server"]; ok && s != "" {
		return client.ServerURL(s)
	}
	return b.cfg.Server
}

// key is the Key option's, or the configured key when it is empty: its announced
// default, which GUIs send back at start or on "reset to defaults".
func (b *Bridge) key() string {
	if k := b.set["key"]; k != "" {
		return k
	}
	return b.cfg.Key
}

// uci announces the engine and its options: those of GET /engines, or without it only
// the bridge's own (MultiPV, Server, Key), which need no engine list. true: quit.
func (b *Bridge) uci(ctx context.Context) bool {
	name := "chessd"
	e, quit, err := b.engineList(ctx)
	if quit {
		return true
	}
	if err != nil {
		b.out.printf("info string cannot read the engines of %s: %s; offering MultiPV, Server and Key only", b.server(), err)
	} else {
		for _, v := range e.Versions {
			if v.Id == e.Default {
				name = "chessd " + v.Name
			}
		}
	}
	b.offered = optionsOf(e, b.server())
	b.out.printf("id name %s", name)
	b.out.printf("id author the Stockfish developers; hosted by chessd")
	for _, o := range b.offered {
		b.out.printf("%s", o.line())
	}
	b.out.printf("uciok")
	return false
}

// lookupWait is how long the command loop waits for GET /engines (`uci`, `setoption
// name Server`): GUIs wait only a few seconds for uciok.
const lookupWait = 2 * time.Second

// engineList is GET /engines of the current server, for the command loop: read beside
// it and awaited up to lookupWait (a read that answers later is kept for the
// searches). quit: the GUI quit meanwhile.
func (b *Bridge) engineList(ctx context.Context) (e *client.Engines, quit bool, err error) {
	api, err := b.api()
	if err != nil {
		return nil, false, err
	}
	var got struct {
		e   *client.Engines
		err error
	}
	done := make(chan struct{})
	go func(gen int) {
		defer close(done)
		got.e, got.err = b.fetchEngines(ctx, api, gen)
	}(b.gen)
	if b.await(ctx, done) {
		return nil, true, nil
	}
	select {
	case <-done:
		return got.e, false, got.err
	default:
		return nil, false, fmt.Errorf("no answer within %s", lookupWait)
	}
}

// await waits up to lookupWait for done, reading the GUI's lines meanwhile: they run
// after it, but `quit` (UCI: exit as soon as possible) ends the wait. true: quit.
func (b *Bridge) await(ctx context.Context, done <-chan struct{}) bool {
	timeout := time.After(lookupWait)
	for {
		select {
		case <-done:
			return false
		case <-timeout:
			return false
		case <-ctx.Done():
			return true
		case line, ok := <-b.lines:
			if !ok {
				b.lines = nil // the lines read still run
				continue
			}
			if c, err := Parse(line.text); err == nil && c.Kind == CmdQuit && !line.cut {
				return true
			}
			b.queued = append(b.queued, line)
		}
	}
}

// fetchEngines is GET /engines, read once per server; gen is the session's when the
// caller chose api (a read for a server since left is not kept).
func (b *Bridge) fetchEngines(ctx context.Context, api *client.ClientWithResponses, gen int) (*client.Engines, error) {
	b.mu.Lock()
	e := b.engines
	b.mu.Unlock()
	if e != nil {
		return e, nil
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
	if res.JSON200 == nil {
		return nil, errors.New("GET /engines: no engine list in the answer")
	}
	b.mu.Lock()
	if b.gen == gen {
		b.engines = res.JSON200
	}
	b.mu.Unlock()
	return res.JSON200, nil
}

// setOption sets an option the bridge offers; true: quit (while a new Server's
// options were read).
func (b *Bridge) setOption(ctx context.Context, name, value string) bool {
	lower := strings.ToLower(name)
	if b.offered == nil {
		b.mu.Lock()
		b.offered = optionsOf(b.engines, b.server())
		b.mu.Unlock()
	}
	var o *option
	for i := range b.offered {
		if strings.ToLower(b.offered[i].name) == lower {
			o = &b.offered[i]
		}
	}
	if o == nil {
		b.out.printf("info string unknown option %q", clip(name))
		return false
	}
	switch o.typ {
	case "spin":
		n, err := strconv.Atoi(value)
		if err != nil || n < o.min || n > o.max {
			b.out.printf("info string %s: %q is not a number from %d to %d", o.name, clip(value), o.min, o.max)
			return false
		}
	case "check":
		if value != "true" && value != "false" {
			b.out.printf("info string %s: %q is not true or false", o.name, clip(value))
			return false
		}
	case "combo":
		if !contains(o.vars, value) {
			b.out.printf("info string %s: %q is not one of %s", o.name, clip(value), strings.Join(o.vars, ", "))
			return false
		}
	}
	if value == "<empty>" {
		value = ""
	}
	b.set[lower] = value
	switch lower {
	case "server", "key":
		b.mu.Lock()
		b.gen++
		b.caps, b.learned, b.lowered = nil, limits{}, ""
		if lower == "server" {
			b.engines = nil
		}
		b.mu.Unlock()
		if lower == "server" { // the options are the new server's (as `uci` reads them)
			e, quit, err := b.engineList(ctx)
			if quit {
				return true
			}
			if err != nil {
				b.out.printf("info string cannot read the engines of %s: %s; offering MultiPV, Server and Key only", b.server(), err)
			}
			b.offered = optionsOf(e, b.server())
		}
	case "uci_chess960":
		b.pos = startPos() // the GUI sends the position again in the new mode
	}
	return false
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
		err = fmt.Errorf("position: %w", err)
		b.out.printf("info string %s", err)
		b.pos, b.posErr = nil, err
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
// the service's limits (GET /engines), or the keyless caps; 0 in learned: not known.
type limits struct {
	depth, multipv, movetime int
}

// The service's limits and the keyless caps when GET /engines does not answer (its
// documented values); a refusal teaches the real ones.
var (
	serviceLimits = limits{depth: 30, multipv: 10, movetime: 60000}
	keylessLimits = limits{depth: 12, multipv: 3, movetime: 60000}
)

// within is l lowered to m's known (non-zero) caps.
func (l limits) within(m limits) limits {
	low := func(a, b int) int {
		if b > 0 {
			return min(a, b)
		}
		return a
	}
	return limits{low(l.depth, m.depth), low(l.multipv, m.multipv), low(l.movetime, m.movetime)}
}

// limits is what a search with key may ask. The reads are cached only once both got an
// answer (a failed one is tried again at the next `go`); gen is the session's when the
// search began.
func (b *Bridge) limits(ctx context.Context, api *client.ClientWithResponses, key string, gen int) limits {
	b.mu.Lock()
	caps, learned := b.caps, b.learned
	b.mu.Unlock()
	if caps == nil {
		l, ok := b.readLimits(ctx, api, key, gen)
		if ok {
			b.mu.Lock()
			if b.gen == gen {
				b.caps = &l
			}
			b.mu.Unlock()
		}
		caps = &l
	}
	return caps.within(learned)
}

func (b *Bridge) readLimits(ctx context.Context, api *client.ClientWithResponses, key string, gen int) (limits, bool) {
	l := serviceLimits
	if key == "" {
		l = keylessLimits
	}
	e, err := b.fetchEngines(ctx, api, gen)
	ok := err == nil
	if ok {
		l = limits{depth: e.Limits.Depth.Max, multipv: e.Limits.Multipv.Max, movetime: e.Limits.MovetimeMs.Max}
		if key == "" {
			l.depth, l.multipv = e.Limits.Keyless.MaxDepth, e.Limits.Keyless.MaxMultipv
		}
	}
	if key != "" {
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		res, err := api.GetMeWithResponse(mctx, nil)
		cancel()
		switch {
		case err == nil && res.JSON200 != nil:
			c := res.JSON200.Caps
			l.depth, l.multipv, l.movetime = min(l.depth, c.MaxDepth), min(l.multipv, c.MaxMultipv), min(l.movetime, c.MaxMovetimeMs)
		case err == nil && res.StatusCode() == http.StatusForbidden:
			// no `usage:read` (an eval-only key): an answer too; a search above the
			// plan's caps is refused with 402, and lowered() learns them from it
		default:
			ok = false
		}
	}
	return l, ok
}

// lowered is what to ask after p refused req, asked within l: l with the caps p names
// (errors[].max of a refusal above a plan's or the keyless cap). false: p names no cap
// (a plan-limit 402 without one is the daily allowance used up, which nothing lower
// answers), or nothing lower is known.
func lowered(p *client.Problem, l limits) (limits, bool) {
	if p.Status != http.StatusPaymentRequired || p.Errors == nil {
		return l, false
	}
	next := l
	for _, e := range *p.Errors {
		if e.Max == nil {
			continue
		}
		switch e.Field {
		case "depth":
			next.depth = *e.Max
		case "multipv":
			next.multipv = *e.Max
		case "movetime_ms":
			next.movetime = *e.Max
		}
	}
	next = l.within(next)
	return next, next != l && next.depth > 0 && next.multipv > 0 && next.movetime > 0
}

// learn keeps caps the service named for the rest of the session (for this server and
// key), so that later searches ask within them at once.
func (b *Bridge) learn(gen int, l limits) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gen == gen {
		b.learned = l.within(b.learned)
	}
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
	if movetime := askedTime(g, blackToMove); movetime > 0 {
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

// askedTime is the search time a `go` asks for in ms: its movetime, or the budget of
// its clocks (not for infinite); 0: none.
func askedTime(g Go, blackToMove bool) int {
	switch {
	case g.MoveTime > 0:
		return g.MoveTime
	case g.TimeControl() && !g.Infinite:
		return budget(g, blackToMove)
	}
	return 0
}

// clock is the side to move's time left and increment.
func clock(g Go, blackToMove bool) (left, inc int) {
	if blackToMove {
		return g.BTime, g.BInc
	}
	return g.WTime, g.WInc
}

// budget is the thinking time for a move under the GUI's clocks: an even share of
// what is left (30 moves when movestogo is not given) plus most of the increment,
// never more than half the clock, less 50 ms for the network.
func budget(g Go, blackToMove bool) int {
	left, inc := clock(g, blackToMove)
	moves := g.MovesToGo
	if moves <= 0 {
		moves = 30
	}
	t := min(left/moves+inc*3/4, left/2) - 50
	return max(t, 1)
}

// deadlineMargin is how long past its own time a timed search's answer is waited for
// (the network, the service's queue): a stalled stream or a hung engine must not lose
// the GUI's game on time. With a short clock it shrinks, but not below
// shortClockMargin: less would take a real answer's round trip for a stall.
const (
	deadlineMargin   = time.Second
	shortClockMargin = 250 * time.Millisecond
)

// timeLimit is how long a timed `go` may take to answer (0: no limit, for infinite and
// a go without a time): the time asked of the service plus deadlineMargin, under the
// clocks no more than half the time left (what budget allows at most) but with at
// least shortClockMargin. A ponder search's clock runs from ponderhit.
func timeLimit(g Go, blackToMove bool) time.Duration {
	ms := askedTime(g, blackToMove)
	if ms <= 0 || g.Infinite {
		return 0
	}
	asked := time.Duration(max(50, min(ms, serviceLimits.movetime))) * time.Millisecond
	margin := deadlineMargin
	if g.TimeControl() {
		left, _ := clock(g, blackToMove)
		margin = max(shortClockMargin, min(margin, time.Duration(left)*time.Millisecond/2-asked))
	}
	return asked + margin
}

// search is one `go`: it runs beside the command loop, which goes on answering
// (isready, stop, …), and writes its info lines and bestmove itself.
type search struct {
	stopOnce, releaseOnce sync.Once
	stop                  chan struct{} // closed by `stop` (or a new command that needs the engine)
	released              chan struct{} // closed by `ponderhit`: a held bestmove may be told
	done                  chan struct{} // closed once bestmove is written
	prev                  *search       // the search before: its bestmove is written first
	// limit is timeLimit's; deadline fires when it is up, counted from `go` (from
	// ponderhit for ponder: answer arms it then). nil: none (yet).
	limit    time.Duration
	deadline <-chan time.Time
}

func (s *search) halt()    { s.stopOnce.Do(func() { close(s.stop) }) }
func (s *search) release() { s.releaseOnce.Do(func() { close(s.released) }) }

// stopSearch stops the running search, if any, without waiting for its bestmove (it
// comes at once): the next search writes nothing before it.
func (b *Bridge) stopSearch() {
	if b.cur != nil {
		b.cur.halt()
	}
}

// job is what a search needs of the session, taken when `go` came.
type job struct {
	g           Go
	unread      error // what the go line held that could not be read
	pos         *position.Position
	posErr      error
	set         map[string]string
	offered     []option
	server, key string
	gen         int
	debug       bool
}

func (b *Bridge) goSearch(ctx context.Context, g Go, unread error) {
	j := job{g: g, unread: unread, pos: b.pos, posErr: b.posErr, set: maps.Clone(b.set), offered: b.offered,
		server: b.server(), key: b.key(), gen: b.gen, debug: b.debug}
	s := &search{stop: make(chan struct{}), released: make(chan struct{}), done: make(chan struct{}), prev: b.cur}
	if b.pos != nil {
		s.limit = timeLimit(g, b.pos.SideToMove() == position.Black)
	}
	if s.limit > 0 && !g.Ponder { // the GUI's clock runs from now, also while the search before ends
		s.deadline = time.After(s.limit)
	}
	b.cur = s
	go b.run(ctx, s, j)
}

// run answers one `go`: info lines, then bestmove. An infinite or ponder search holds
// its bestmove until stop or ponderhit, as UCI says, also when there was nothing to
// search.
func (b *Bridge) run(ctx context.Context, s *search, j job) {
	defer close(s.done)
	if s.prev != nil {
		<-s.prev.done
		s.prev = nil
	}
	if j.unread != nil {
		for _, l := range strings.Split(j.unread.Error(), "\n") {
			b.out.printf("info string %s", l)
		}
	}
	best, ponder, stopped := b.answer(ctx, s, j)
	if (j.g.Infinite || j.g.Ponder) && !stopped {
		select { // UCI: bestmove only after stop or ponderhit
		case <-s.stop:
		case <-s.released:
		case <-ctx.Done():
		}
	}
	if ctx.Err() != nil { // quit: no bestmove is due
		return
	}
	b.out.printf("%s", bestMoveLine(best, ponder))
}

// answer writes a search's info lines and returns its move: a finished game or no
// position is answered without a call; otherwise the service's search is streamed, an
// info line per line of each completed depth. A stop before the answer leaves the
// stream at once (the service stops the search and charges nothing) and plays the
// deepest depth's move, or the first legal move before any (UCI: after stop, bestmove
// as soon as possible; a GUI that stops early does not wait for a first depth). A
// search stopped before it began asks nothing of the service.
func (b *Bridge) answer(ctx context.Context, s *search, j job) (best, ponder string, stopped bool) {
	pos := j.pos
	if pos == nil {
		b.out.printf("info string no position to search (%v): send position again", j.posErr)
		return "", "", false
	}
	switch pos.Status() {
	case position.Checkmate:
		b.out.printf("info depth 0 score mate 0")
		return "", "", false
	case position.Stalemate:
		b.out.printf("info depth 0 score cp 0")
		return "", "", false
	}
	select {
	case <-s.stop: // while the search before ended: no request
		b.out.printf("info string %s", stoppedEarly)
		return pos.LegalMoves()[0].UCI, "", true
	default:
	}
	api, err := b.apiFor(j.server, j.key)
	if err != nil {
		b.out.printf("info string %s", err)
		return "", "", false
	}
	black := pos.SideToMove() == position.Black
	showWDL := j.set["uci_showwdl"] == "true"
	reqCtx, cancel := context.WithCancel(ctx)
	defer cancel()

	events := make(chan event, 64)
	ended := make(chan error, 1)
	go func() {
		ended <- b.stream(reqCtx, api, j, func(ev event) error {
			select {
			case events <- ev:
				return nil
			case <-reqCtx.Done():
				return reqCtx.Err()
			}
		})
	}()

	lastDepth := 0
	failed := false
	var ponderHit <-chan struct{}
	if j.g.Ponder && s.limit > 0 {
		ponderHit = s.released
	}
	// handle takes one event; true when the search is over.
	handle := func(e event) bool {
		if e.note != "" {
			b.out.printf("info string %s", e.note)
			return false
		}
		ev := e.StreamEvent
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
			return false
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
			if j.debug {
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

	// drain takes the events already read (a depth, or the answer, that came with the
	// stop): they are the service's latest word.
	drain := func() (over bool) {
		for len(events) > 0 && !over {
			over = handle(<-events)
		}
		return over
	}
	for over := false; !over; {
		select {
		case <-ctx.Done(): // quit: the deferred cancel leaves the stream at once
			return "", "", false
		case ev := <-events:
			over = handle(ev)
		case err := <-ended:
			// every event was queued before the stream ended
			if over = drain(); !over {
				if err != nil && !errors.Is(err, context.Canceled) {
					b.out.printf("info string %s", err)
				}
				failed = best == ""
				over = true
			}
		case <-s.stop:
			stopped = true
			if !drain() && best == "" {
				b.out.printf("info string %s", stoppedEarly)
			}
			over = true
		case <-ponderHit: // a timed search from now on
			ponderHit = nil
			s.deadline = time.After(s.limit)
		case <-s.deadline: // as stop, but said: the time is up
			if over = drain(); over { // the answer came with the time
				break
			}
			played := "the deepest depth's move"
			if best == "" {
				played = "a legal move"
			}
			b.out.printf("info string the search did not answer within %d ms: playing %s", s.limit.Milliseconds(), played)
			over = true
		}
	}
	cancel() // leaves the stream if the answer has not come: no charge

	if best == "" && !failed {
		if ms := pos.LegalMoves(); len(ms) > 0 {
			best = ms[0].UCI // stopped before the first depth: any legal move
		}
	}
	return best, ponder, stopped
}

// stoppedEarly is told when a stop comes before the service reported a depth.
const stoppedEarly = "stopped before the first depth: playing a legal move"

// event is a stream's event, or a note for the GUI from the search (an info string).
type event struct {
	client.StreamEvent
	note string
}

// stream reads the limits and streams the search to send. A search refused for a cap
// the service names is asked again within it (a key without `usage:read` does not
// learn its plan's caps from GET /me), and the cap is kept for the session.
func (b *Bridge) stream(ctx context.Context, api *client.ClientWithResponses, j job, send func(event) error) error {
	l := b.limits(ctx, api, j.key, j.gen)
	black := j.pos.SideToMove() == position.Black
	// told once, and again when it changes: not at every go of a game
	if note := lowering(j.g, j.set, l, j.key); note != "" && !b.toldLowering(j.gen, note) {
		if err := send(event{note: note}); err != nil {
			return err
		}
		b.mu.Lock()
		if b.gen == j.gen {
			b.lowered = note
		}
		b.mu.Unlock()
	}
	for tries := 0; ; tries++ {
		req := request(j.pos.FEN(), j.g, j.set, j.offered, l, black)
		if j.debug {
			raw, _ := json.Marshal(req)
			if err := send(event{note: fmt.Sprintf("POST %s/eval %s", j.server, raw)}); err != nil {
				return err
			}
		}
		res, err := api.Eval(ctx, nil, req, client.Accept(client.MediaNDJSON))
		if err == nil {
			err = client.ReadStream(res, func(ev client.StreamEvent) error { return send(event{StreamEvent: ev}) })
		}
		var p *client.Problem
		if tries < 3 && errors.As(err, &p) { // depth, multipv and movetime: one cap each
			if next, ok := lowered(p, l); ok {
				b.learn(j.gen, next)
				note := fmt.Sprintf("%s; searching within depth %d, multipv %d, movetime %d ms from now on", p.Error(), next.depth, next.multipv, next.movetime)
				if err := send(event{note: note}); err != nil {
					return err
				}
				l = next
				continue
			}
		}
		return err
	}
}

// toldLowering reports whether note is the lowering last told for this server and key.
func (b *Bridge) toldLowering(gen int, note string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.gen == gen && b.lowered == note
}

// lowering tells what request lowers to l of what the GUI asked (go depth, MultiPV);
// "" nothing.
func lowering(g Go, set map[string]string, l limits, key string) string {
	var asked, within []string
	if g.Depth > l.depth {
		asked, within = append(asked, fmt.Sprintf("depth %d", g.Depth)), append(within, fmt.Sprintf("depth %d", l.depth))
	}
	if n, err := strconv.Atoi(set["multipv"]); err == nil && n > l.multipv {
		asked, within = append(asked, fmt.Sprintf("multipv %d", n)), append(within, fmt.Sprintf("multipv %d", l.multipv))
	}
	if len(asked) == 0 {
		return ""
	}
	caps := "this key's caps"
	if key == "" {
		caps = "the caps without a key (set the Key option)"
	}
	return fmt.Sprintf("%s above %s: searching %s", strings.Join(asked, " and "), caps, strings.Join(within, " and "))
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
