package httpapi

import (
	"net/http"
	"net/netip"
	"testing"
)

// Per-address limits count an IPv6 client by its /64 and an IPv4 client by its address.
func TestLimitAddr(t *testing.T) {
	s := &Server{}
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
		if got := s.limitAddr(r).String(); got != tc.want {
			t.Errorf("limitAddr(%q) = %s, want %s", tc.remote, got, tc.want)
		}
	}
}

// X-Forwarded-For tells the client's address only when the peer is a trusted proxy,
// and only its right-most address that no trusted proxy wrote.
func TestClientIPBehindTrustedProxies(t *testing.T) {
	s := &Server{cfg: Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.1/32")}}}
	for _, tc := range []struct {
		name, remote string
		xff          []string
		want         string
	}{
		{"no proxy, header ignored", "198.51.100.9:1", []string{"203.0.113.7"}, "198.51.100.9"},
		{"trusted proxy", "10.1.2.3:1", []string{"203.0.113.7"}, "203.0.113.7"},
		{"a forged entry left of the real one", "10.1.2.3:1", []string{"1.2.3.4, 203.0.113.7"}, "203.0.113.7"},
		{"two trusted proxies", "10.1.2.3:1", []string{"203.0.113.7, 192.0.2.1"}, "203.0.113.7"},
		{"headers in order", "10.1.2.3:1", []string{"1.2.3.4", "203.0.113.7"}, "203.0.113.7"},
		{"only proxies", "10.1.2.3:1", []string{"10.9.9.9"}, "10.9.9.9"},
		{"no header", "10.1.2.3:1", nil, "10.1.2.3"},
		{"unreadable", "10.1.2.3:1", []string{"203.0.113.7, bogus"}, "10.1.2.3"},
		{"IPv6 client", "10.1.2.3:1", []string{"2001:db8::7"}, "2001:db8::7"},
	} {
		r := &http.Request{RemoteAddr: tc.remote, Header: http.Header{}}
		for _, v := range tc.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		if got := s.clientIP(r).String(); got != tc.want {
			t.Errorf("%s: clientIP = %s, want %s", tc.name, got, tc.want)
		}
	}
}
