package engine

import (
	"io"
	"os/exec"
)

// StartPiped starts cmd, an engine, with its stdin and stdout on pipes this process
// writes and reads (on Linux with raw system calls: see pipes). The pools start their
// processes with it, and so do the benchmarks' raw drivers: a baseline read through
// os/exec's pipes would spend more of the cores than the service does.
func StartPiped(cmd *exec.Cmd) (in io.WriteCloser, out io.ReadCloser, err error) {
	in, out, closeChild, err := pipes(cmd)
	if err != nil {
		return nil, nil, err
	}
	err = cmd.Start()
	closeChild()
	if err != nil {
		in.Close()
		out.Close()
		return nil, nil, err
	}
	return in, out, nil
}
