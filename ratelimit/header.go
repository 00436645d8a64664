package ratelimit

import (
	"net/http"
	"strconv"
	"time"
)

// Header field names; http.Header canonicalises them on Set and Get.
const (
	HeaderPolicy     = "RateLimit-Policy"
	HeaderRateLimit  = "RateLimit"
	HeaderRetryAfter = "Retry-After"
)

// PolicyHeader returns the RateLimit-Policy field value, for example
// `"key";q=120;w=60`.
func (d Decision) PolicyHeader() string {
	var buf [64]byte
	b := appendSFString(buf[:0], d.Policy.Name)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, int64(d.Policy.Limit), 10)
	b = append(b, ";w="...)
	b = strconv.AppendInt(b, ceilSeconds(d.Policy.Window), 10)
	return string(b)
}

// Header returns the RateLimit field value, for example `"key";r=42;t=17`.
func (d Decision) Header() string {
	var buf [64]byte
	b := appendSFString(buf[:0], d.Policy.Name)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, int64(d.Remaining), 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, ceilSeconds(d.Reset), 10)
	return string(b)
}

// RetryAfterSeconds returns RetryAfter in whole seconds rounded up, at least 1 when the
// request was denied, and 0 when it was allowed.
func (d Decision) RetryAfterSeconds() int {
	if d.Allowed {
		return 0
	}
	return int(max(1, ceilSeconds(d.RetryAfter)))
}

// SetHeaders sets RateLimit-Policy and RateLimit from d and, when d denied the request,
// Retry-After. It replaces any values already set under those names. An Unchecked
// decision gets only RateLimit-Policy: there is no true remaining count to send.
func SetHeaders(h http.Header, d Decision) {
	h.Set(HeaderPolicy, d.PolicyHeader())
	if d.Unchecked {
		h.Del(HeaderRateLimit)
		return
	}
	h.Set(HeaderRateLimit, d.Header())
	if !d.Allowed {
		h.Set(HeaderRetryAfter, strconv.Itoa(d.RetryAfterSeconds()))
	}
}

// ceilSeconds rounds d up to whole seconds; negative durations give 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	n := int64(d / time.Second)
	if d%time.Second != 0 {
		n++
	}
	return n
}

// appendSFString appends s as a Structured Fields sf-string (RFC 9651, section 3.3.3):
// quoted, with `"` and `\` escaped. Bytes outside printable ASCII, which an sf-string
// cannot hold and Policy.Validate rejects, become '?' so the field stays well-formed.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
