//go:build unix

package engine

import (
	"os/exec"
	"syscall"
)

// setProcAttrs puts the engine in its own process group: a terminal's Ctrl-C then
// reaches only the server, which shuts engines down cleanly with "quit", and a kill
// reaches a wrapper script's children too (the wasm launcher is sh exec'ing node).
func setProcAttrs(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

func killProcess(cmd *exec.Cmd) {
	if cmd.Process == nil {
		return
	}
	// Negative pid: the whole group. Fall back to the process alone.
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
		_ = cmd.Process.Kill()
	}
}
