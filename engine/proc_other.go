//go:build !unix

package engine

import "os/exec"

func setProcAttrs(cmd *exec.Cmd) {}

func killProcess(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = cmd.Process.Kill()
	}
}

func raisePriority(pid, boost int) error { return nil }
