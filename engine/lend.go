package engine

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Lend hands an idle process to fn, outside the pool's searches, and takes it back
// after: fn drives the engine over UCI itself. It is for measuring the pool against
// the very process it runs: chessbench's raw side, a client of the engine without the
// service, searches on the process the service's next search gets (the pool hands out
// the idle process it took back last), so the two sides differ by the service alone
// and not by two processes' speeds, which differ by 1-3 % on a virtual machine.
//
// fn gets a reset engine at rest: a process handed over straight from a search is
// reset, and its reset waited for, before fn runs. fn must leave the engine as it got
// it: options untouched and, after its last search, a ucinewgame and an isready whose
// readyok it has read. A process fn fails (or panics) on is killed and replaced. Lend
// waits for a process as a search does (QueueWait).
func (pl *Pool) Lend(ctx context.Context, fn func(*Lent) error) error {
	p, _, err := pl.acquire(ctx, Interactive, pl.cfg.QueueWait)
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if ok {
			pl.put(p)
			return
		}
		p.kill()
		pl.release(p) // replaced; Close is reaping it when it quit
	}()
	l := &Lent{p: p, PID: p.pid, hang: pl.cfg.HangTimeout}
	if p.dirty {
		if err := p.sendReset(); err != nil {
			return err
		}
		// the reset's own readyok is the reader's; this one comes after it
		if _, err := l.Exchange(ctx, "readyok", nil, "isready"); err != nil {
			return err
		}
	}
	if err := fn(l); err != nil {
		return fmt.Errorf("engine: lent process: %w", err)
	}
	ok = true
	return nil
}

// Lent is a process lent by Pool.Lend: lines in and out, with nothing of the pool's
// between but the goroutine that reads the engine's output.
type Lent struct {
	p    *process
	PID  int
	hang time.Duration
}

// Exchange writes cmds, a line each, in one write, and reads the engine's output until
// a line that starts with prefix, which it returns. Info lines go to info, when it is
// not nil, in the reading goroutine as they come (as a search's do: no hand-over per
// line), from before the write on; every other line is skipped. It gives up after the
// pool's HangTimeout of silence, when ctx ends, or when the pool is closing (a bestmove
// the engine gives as it quits is no answer).
func (l *Lent) Exchange(ctx context.Context, prefix string, info func(line string), cmds ...string) (string, error) {
	p := l.p
	if info != nil {
		p.setInfo(info)
		defer p.setInfo(nil)
	}
	if err := p.send(cmds...); err != nil {
		return "", err
	}
	t := time.NewTimer(l.hang)
	defer t.Stop()
	for {
		select {
		case line, ok := <-p.lines:
			if p.quitting.Load() {
				return "", ErrClosed
			}
			if !ok {
				p.kill() // an engine can close its output and run on: exitError waits for its exit
				return "", p.exitError()
			}
			if line = strings.TrimRight(line, "\r"); strings.HasPrefix(line, prefix) {
				return line, nil
			}
			t.Reset(l.hang)
		case <-t.C:
			// info lines count as output though they do not come this way
			if quiet := time.Since(time.Unix(0, p.heard.Load())); quiet < l.hang {
				t.Reset(l.hang - quiet)
				continue
			}
			return "", fmt.Errorf("%w: no %q within %v of silence", ErrEngineFailed, prefix, l.hang)
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}
