package engine

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"chessd/procenv"
)

// Identity is what an engine says about itself in answer to "uci".
type Identity struct {
	Name    string   // "id name"
	Author  string   // "id author"
	Options []Option // every "option" line, in the engine's order
}

// NNUE returns the default network file names the engine announces (EvalFile, then
// EvalFileSmall), skipping empty ones; nil for an engine without such options.
func (id *Identity) NNUE() []string {
	var nets []string
	for _, name := range []string{"EvalFile", "EvalFileSmall"} {
		if o := id.option(name); o != nil && o.Default != "" {
			nets = append(nets, o.Default)
		}
	}
	return nets
}

func (id *Identity) option(name string) *Option {
	for i := range id.Options {
		if strings.EqualFold(id.Options[i].Name, name) {
			return &id.Options[i]
		}
	}
	return nil
}

// procConfig is what one process needs to know; a Pool fills it from PoolConfig.
type procConfig struct {
	path         string
	args         []string
	startTimeout time.Duration // handshake (uci/uciok, isready/readyok)
	stopGrace    time.Duration // from "stop" to "bestmove" before the process is killed
	hangTimeout  time.Duration // longest silence of a searching engine
	baseOptions  []optionValue // set after the handshake; they are this pool's defaults
	boost        int           // nice levels the process runs ahead of the server (PoolConfig.Boost)
	log          *slog.Logger

	boostRefused atomic.Bool // said once: the system refused the boost
}

// optionValue is a validated, normalised option setting.
type optionValue struct {
	key    string // lower-case name: UCI option names are case-insensitive
	name   string // as the engine spells it
	typ    OptionType
	value  string
	button bool
}

// process drives one engine child over UCI. It is used by one goroutine at a time
// (the pool hands it out exclusively); only kill and the write lock may be touched
// concurrently, by Close.
type process struct {
	cfg *procConfig
	cmd *exec.Cmd
	pid int

	wmu sync.Mutex // serialises writes: a search's "stop" and Close's "quit" may race
	w   *bufio.Writer
	in  io.WriteCloser

	lines   chan string   // stdout, line by line (but a search's info lines); closed at EOF
	dead    chan struct{} // closed by kill: the reader then discards output
	exited  chan struct{} // closed once the process has been reaped
	waitErr error         // valid after exited

	killOnce sync.Once
	quitting atomic.Bool // quit sent (Close): a bestmove after it is not an answer
	ident    Identity

	// Option state as last sent (or the engine's default), by lower-case name. The
	// defaults a reset returns to are the engine's own, overridden by baseOptions.
	current  map[string]string
	defaults map[string]string
	names    map[string]string // lower-case -> engine spelling

	cmdBuf []byte // reused for "position ... go ..." to keep the hot path allocation-light

	// While a search runs, the reader hands its info lines to info, in the reader's
	// goroutine, instead of sending each to the searcher over lines: a line then wakes
	// one goroutine, not two. On a machine whose cores the engines keep busy, each
	// wake-up of a goroutine that is not running costs the scheduler more than the
	// line's parsing (see collect). heard is when the last of them came (UnixNano),
	// for the search's silence watch.
	infoMu sync.Mutex
	info   func(line string) // guarded by infoMu
	heard  atomic.Int64

	// dirty: searched since its last reset. A process handed straight from one search
	// to a waiting one is not reset in between; the next search sends the reset's
	// commands first, in the same write (see Pool.release).
	dirty bool
	// resetting counts the resets sent on their own (sendReset) whose readyok has not
	// come back: the engine is still clearing its hash. Nothing waits for it (a search
	// sent meanwhile runs after the reset); it tells PoolStats when an engine is quiet.
	resetting atomic.Int32
}

// hasExited reports whether the process has already ended and been reaped.
func (p *process) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// isDead reports whether the process has been killed (or is being): never reuse it.
func (p *process) isDead() bool {
	select {
	case <-p.dead:
		return true
	default:
		return false
	}
}

