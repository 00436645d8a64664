//go:build !linux

package engine

import (
	"fmt"
	"io"
	"os/exec"
)

// pipes connects the engine's stdin and stdout (see pipe_linux.go for why Linux
// does more).
func pipes(cmd *exec.Cmd) (in io.WriteCloser, out io.ReadCloser, closeChild func(), err error) {
	if in, err = cmd.StdinPipe(); err != nil {
		return nil, nil, nil, fmt.Errorf("stdin pipe: %w", err)
	}
	if out, err = cmd.StdoutPipe(); err != nil {
		in.Close()
		return nil, nil, nil, fmt.Errorf("stdout pipe: %w", err)
	}
	return in, out, func() {}, nil
}
