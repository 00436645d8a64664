package httpapi

import (
	"net/http"
	"testing"
)

// Per-address limits count an IPv6 client by its /64 and an IPv4 client by its address.
func TestLimitAddr(t *testing.T) {
	for _, tc := range []struct{ remote, want string }{
		{"203.0.113.7:5555", "203.0.113.7"},
		{"[::ffff:203.0.113.7]:5555", "203.0.113.7"},
		{"[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:443", "2001:db8:1:2::"},
		{"[2001:db8:1:2::1]:443", "2001:db8:1:2::"},
		{"[2001:db8:1:3::1]:443", "2001:db8:1:3::"},
		{"[::1]:80", "::"},
		{"not an address", "0.0.0.0"},
	} {
		r := &http.Request{RemoteAddr: tc.remote}
		if got := limitAddr(r).String(); got != tc.want {
			t.Errorf("limitAddr(%q) = %s, want %s", tc.remote, got, tc.want)
		}
	}
}
