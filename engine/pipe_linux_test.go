package engine

import (
	"bytes"
	"errors"
	"io"
	"os/exec"
	"syscall"
	"testing"
)

// startCat runs cat on StartPiped's pipes: what goes in comes back out.
func startCat(t *testing.T) (*exec.Cmd, io.WriteCloser, io.ReadCloser) {
	t.Helper()
	cmd := exec.Command("cat")
	in, out, err := StartPiped(cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); _ = cmd.Wait(); out.Close() })
	return cmd, in, out
}

func TestPipesCarryEveryByteBothWays(t *testing.T) {
	for _, size := range []int{1, 100, 64 << 10, 1 << 20} { // beyond a pipe's buffer: writes wait on the poller
		_, in, out := startCat(t)
		want := bytes.Repeat([]byte("position fen 8/8/8/8/8/8/8/K6k w - - 0 1\n"), size/40+1)[:size]
		errc := make(chan error, 1)
		go func() {
			defer in.Close() // cat ends at EOF, and so does out
			n, err := in.Write(want)
			if err == nil && n != len(want) {
				err = io.ErrShortWrite
			}
			errc <- err
		}()
		got, err := io.ReadAll(out)
		if err != nil {
			t.Fatalf("%d bytes: read: %v", size, err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("%d bytes: write: %v", size, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%d bytes: read back %d bytes, not what was written", size, len(got))
		}
	}
}

func TestPipesWriteToAnEndedEngineFails(t *testing.T) {
	cmd, in, out := startCat(t)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(out); err != nil { // EOF once the child is gone
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// a broken pipe is an error (EPIPE), not a signal that ends this process
	_, err := in.Write([]byte("isready\n"))
	if !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("write after the engine ended: %v, want EPIPE", err)
	}
}
