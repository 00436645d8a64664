package mail_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"log/slog"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"chessd/mail"
	"chessd/mail/mailtest"
	"chessd/postgres/pgtest"
)

// selfSigned is a certificate for localhost, 127.0.0.1 and ::1 signed by itself, as a
// stock postfix's snakeoil one is, and the pool that trusts it.
func selfSigned(t *testing.T) (*tls.Config, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, roots
}

// How the sender treats a server that offers STARTTLS (CHESSD_SMTP_TLS), and servers
// named by an IPv6 address.
func TestSMTPTLSModes(t *testing.T) {
	serverTLS, roots := selfSigned(t)
	logger := slog.New(slog.DiscardHandler)
	type outcome struct {
		sent    bool
		lastErr string
	}
	for _, c := range []struct {
		name    string
		listen  string
		mode    mail.TLSMode
		trusted bool // the sender trusts the certificate
		login   bool // the sender logs in with PLAIN
		noTLS   bool // the server offers no STARTTLS
		want    outcome
		wantTLS bool
	}{
		// verify is the default: a certificate nobody vouches for fails the message
		{name: "verify refuses a self-signed certificate", mode: "", want: outcome{lastErr: "certificate"}},
		{name: "skip-verify encrypts with it", mode: mail.TLSSkipVerify, login: true, want: outcome{sent: true}, wantTLS: true},
		{name: "off sends in the clear", mode: mail.TLSOff, want: outcome{sent: true}},
		{name: "verify accepts a trusted certificate", mode: mail.TLSVerify, trusted: true, login: true, want: outcome{sent: true}, wantTLS: true},
		// the certificate is checked against ::1, not against "["
		{name: "verify over IPv6", listen: "[::1]:0", mode: mail.TLSVerify, trusted: true, want: outcome{sent: true}, wantTLS: true},
		// PLAIN goes in the clear to localhost only: [::1] is localhost
		{name: "login over IPv6 loopback in the clear", listen: "[::1]:0", noTLS: true, login: true, want: outcome{sent: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			pool := pgtest.NewDB(t)
			cfg := mailtest.Config{Listen: c.listen, TLS: serverTLS, User: "chessd", Password: "s3cret"}
			if c.noTLS {
				cfg.TLS = nil
			}
			in := mailtest.Start(t, cfg)
			queue(t, pool, 1)
			mc := mail.Config{SMTPAddr: in.Addr, TLS: c.mode, Timeout: 5 * time.Second, Seal: sealer(t)}
			if c.login {
				mc.Username, mc.Password = "chessd", "s3cret"
			}
			s := mail.NewSender(mc, pool, logger)
			if c.trusted {
				mail.SetRoots(s, roots)
			}
			if n := s.SendDue(context.Background()); n != 1 {
				t.Fatalf("tried %d messages, want 1", n)
			}
			var got outcome
			var lastErr *string
			if err := pool.QueryRow(context.Background(), `SELECT sent_at IS NOT NULL, last_error FROM mail_outbox`).Scan(&got.sent, &lastErr); err != nil {
				t.Fatal(err)
			}
			if lastErr != nil {
				got.lastErr = *lastErr
			}
			if got.sent != c.want.sent || (c.want.lastErr == "") != (got.lastErr == "") || !strings.Contains(got.lastErr, c.want.lastErr) {
				t.Fatalf("sent %v, last error %q; want sent %v, an error with %q", got.sent, got.lastErr, c.want.sent, c.want.lastErr)
			}
			msgs := in.Messages()
			if !c.want.sent {
				if len(msgs) != 0 {
					t.Fatalf("the server received %d messages", len(msgs))
				}
				return
			}
			if len(msgs) != 1 || msgs[0].TLS != c.wantTLS || (msgs[0].User == "chessd") != c.login {
				t.Fatalf("received %+v; want one, over TLS %v, logged in %v", msgs, c.wantTLS, c.login)
			}
		})
	}
}
