// Package mailtest is a real SMTP server for tests, on loopback, that keeps what it
// receives: the way a test reads a verification token, as its recipient would (the
// outbox keeps none).
package mailtest

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"chessd/postgres/pgtest"
)

// Config is how an Inbox behaves beyond the plain case.
type Config struct {
	Failures int         // the first Failures messages are refused with TryLater
	Listen   string      // default 127.0.0.1:0
	TLS      *tls.Config // offers STARTTLS with it
	// User and Password are the one login PLAIN accepts; empty: AUTH is offered, no
	// login accepted
	User, Password string
	// OnData, when set, runs at each DATA (try counts from 1) before it is answered;
	// an error refuses the message
	OnData func(try int) error
}

// Message is one message received.
type Message struct {
	From string
	To   []string
	Data string // headers and body, as sent
	TLS  bool   // sent over TLS
	User string // who logged in
}

// TryLater is the temporary refusal of the first Config.Failures messages.
var TryLater = &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"}

// Inbox is a running SMTP server.
type Inbox struct {
	Addr string // host:port
	cfg  Config
	mu   sync.Mutex
	// tries counts DATA commands, refused ones included
	tries int
	got   []Message
}

// Start runs an Inbox until the test ends; a Listen on IPv6 skips the test where there
// is no IPv6 loopback.
func Start(t testing.TB, cfg Config) *Inbox {
	t.Helper()
	in := &Inbox{cfg: cfg}
	srv := smtp.NewServer(backend{in})
	srv.Domain = "localhost"
	srv.AllowInsecureAuth = true
	srv.TLSConfig = cfg.TLS
	listen := cfg.Listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil && strings.HasPrefix(listen, "[") {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	in.Addr = ln.Addr().String()
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	return in
}

// Messages answers the messages received so far, in order.
func (in *Inbox) Messages() []Message {
	in.mu.Lock()
	defer in.mu.Unlock()
	return slices.Clone(in.got)
}

// To answers the messages received for to so far, in order.
func (in *Inbox) To(to string) []Message {
	var out []Message
	for _, m := range in.Messages() {
		if slices.Contains(m.To, to) {
			out = append(out, m)
		}
	}
	return out
}

var tokenPattern = regexp.MustCompile(`(?:ev|rk)_[0-9A-Za-z]+`)

// Token answers the token in data (a verification's ev_… or a key recovery's rk_…);
// empty: none.
func Token(data string) string { return tokenPattern.FindString(data) }

// WaitToken waits for the n-th message (from 1) to to and answers the token it
// carries, failing the test when it carries none.
func (in *Inbox) WaitToken(t testing.TB, to string, n int) string {
	t.Helper()
	pgtest.WaitFor(t, "verification message "+to, func() bool { return len(in.To(to)) >= n })
	m := in.To(to)[n-1]
	token := Token(m.Data)
	if token == "" {
		t.Fatalf("no token in the message to %s:\n%s", to, m.Data)
	}
	return token
}

type backend struct{ in *Inbox }

func (b backend) NewSession(c *smtp.Conn) (smtp.Session, error) {
	return &session{in: b.in, conn: c}, nil
}

type session struct {
	in   *Inbox
	conn *smtp.Conn
	user string
	msg  Message
}

func (s *session) AuthMechanisms() []string { return []string{sasl.Plain} }
func (s *session) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, user, password string) error {
		if s.in.cfg.User == "" || user != s.in.cfg.User || password != s.in.cfg.Password {
			return errors.New("invalid login")
		}
		s.user = user
		return nil
	}), nil
}

func (s *session) Reset()        { s.msg = Message{} }
func (s *session) Logout() error { return nil }
func (s *session) Mail(from string, _ *smtp.MailOptions) error {
	s.msg.From = from
	return nil
}
func (s *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	s.msg.To = append(s.msg.To, to)
	return nil
}
func (s *session) Data(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	s.in.mu.Lock()
	s.in.tries++
	try := s.in.tries
	s.in.mu.Unlock()
	if s.in.cfg.OnData != nil {
		if err := s.in.cfg.OnData(try); err != nil {
			return err
		}
	}
	if try <= s.in.cfg.Failures {
		return TryLater
	}
	s.msg.Data = string(b)
	_, s.msg.TLS = s.conn.TLSConnectionState()
	s.msg.User = s.user
	s.in.mu.Lock()
	defer s.in.mu.Unlock()
	s.in.got = append(s.in.got, s.msg)
	return nil
}