// startProcess launches the engine, performs the UCI handshake, applies the base
// options and waits for readyok. The result is warm: ready to search.
func startProcess(ctx context.Context, cfg *procConfig) (*process, error) {
	cmd := exec.Command(cfg.path, cfg.args...)
	cmd.Env = procenv.Environ() // an engine needs none of our secrets
	setProcAttrs(cmd)
	// stderr is left nil (discarded): engines write nothing useful there, and an
	// unread pipe could block them.
	in, out, err := StartPiped(cmd)
	if err != nil {
		return nil, fmt.Errorf("engine: start %s: %w", cfg.path, err)
	}
	p := &process{
		cfg:    cfg,
		cmd:    cmd,
		pid:    cmd.Process.Pid,
		in:     in,
		w:      bufio.NewWriterSize(in, 512),
		lines:  make(chan string, 256),
		dead:   make(chan struct{}),
		exited: make(chan struct{}),
	}
	go p.readLoop(out)

	if err := p.handshake(ctx); err != nil {
		p.kill()
		<-p.exited
		return nil, err
	}
	if cfg.boost > 0 {
		if err := raisePriority(p.pid, cfg.boost); err != nil && !cfg.boostRefused.Swap(true) {
			cfg.log.Warn("engines run at the server's priority: the system refused to raise it (needs root or CAP_SYS_NICE)", "err", err)
		}
	}
	return p, nil
}

// readLoop forwards stdout lines until EOF, then reaps the process. After kill it
// discards lines instead of blocking on a channel nobody reads, so the process is
// always reaped (os/exec requires reads to finish before Wait).
func (p *process) readLoop(out io.ReadCloser) {
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 0, 16<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "info ") && p.takeInfo(line) {
			continue
		}
		if line == "readyok" && p.resetting.Load() > 0 {
			p.resetting.Add(-1) // a reset's: nobody reads it
			continue
		}
		select {
		case p.lines <- line:
		case <-p.dead:
		}
	}
	// A line over 1 MiB stops the scanner: treat it as a broken engine.
	if sc.Err() != nil {
		p.kill()
		_, _ = io.Copy(io.Discard, out)
	}
	close(p.lines)
	p.waitErr = p.cmd.Wait()
	out.Close()
	p.in.Close() // closed already unless the engine ended on its own
	close(p.exited)
}

// takeInfo gives an info line to the running search (setInfo); false when none runs.
func (p *process) takeInfo(line string) bool {
	p.infoMu.Lock()
	defer p.infoMu.Unlock()
	if p.info == nil {
		return false
	}
	p.heard.Store(time.Now().UnixNano())
	p.info(line)
	return true
}

// setInfo makes fn take the info lines the reader reads from now on (nil: send them on
// lines). It returns once a call of the previous fn in progress has returned, so what
// that fn wrote is the caller's to read.
func (p *process) setInfo(fn func(line string)) {
	p.infoMu.Lock()
	defer p.infoMu.Unlock()
	p.info = fn
	p.heard.Store(time.Now().UnixNano())
}

// kill ends the process at once (SIGKILL to its process group). Safe to call many
// times and concurrently.
func (p *process) kill() {
	p.killOnce.Do(func() {
		close(p.dead)
		killProcess(p.cmd)
		_ = p.in.Close()
	})
}

// quit asks the engine to exit, then kills it if it has not within the grace period,
// and waits until it is reaped.
func (p *process) quit(grace time.Duration) {
	p.quitting.Store(true)
	_ = p.send("quit")
	p.wmu.Lock()
	_ = p.in.Close()
	p.wmu.Unlock()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-t.C:
		p.kill()
		<-p.exited
	}
}

func (p *process) send(cmds ...string) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	for _, c := range cmds {
		_, _ = p.w.WriteString(c)
		_ = p.w.WriteByte('\n')
	}
	if err := p.w.Flush(); err != nil {
		return fmt.Errorf("%w: write to engine: %v", ErrEngineFailed, err)
	}
	return nil
}

func (p *process) sendBytes(b []byte) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	_, _ = p.w.Write(b)
	if err := p.w.Flush(); err != nil {
		return fmt.Errorf("%w: write to engine: %v", ErrEngineFailed, err)
	}
	return nil
}

// exitError describes why the engine's output ended.
func (p *process) exitError() error {
	<-p.exited
	if p.waitErr != nil {
		return fmt.Errorf("%w: engine exited: %v", ErrEngineFailed, p.waitErr)
	}
	return fmt.Errorf("%w: engine exited", ErrEngineFailed)
}

