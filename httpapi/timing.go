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
	t.b = appendMillis(t.b, d)
}

// appendMillis appends d in milliseconds with three decimals ("1.234"), by integer
// arithmetic: strconv.AppendFloat was most of the header's cost on a cached call.
func appendMillis(b []byte, d time.Duration) []byte {
	us := max(d.Microseconds(), 0)
	b = strconv.AppendInt(b, us/1000, 10)
	frac := us % 1000
	return append(b, '.', byte('0'+frac/100), byte('0'+frac/10%10), byte('0'+frac%10))
}

// write sets the header, with the whole handler's time as "total".
func (t *serverTiming) write(h http.Header) {
	t.add("total", time.Since(t.start))
	h.Set("Server-Timing", string(t.b))
}
