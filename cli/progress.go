package cli

import (
	"fmt"
	"io"
)

// progress shows how a search or a job is going on stderr: one line rewritten in place
// on a terminal, one line per step otherwise (logs, pipes).
type progress struct {
	w        io.Writer
	terminal bool
	shown    bool // a line is on the terminal
}

func newProgress(e *env) *progress { return &progress{w: e.io.Err, terminal: e.io.ErrTerminal} }

func (p *progress) update(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	if p.terminal {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		p.shown = true
		return
	}
	fmt.Fprintln(p.w, line)
}

// done clears the terminal's progress line.
func (p *progress) done() {
	if p.terminal && p.shown {
		fmt.Fprint(p.w, "\r\033[K")
		p.shown = false
	}
}