// readUntil reads lines until one equals want, calling fn (if not nil) for the others.
// It gives up after timeout or when ctx ends, killing the process: an engine that
// does not finish a handshake or a reset is useless.
func (p *process) readUntil(ctx context.Context, want string, timeout time.Duration, fn func(string)) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				p.kill() // an engine can close its output and run on: exitError waits for its exit
				return p.exitError()
			}
			line = strings.TrimRight(line, "\r")
			if line == want {
				return nil
			}
			if fn != nil {
				fn(line)
			}
		case <-t.C:
			p.kill()
			return fmt.Errorf("%w: no %q within %v", ErrEngineFailed, want, timeout)
		case <-ctx.Done():
			p.kill()
			return ctx.Err()
		}
	}
}

func (p *process) handshake(ctx context.Context) error {
	if err := p.send("uci"); err != nil {
		return err
	}
	err := p.readUntil(ctx, "uciok", p.cfg.startTimeout, func(line string) {
		switch {
		case strings.HasPrefix(line, "id name "):
			p.ident.Name = strings.TrimSpace(line[len("id name "):])
		case strings.HasPrefix(line, "id author "):
			p.ident.Author = strings.TrimSpace(line[len("id author "):])
		case strings.HasPrefix(line, "option "):
			if o, ok := ParseOption(line); ok {
				p.ident.Options = append(p.ident.Options, o)
			}
		}
	})
	if err != nil {
		return fmt.Errorf("uci handshake with %s: %w", p.cfg.path, err)
	}
	p.current = make(map[string]string, len(p.ident.Options))
	p.defaults = make(map[string]string, len(p.ident.Options))
	p.names = make(map[string]string, len(p.ident.Options))
	for _, o := range p.ident.Options {
		if o.Type == OptionButton {
			continue
		}
		k := strings.ToLower(o.Name)
		v := normaliseDefault(o)
		p.current[k], p.defaults[k], p.names[k] = v, v, o.Name
	}
	var cmds []string
	for _, ov := range p.cfg.baseOptions {
		cmds = append(cmds, setoptionCmd(ov.name, ov.value, ov.button))
		if !ov.button {
			p.current[ov.key], p.defaults[ov.key] = ov.value, ov.value
		}
	}
	cmds = append(cmds, "isready")
	if err := p.send(cmds...); err != nil {
		return err
	}
	if err := p.readUntil(ctx, "readyok", p.cfg.startTimeout, nil); err != nil {
		return fmt.Errorf("isready after handshake with %s: %w", p.cfg.path, err)
	}
	return nil
}

// normaliseDefault gives an option's default in the form validateOption produces, so
// that "already set" comparisons work (check values are lower case).
func normaliseDefault(o Option) string {
	if o.Type == OptionCheck {
		return strings.ToLower(o.Default)
	}
	return o.Default
}

func setoptionCmd(name, value string, button bool) string {
	if button {
		return "setoption name " + name
	}
	return "setoption name " + name + " value " + value
}

// sendReset writes the commands that return every changed option to its default and
// start a new game (clearing hash and histories, so no request sees another's search),
// without waiting for the engine: what it is sent next runs on the reset engine. Its
// isready's readyok, taken by the reader, marks the reset done (resetting).
func (p *process) sendReset() error {
	p.cmdBuf = append(p.appendReset(p.cmdBuf[:0]), "isready\n"...)
	p.resetting.Add(1)
	return p.sendBytes(p.cmdBuf)
}

// appendReset appends the commands that return every changed option to its default
// and start a new game, and marks the process clean. UCI engines read their input in
// order, so whatever follows in the same write runs on the reset engine.
func (p *process) appendReset(b []byte) []byte {
	for k, cur := range p.current {
		if def := p.defaults[k]; cur != def {
			b = append(b, setoptionCmd(p.names[k], def, false)...)
			b = append(b, '\n')
			p.current[k] = def
		}
	}
	p.dirty = false
	return append(b, "ucinewgame\n"...)
}

