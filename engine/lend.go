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
// fn must leave the engine as it got it: options untouched and, after its last
// search, a ucinewgame and an isready whose readyok it has read. A process fn fails
// on is killed and replaced. Lend waits for a process as a search does (QueueWait).
func (pl *Pool) Lend(ctx context.Context, fn func(*Lent) error) error {
	p, _, err := pl.acquire(ctx, Interactive)
	if err != nil {
		return err
	}
	if p.dirty { // handed over straight from a search: fn gets a reset engine
		if err := p.sendReset(); err != nil {
			p.kill()
			pl.release(p)
			return err
		}
	}
	if err := fn(&Lent{p: p, PID: p.pid, hang: pl.cfg.HangTimeout}); err != nil {
		p.kill()
		pl.release(p)
		return fmt.Errorf("engine: lent process: %w", err)
	}
	pl.put(p)
	return nil
}

// Lent is a process lent by Pool.Lend: lines in and out, with nothing of the pool's
// between but the goroutine that reads the engine's output.
type Lent struct {
	p    *process
	PID  int
	hang time.Duration
}

// Send writes cmds, a line each, in one write.
func (l *Lent) Send(cmds ...string) error { return l.p.send(cmds...) }

// Until reads the engine's output until a line that starts with prefix and returns
// it. Info lines go to info, when it is not nil, in the reading goroutine as they come
// (as a search's do: no hand-over per line); every other line is skipped. It gives up
// after the pool's HangTimeout or when ctx ends.
func (l *Lent) Until(ctx context.Context, prefix string, info func(line string)) (string, error) {
	if info != nil {
		l.p.setInfo(info)
		defer l.p.setInfo(nil)
	}
	t := time.NewTimer(l.hang)
	defer t.Stop()
	for {
		select {
		case line, ok := <-l.p.lines:
			if !ok {
				return "", l.p.exitError()
			}
			if line = strings.TrimRight(line, "\r"); strings.HasPrefix(line, prefix) {
				return line, nil
			}
		case <-t.C:
			return "", fmt.Errorf("%w: no %q within %v", ErrEngineFailed, prefix, l.hang)
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}
