package engine

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"unsafe"
)

// pipes connects an engine's stdin and stdout (cmd, not started) to pipes whose ends
// this process reads and writes with raw system calls on the runtime's poller. A read
// or write through os.File enters the Go scheduler's system-call path, which wakes its
// monitor thread (sysmon) whenever the process was idle: with an engine's ~15 lines a
// search and the cores busy with engines, those wake-ups were a third of this
// process's CPU for reading an engine (docs/BENCHMARKS.md, session 33). The ends are
// non-blocking, so a raw call never blocks; with nothing to read (or no room to
// write) the goroutine parks on the poller as os.File's would. closeChild closes the
// child's ends: call it once Start has returned.
func pipes(cmd *exec.Cmd) (in io.WriteCloser, out io.ReadCloser, closeChild func(), err error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("stdin pipe: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, nil, nil, fmt.Errorf("stdout pipe: %w", err)
	}
	w, err := newRawFile(inW)
	if err == nil {
		var r *rawFile
		if r, err = newRawFile(outR); err == nil {
			cmd.Stdin, cmd.Stdout = inR, outW // exec hands the child blocking copies
			return w, r, func() { inR.Close(); outW.Close() }, nil
		}
	}
	for _, f := range []*os.File{inR, inW, outR, outW} {
		f.Close()
	}
	return nil, nil, nil, fmt.Errorf("pipes: %w", err)
}

// rawFile reads and writes a non-blocking pipe end with raw system calls (see
// pipes).
type rawFile struct {
	f  *os.File
	rc syscall.RawConn
}

func newRawFile(f *os.File) (*rawFile, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	return &rawFile{f: f, rc: rc}, nil
}

func (r *rawFile) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n uintptr
	var errno syscall.Errno
	err := r.rc.Read(func(fd uintptr) bool {
		for {
			n, _, errno = syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			if errno != syscall.EINTR {
				return errno != syscall.EAGAIN // false: wait on the poller, then again
			}
		}
	})
	switch {
	case err != nil:
		return 0, err
	case errno != 0:
		return 0, &os.PathError{Op: "read", Path: r.f.Name(), Err: errno}
	case n == 0:
		return 0, io.EOF
	}
	return int(n), nil
}

func (r *rawFile) Write(p []byte) (int, error) {
	done := 0
	var errno syscall.Errno
	err := r.rc.Write(func(fd uintptr) bool {
		for done < len(p) {
			n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[done])), uintptr(len(p)-done))
			switch e {
			case 0:
				done += int(n)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false // the pipe is full: wait on the poller
			default:
				errno = e
				return true
			}
		}
		return true
	})
	switch {
	case err != nil:
		return done, err
	case errno != 0:
		return done, &os.PathError{Op: "write", Path: r.f.Name(), Err: errno}
	}
	return done, nil
}

func (r *rawFile) Close() error { return r.f.Close() }