// search runs one search, resetting the process first if it has searched since its
// last reset. opts are already validated against this engine's option list. On error
// the process may have been killed (p.broken); the caller must not reuse it then
// (isDead).
func (p *process) search(ctx context.Context, s *Search, opts []optionValue) (*Result, error) {
	// Options next, skipping values already in force: after a reset everything is at
	// its default, so a request that asks for defaults sends nothing extra.
	b := p.cmdBuf[:0]
	if p.dirty {
		b = p.appendReset(b)
	}
	p.dirty = true
	for _, ov := range opts {
		if !ov.button && p.current[ov.key] == ov.value {
			continue
		}
		b = append(b, setoptionCmd(ov.name, ov.value, ov.button)...)
		b = append(b, '\n')
		if !ov.button {
			p.current[ov.key] = ov.value
		}
	}
	if s.FEN == "" {
		b = append(b, "position startpos"...)
	} else {
		b = append(b, "position fen "...)
		b = append(b, s.FEN...)
	}
	if len(s.Moves) > 0 {
		b = append(b, " moves"...)
		for _, m := range s.Moves {
			b = append(b, ' ')
			b = append(b, m...)
		}
	}
	b = append(b, "\ngo"...)
	if s.Depth > 0 {
		b = append(b, " depth "...)
		b = strconv.AppendInt(b, int64(s.Depth), 10)
	}
	if s.MoveTime > 0 {
		b = append(b, " movetime "...)
		b = strconv.AppendInt(b, moveTimeMS(s.MoveTime), 10)
	}
	b = append(b, '\n')
	p.cmdBuf = b
	// the search's info lines go to its collector from the first one on
	var col lineCollector
	var stopped atomic.Bool
	watch := newDepthWatch(s, opts)
	p.setInfo(func(line string) {
		col.heard = true
		if strings.HasPrefix(line, "info string") {
			return
		}
		if in, ok := ParseInfo(line); ok {
			col.add(&in)
			if watch != nil && !stopped.Load() {
				watch.line(&in, &col)
			}
		}
	})
	defer p.setInfo(nil)
	if err := p.sendBytes(b); err != nil {
		p.kill()
		return nil, silentFailure{err}
	}
	return p.collect(ctx, s, &col, &stopped, watch)
}

// silentFailure is a search's failure before the engine printed anything after its
// commands: they could not be written, or the engine's output ended without a line.
// Nothing of the search reached its caller, so it may be run again on another
// process (Pool.Search). It wraps the failure's error (ErrEngineFailed).
type silentFailure struct{ error }

func (e silentFailure) Unwrap() error { return e.error }

func moveTimeMS(d time.Duration) int64 {
	ms := int64((d + time.Millisecond - 1) / time.Millisecond)
	if ms < 1 {
		ms = 1
	}
	return ms
}

// collect waits for the search's bestmove while the reader gives its info lines to col
// (search's setInfo) and watch, which, when not nil, hears of each completed depth.
// Besides the output it watches three things: the request's context (send stop, give
// the engine stopGrace to answer, else kill), silence longer than hangTimeout, and,
// for timed searches, no bestmove by movetime + hangTimeout. Each ends in a prompt
// return, never a hang. stopped, once set, keeps watch from hearing of more depths.
//
// The searcher wakes for the bestmove alone, not for each of the engine's ~15 lines
// a search: at depth 14, with the engines keeping both cores busy, this process
// spent 4.6 ms of CPU a position when every line woke it, mostly in the scheduler
// (docs/BENCHMARKS.md, session 25).
func (p *process) collect(ctx context.Context, s *Search, col *lineCollector, stopped *atomic.Bool, watch *depthWatch) (*Result, error) {
	silence := time.NewTimer(p.cfg.hangTimeout)
	defer silence.Stop()
	var overdue <-chan time.Time
	if s.MoveTime > 0 {
		t := time.NewTimer(s.MoveTime + p.cfg.hangTimeout)
		defer t.Stop()
		overdue = t.C
	}
	done := ctx.Done()
	var grace <-chan time.Time
	heard := false // a line came here
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				p.kill()
				// col.heard is safe to read: the reader took its last info line before it
				// closed lines.
				if !heard && !col.heard {
					return nil, silentFailure{p.exitError()}
				}
				return nil, p.exitError()
			}
			heard = true
			// Reset the silence timer. Stop+drain keeps Reset correct on any Go version.
			if !silence.Stop() {
				select {
				case <-silence.C:
				default:
				}
			}
			silence.Reset(p.cfg.hangTimeout)
			// the search's info lines go to col: another line is the bestmove, or was
			// read before the search began and is not its own
			if strings.HasPrefix(line, "bestmove") {
				p.setInfo(nil) // every info line before it has been taken: col is ours
				best, ponder, ok := ParseBestMove(line)
				if !ok {
					p.kill()
					return nil, fmt.Errorf("%w: malformed %q", ErrEngineFailed, line)
				}
				if p.quitting.Load() {
					// Stockfish answers quit with the bestmove of a cut-short search.
					return nil, fmt.Errorf("%w: engine shut down mid-search", ErrClosed)
				}
				if stopped.Load() {
					// The engine answered the stop: the process is healthy and
					// reusable, but the request was cancelled.
					return nil, fmt.Errorf("engine: search stopped: %w", ctx.Err())
				}
				res := col.result(best, ponder)
				if watch != nil {
					watch.done(res)
				}
				return res, nil
			}
		case <-done:
			done = nil
			stopped.Store(true)
			if err := p.send("stop"); err != nil {
				p.kill()
				return nil, fmt.Errorf("engine: search stopped: %w", ctx.Err())
			}
			t := time.NewTimer(p.cfg.stopGrace)
			defer t.Stop()
			grace = t.C
		case <-grace:
			p.kill()
			p.cfg.log.Warn("engine ignored stop; killed", "path", p.cfg.path, "pid", p.pid, "grace", p.cfg.stopGrace)
			return nil, fmt.Errorf("engine: search stopped (engine killed after %v): %w", p.cfg.stopGrace, ctx.Err())
		case <-silence.C:
			// info lines the reader took count as output too
			if quiet := time.Since(time.Unix(0, p.heard.Load())); quiet < p.cfg.hangTimeout {
				silence.Reset(p.cfg.hangTimeout - quiet)
				continue
			}
			p.kill()
			p.cfg.log.Warn("engine silent too long; killed", "path", p.cfg.path, "pid", p.pid, "timeout", p.cfg.hangTimeout)
			return nil, fmt.Errorf("%w: no output for %v", ErrEngineFailed, p.cfg.hangTimeout)
		case <-overdue:
			p.kill()
			p.cfg.log.Warn("engine overran movetime; killed", "path", p.cfg.path, "pid", p.pid)
			return nil, fmt.Errorf("%w: no bestmove %v after movetime %v", ErrEngineFailed, p.cfg.hangTimeout, s.MoveTime)
		}
	}
}

