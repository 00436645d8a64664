package httpapi

import (
	"net/http"
	"strconv"
	"time"
)

// serverTiming collects the phases of a costed call for the Server-Timing header
// (W3C Server Timing): a client can see how much of its latency was the engine and how
// much was ours, and `make bench` reads it to break the service's overhead down.
type serverTiming struct {
	start, last time.Time
	b           []byte
}

func newServerTiming() *serverTiming {
	now := time.Now()
	return &serverTiming{start: now, last: now}
}

// mark ends the phase called name at now.
func (t *serverTiming) mark(name string) {
	now := time.Now()
	t.add(name, now.Sub(t.last))
	t.last = now
}

// add records a duration measured elsewhere (it does not move the phase boundary).
func (t *serverTiming) add(name string, d time.Duration) {
	if len(t.b) > 0 {
		t.b = append(t.b, ", "...)
	}
	t.b = append(t.b, name...)
	t.b = append(t.b, ";dur="...)
	t.b = strconv.AppendFloat(t.b, float64(d.Microseconds())/1000, 'f', 3, 64)
}

// write sets the header, with the whole handler's time as "total".
func (t *serverTiming) write(h http.Header) {
	t.add("total", time.Since(t.start))
	h.Set("Server-Timing", string(t.b))
}
