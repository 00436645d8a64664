package client

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// Keep-alive probes of the command-line clients' connections (the bridge's and the
// CLI's): a connection silent for keepIdle is probed every keepInterval, and keepCount
// probes unanswered end it, so a dead server or network is noticed within about 25 s,
// also during a long search or a job's quiet stream (the service answers the probes
// from its kernel). Go's default probes take nearly 3 minutes.
const (
	keepIdle     = 10 * time.Second
	keepInterval = 5 * time.Second
	keepCount    = 3
)

// HTTPClient is the command-line clients' HTTP client, one per process so that
// commands share connections: without an overall timeout (a stream lasts as long as
// its search or job, an infinite search until stop), but with keep-alive probes that
// end a dead connection. A program that replaced http.DefaultTransport before its
// first call (to check or instrument its traffic, as cmd/chessd's tests do) keeps its
// transport.
var HTTPClient = sync.OnceValue(func() *http.Client {
	t, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		return &http.Client{}
	}
	t = t.Clone()
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAliveConfig: net.KeepAliveConfig{
		Enable: true, Idle: keepIdle, Interval: keepInterval, Count: keepCount}}
	t.DialContext = d.DialContext
	return &http.Client{Transport: t}
})