// validateOption checks one request option against an engine's option list and the
// service's limits, and normalises its value.
//
// String options are refused outright: they name files (EvalFile, Debug Log File,
// SyzygyPath, NumaPolicy...), and a request must never make the engine read or write
// a path of its choosing, nor load a net that makes it exit.
func validateOption(id *Identity, name, value string, lim *limits) (optionValue, error) {
	o := id.option(name)
	if o == nil {
		return optionValue{}, fmt.Errorf("%w: %s has no option %q", ErrInvalidOption, id.Name, name)
	}
	ov := optionValue{key: strings.ToLower(o.Name), name: o.Name, typ: o.Type}
	v := strings.TrimSpace(value)
	switch o.Type {
	case OptionButton:
		ov.button = true
	case OptionCheck:
		switch strings.ToLower(v) {
		case "true":
			ov.value = "true"
		case "false":
			ov.value = "false"
		default:
			return optionValue{}, fmt.Errorf("%w: %s must be true or false, not %q", ErrInvalidOption, o.Name, value)
		}
	case OptionSpin:
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return optionValue{}, fmt.Errorf("%w: %s must be an integer, not %q", ErrInvalidOption, o.Name, value)
		}
		lo, hi := o.Min, o.Max
		if !o.HasRange {
			lo, hi = n, n
		}
		if c, ok := lim.cap(ov.key); ok && c < hi {
			hi = c
		}
		if n < lo || n > hi {
			return optionValue{}, fmt.Errorf("%w: %s must be in %d..%d, not %d", ErrInvalidOption, o.Name, lo, hi, n)
		}
		ov.value = strconv.FormatInt(n, 10)
	case OptionCombo:
		for _, vv := range o.Vars {
			if strings.EqualFold(vv, v) {
				ov.value = vv
				break
			}
		}
		if ov.value == "" {
			return optionValue{}, fmt.Errorf("%w: %s must be one of %v, not %q", ErrInvalidOption, o.Name, o.Vars, value)
		}
	default:
		return optionValue{}, fmt.Errorf("%w: %s (type %s) cannot be set by a request", ErrInvalidOption, o.Name, o.Type)
	}
	return ov, nil
}

// limits caps spin options beyond the engine's own maximum, because one process's
// memory or threads are shared capacity: Hash (MiB) and Threads.
type limits struct {
	maxHashMB  int64
	maxThreads int64
}

func (l *limits) cap(key string) (int64, bool) {
	switch key {
	case "hash":
		return l.maxHashMB, l.maxHashMB > 0
	case "threads":
		return l.maxThreads, l.maxThreads > 0
	}
	return 0, false
}

// errIsContext reports whether err came from the request's own context.
func errIsContext(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
