//go:build unix

package engine

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
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

// raisePriority runs every thread of process pid boost nice levels ahead of this
// process (threads it starts later inherit its main thread's level). Raising a
// priority needs root or CAP_SYS_NICE; without, it fails and the engine runs at the
// server's level.
func raisePriority(pid, boost int) error {
	raw, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0)
	if err != nil {
		return fmt.Errorf("read own priority: %w", err)
	}
	nice := max(20-raw-boost, -20) // the system call answers 20 - nice
	tids := []string{strconv.Itoa(pid)}
	if tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid)); err == nil {
		tids = tids[:0]
		for _, t := range tasks {
			tids = append(tids, t.Name())
		}
	}
	for _, t := range tids {
		tid, err := strconv.Atoi(t)
		if err != nil {
			continue
		}
		err = syscall.Setpriority(syscall.PRIO_PROCESS, tid, nice)
		if errors.Is(err, syscall.ESRCH) {
			continue // the thread ended since the listing
		}
		if err != nil {
			return fmt.Errorf("set nice %d on thread %d: %w", nice, tid, err)
		}
	}
	return nil
}
