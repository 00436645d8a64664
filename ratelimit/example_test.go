package ratelimit_test

import (
	"fmt"
	"net/http"
	"time"

	"chessd/ratelimit"
)

func ExampleSetHeaders() {
	perKey := ratelimit.Policy{Name: "key", Limit: 120, Window: time.Minute}
	show := func(d ratelimit.Decision) {
		h := http.Header{}
		ratelimit.SetHeaders(h, d)
		fmt.Printf("allowed=%v\n  RateLimit-Policy: %s\n  RateLimit: %s\n", d.Allowed, h.Get("RateLimit-Policy"), h.Get("RateLimit"))
		if ra := h.Get("Retry-After"); ra != "" {
			fmt.Printf("  Retry-After: %s\n", ra)
		}
	}
	// The first request of a fresh key, and the 121st in the same instant.
	show(ratelimit.Decision{Allowed: true, Limit: 120, Remaining: 119, Reset: 500 * time.Millisecond, Policy: perKey})
	show(ratelimit.Decision{Limit: 120, Reset: time.Minute, RetryAfter: 500 * time.Millisecond, Policy: perKey})
	// Output:
	// allowed=true
	//   RateLimit-Policy: "key";q=120;w=60
	//   RateLimit: "key";r=119;t=1
	// allowed=false
	//   RateLimit-Policy: "key";q=120;w=60
	//   RateLimit: "key";r=0;t=60
	//   Retry-After: 1
}
