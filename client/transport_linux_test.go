package client

import (
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"syscall"
	"testing"
	"time"
)

// The command-line clients' HTTP client probes a silent connection, so that a dead
// server or network ends a search's stream within about 25 s (no overall timeout: an
// infinite search's stream lasts until stop). Read from the socket of a real request.
func TestDeadConnectionIsNoticed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	hc := HTTPClient()
	if hc.Timeout != 0 {
		t.Errorf("an overall timeout of %s: a stream lasts as long as its search", hc.Timeout)
	}
	var opts [4]int // SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT
	var readErr error
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		sc, err := info.Conn.(syscall.Conn).SyscallConn()
		if err != nil {
			readErr = err
			return
		}
		sc.Control(func(fd uintptr) { //nolint:errcheck // the reads' errors are kept
			for i, o := range []struct{ level, name int }{{syscall.SOL_SOCKET, syscall.SO_KEEPALIVE},
				{syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE}, {syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL},
				{syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT}} {
				if opts[i], err = syscall.GetsockoptInt(int(fd), o.level, o.name); err != nil {
					readErr = err
				}
			}
		})
	}}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), "GET", srv.URL, nil)
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if readErr != nil {
		t.Fatal(readErr)
	}
	noticed := time.Duration(opts[1]+opts[2]*opts[3]) * time.Second
	if opts[0] == 0 || noticed > 30*time.Second {
		t.Errorf("keep-alive %d, idle %d s, interval %d s, %d probes: a dead connection noticed after %s, want within 30 s",
			opts[0], opts[1], opts[2], opts[3], noticed)
	}
}
