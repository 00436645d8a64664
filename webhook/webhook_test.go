package webhook

import (
	"testing"
	"time"
)

// Deliveries reach public addresses only (unless allowed): the check runs on the
// address actually dialled.
func TestPublicOnly(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"93.184.216.34:443", true},
		{"[2606:2800:220:1:248:1893:25c8:1946]:443", true},
		{"127.0.0.1:80", false},
		{"[::1]:443", false},
		{"10.1.2.3:443", false},
		{"172.16.0.9:443", false},
		{"192.168.1.1:443", false},
		{"169.254.169.254:80", false}, // cloud metadata
		{"[fe80::1]:443", false},
		{"0.0.0.0:443", false},
		{"[::ffff:127.0.0.1]:443", false},
	} {
		if err := publicOnly("tcp", tc.addr, nil); (err == nil) != tc.ok {
			t.Errorf("%s: %v, want allowed %v", tc.addr, err, tc.ok)
		}
	}
}

func TestSignAndVerify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"id":"whd_1"}`)
	h := Sign("whsec_a", now, body)
	if !Verify("whsec_a", h, body, now.Add(time.Minute), 5*time.Minute) {
		t.Fatal("a fresh signature does not verify")
	}
	for name, ok := range map[string]bool{
		"another secret": Verify("whsec_b", h, body, now, 5*time.Minute),
		"another body":   Verify("whsec_a", h, []byte(`{"id":"whd_2"}`), now, 5*time.Minute),
		"too old":        Verify("whsec_a", h, body, now.Add(10*time.Minute), 5*time.Minute),
		"no header":      Verify("whsec_a", "", body, now, 5*time.Minute),
	} {
		if ok {
			t.Errorf("%s: verified", name)
		}
	}
}
