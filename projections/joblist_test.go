package projections

import (
	"testing"
	"time"
)

// A jobs cursor decodes only as Encode spelled it: anything else is refused, never a
// panic, and what decodes encodes back to the same text.
func FuzzDecodeJobCursor(f *testing.F) {
	f.Add(JobCursor{At: time.Date(2026, 11, 23, 10, 0, 0, 123456000, time.UTC), ID: "job_abc"}.Encode())
	f.Add("")
	f.Add("bm9wZQ")
	f.Add("MjAyNi0xMS0yM1QxMDowMDowMFogam9iX3g")
	f.Add("MjAyNi0xMS0yM1QxMTowMDowMCswMTowMCBqb2JfeA") // +01:00: the same instant, another spelling
	f.Fuzz(func(t *testing.T, s string) {
		c, err := DecodeJobCursor(s)
		if err != nil {
			return
		}
		if c.Encode() != s {
			t.Fatalf("%q decodes to %+v, which encodes to %q", s, c, c.Encode())
		}
	})
}
