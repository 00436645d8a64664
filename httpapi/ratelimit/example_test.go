package ratelimit_test

import (
	"fmt"
	"net/http"
	"time"

	"chessd/httpapi/ratelimit"
)

func ExampleSetHeaders() {
	frozen := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	l := ratelimit.New(ratelimit.WithClock(func() time.Time { return frozen }))
	perKey := ratelimit.Policy{Name: "key", Limit: 120, Window: time.Minute}

	show := func(d ratelimit.Decision) {
		h := http.Header{}
		ratelimit.SetHeaders(h, d)
		fmt.Printf("allowed=%v\n  RateLimit-Policy: %s\n  RateLimit: %s\n", d.Allowed, h.Get("RateLimit-Policy"), h.Get("RateLimit"))
		if ra := h.Get("Retry-After"); ra != "" {
			fmt.Printf("  Retry-After: %s\n", ra)
		}
	}
	show(l.Allow("key:k1", perKey))
	for range 119 {
		l.Allow("key:k1", perKey)
	}
	show(l.Allow("key:k1", perKey))
	// Output:
	// allowed=true
	//   RateLimit-Policy: "key";q=120;w=60
	//   RateLimit: "key";r=119;t=1
	// allowed=false
	//   RateLimit-Policy: "key";q=120;w=60
	//   RateLimit: "key";r=0;t=60
	//   Retry-After: 1
}
