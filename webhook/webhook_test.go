package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
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
		{"100.100.100.200:80", false}, // shared address space: a cloud's metadata service
		{"100.63.255.255:443", true},
		{"198.18.0.1:443", false},
		{"240.0.0.1:443", false},
		{"255.255.255.255:443", false},
		{"[64:ff9b::a9fe:a9fe]:80", false}, // NAT64 of 169.254.169.254
		{"[2002:a00:1::1]:443", false},     // 6to4 of 10.0.0.1
		{"[2001:0:4136:e378::1]:443", false},
		{"[2001:db8::1]:443", false},
		{"[::7f00:1]:443", false},   // IPv4-compatible 127.0.0.1
		{"[::a9fe:a9fe]:80", false}, // IPv4-compatible 169.254.169.254
		{"[fec0::1]:443", false},    // site-local
		{"[2a00:1450:4001:82b::200e]:443", true},
	} {
		err := publicOnly("tcp", tc.addr, nil)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want allowed %v", tc.addr, err, tc.ok)
		}
		if host, _, _ := net.SplitHostPort(tc.addr); err != nil && strings.Contains(err.Error(), strings.Trim(host, "[]")) {
			t.Errorf("%s: the error %q names the address", tc.addr, err)
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

// An endpoint's URL is an absolute https URI as RFC 3986 writes it: what url.Parse
// takes as it comes (spaces, quotes, angle brackets, non-ASCII) is refused.
func TestCheckURL(t *testing.T) {
	for _, tc := range []struct {
		url      string
		insecure bool
		ok       bool
	}{
		{"https://example.com/hooks", false, true},
		{"https://example.com:8443/a/b?x=1&y=%20z", false, true},
		{"https://[2606:4700:4700::1111]/h", false, true},
		{"https://1.1.1.1/h", false, true},
		{"https://1.1.1.1:8443/h", false, true},
		// an address the sender refuses, unless insecure (which lets it reach them)
		{"https://127.0.0.1/x", false, false},
		{"https://127.0.0.1/x", true, true},
		{"http://127.0.0.1:8080/x", true, true},
		{"https://10.1.2.3/x", false, false},
		{"https://192.168.0.1:8443/x", false, false},
		{"https://169.254.169.254/latest/meta-data", false, false},
		{"https://100.64.0.1/x", false, false},
		{"https://0.0.0.0/x", false, false},
		{"https://[::1]/x", false, false},
		{"https://[::1]:8443/x", false, false},
		{"https://[::ffff:127.0.0.1]/x", false, false},
		{"https://[fe80::1%25eth0]/x", false, false},
		{"https://[fd00::1]/x", false, false},
		{"https://[2001:db8::1]/h", false, false},
		{"https://[::1]/x", true, true},
		// a name is checked when sending, on what it resolves to then
		{"https://hooks.example.com/x", false, true},
		{"https://example.com./x", false, true},
		{"https://123.example.com/x", false, true},
		{"https://0x7f.example.com/x", false, true},
		{"https://example.com:65535/x", false, true},
		{"https://example.com:1/x", false, true},
		{"https://example.com:/x", false, true}, // an empty port is the scheme's
		// but never one that reads as an IP address to some clients and not to others
		{"https://0x7f000001/x", false, false},
		{"https://0x7F000001/x", true, false},
		{"https://0x/x", false, false},
		{"https://127.1/", false, false},
		{"http://127.1/", true, false},
		{"https://2130706433/", false, false},
		{"https://2130706433/", true, false},
		{"https://0/", false, false},
		{"https://0177.0.0.1/", false, false},
		{"https://010.0.0.1/", true, false},
		{"https://1.1.1.1./", false, false},
		{"https://1.1.1.1.1/", false, false},
		{"https://example.123/", false, false},
		{"https://example.0x1f/", false, false},
		// nor a port out of range
		{"https://example.com:0/", false, false},
		{"https://example.com:99999/", false, false},
		{"http://127.0.0.1:65536/", true, false},
		{"https://example.com:99999999999999999999/", false, false},
		{"https://[::1]:0/", true, false},
		// nor a host missing
		{"https://:443/x", false, false},
		// localhost is loopback (RFC 6761), a single label a name of our network only
		{"https://localhost/x", false, false},
		{"https://LOCALHOST./x", false, false},
		{"https://localhost:8443/x", false, false},
		{"https://hooks.localhost/x", false, false},
		{"https://intranet/x", false, false},
		{"https://intranet./x", false, false},
		{"https://localhost.example.com/x", false, true},
		{"http://localhost:8080/x", true, true},
		{"http://receiver:8080/x", true, true},
		{"http://example.com/h", false, false},
		{"http://example.com/h", true, true},
		{"ftp://example.com/h", false, false},
		{"https://user:pw@example.com/h", false, false},
		{"https://example.com/h#frag", false, false},
		{"/relative", false, false},
		{"not a uri", false, false},
		{`http://127.0.0.1:1/"><img src=x onerror=alert(4)>`, true, false},
		{"https://example.com/a b", false, false},
		{"https://example.com/caf\u00e9", false, false},
		{"https://example.com/%zz", false, false},
		{"https://example.com/" + strings.Repeat("a", 2000), false, false},
	} {
		if err := CheckURL(tc.url, tc.insecure); (err == nil) != tc.ok {
			t.Errorf("CheckURL(%q, %v) = %v, want ok %v", tc.url, tc.insecure, err, tc.ok)
		}
	}
}

// A failed try's last_error, which the customer reads, says what failed in words of
// our own: the net package's texts name our resolver ("lookup h on 10.255.255.53:53"),
// our side of a connection ("read tcp 10.0.0.7:51234->…") and what a host resolved to.
// The errors here are built as net and net/http wrap them.
func TestFailureNamesNothingOfOurs(t *testing.T) {
	post := func(err error) error { return &url.Error{Op: "Post", URL: "https://hooks.example.com/x", Err: err} }
	dial := func(err error) error {
		return post(&net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(203, 0, 113, 5), Port: 443}, Err: err})
	}
	read := func(err error) error {
		return post(&net.OpError{Op: "read", Net: "tcp", Source: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 51234},
			Addr: &net.TCPAddr{IP: net.IPv4(203, 0, 113, 5), Port: 443}, Err: err})
	}
	dns := func(e net.DNSError) error {
		e.Name, e.Server = "0x7f000001", "10.255.255.53:53"
		return post(&net.OpError{Op: "dial", Net: "tcp", Err: &e})
	}
	cert := &x509.Certificate{DNSNames: []string{"other.example.com"}}
	for _, tc := range []struct {
		name   string
		status int
		err    error
		want   string
	}{
		{"an answer", 503, nil, "HTTP 503"},
		{"not public", 0, dial(errNotPublic), NotPublicError},
		{"secret not opened", 0, ErrSecretSealed, "the delivery could not be signed on our side (no fault of the endpoint's); it is tried again while tries remain"},
		{"no such host", 0, dns(net.DNSError{Err: "no such host", IsNotFound: true}), "the endpoint's host name was not found (DNS: no such host)"},
		{"DNS timeout", 0, dns(net.DNSError{Err: "i/o timeout", IsTimeout: true}), "looking up the endpoint's host name timed out (DNS)"},
		{"DNS failure", 0, dns(net.DNSError{Err: "server misbehaving", IsTemporary: true}), "looking up the endpoint's host name failed (DNS)"},
		{"refused", 0, dial(os.NewSyscallError("connect", syscall.ECONNREFUSED)), "connection refused: nothing listens at the endpoint's address and port"},
		{"host unreachable", 0, dial(os.NewSyscallError("connect", syscall.EHOSTUNREACH)), "the endpoint's address is unreachable"},
		{"network unreachable", 0, dial(os.NewSyscallError("connect", syscall.ENETUNREACH)), "the endpoint's address is unreachable"},
		{"reset", 0, read(os.NewSyscallError("read", syscall.ECONNRESET)), "the connection was reset by the endpoint before it answered"},
		{"unknown authority", 0, post(&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{Cert: cert}}), "TLS certificate error: the endpoint's certificate is signed by an unknown authority"},
		{"wrong host", 0, post(&tls.CertificateVerificationError{Err: x509.HostnameError{Certificate: cert, Host: "hooks.example.com"}}), "TLS certificate error: the endpoint's certificate is not valid for its host name"},
		{"expired", 0, post(&tls.CertificateVerificationError{Err: x509.CertificateInvalidError{Cert: cert, Reason: x509.Expired}}), "TLS certificate error: the endpoint's certificate has expired or is not yet valid"},
		{"other certificate error", 0, post(&tls.CertificateVerificationError{Err: errors.New("x509: negative serial number")}), "TLS certificate error: the endpoint's certificate is not valid"},
		{"not TLS", 0, post(tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}), "TLS handshake failed: the endpoint does not speak TLS (plain HTTP on an https URL?)"},
		{"HTTP answer to TLS", 0, post(http.ErrSchemeMismatch), "TLS handshake failed: the endpoint does not speak TLS (plain HTTP on an https URL?)"},
		{"TLS alert", 0, post(&net.OpError{Op: "remote error", Err: errors.New("tls: handshake failure")}), "TLS handshake failed: the endpoint refused it (TLS alert)"},
		{"read timeout", 0, read(os.ErrDeadlineExceeded), "timed out: no answer within 10s"},
		{"context deadline", 0, post(context.DeadlineExceeded), "timed out: no answer within 10s"},
		{"closed", 0, post(io.EOF), "the endpoint closed the connection without answering"},
		{"closed mid-answer", 0, read(io.ErrUnexpectedEOF), "the endpoint closed the connection without answering"},
		{"anything else", 0, read(errors.New(`malformed HTTP response "\x15\x03\x01"`)), "the request failed before an answer came (connection or protocol error)"},
	} {
		if got := failure(tc.status, tc.err, 10*time.Second); got != tc.want {
			t.Errorf("%s: last_error %q, want %q", tc.name, got, tc.want)
		}
	}
}
