package mail_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/mail"
	"chessd/postgres/pgtest"
	"chessd/syncbuf"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// inbox is a real SMTP server on loopback that keeps what it receives; it refuses the
// first failures messages with a temporary error.
type inbox struct {
	inboxConfig
	mu    sync.Mutex
	tries int
	got   []received
}

// inboxConfig is how an inbox behaves beyond the plain case.
type inboxConfig struct {
	failures int
	listen   string      // default 127.0.0.1:0
	tls      *tls.Config // offers STARTTLS with it
	// user and password are the one login PLAIN accepts; empty: AUTH is offered, no
	// login accepted
	user, password string
	// onData, when set, runs at each DATA (try counts from 1) before it is answered;
	// an error refuses the message
	onData func(try int) error
}

type received struct {
	from string
	to   []string
	data string
	tls  bool   // sent over TLS
	user string // who logged in
}

func startInbox(t *testing.T, failures int) (*inbox, string) {
	t.Helper()
	return startInboxWith(t, inboxConfig{failures: failures})
}

func startInboxWith(t *testing.T, cfg inboxConfig) (*inbox, string) {
	t.Helper()
	in := &inbox{inboxConfig: cfg}
	srv := smtp.NewServer(in)
	srv.Domain = "localhost"
	srv.AllowInsecureAuth = true
	srv.TLSConfig = cfg.tls
	ln, err := net.Listen("tcp", or(cfg.listen, "127.0.0.1:0"))
	if err != nil && strings.HasPrefix(cfg.listen, "[") {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	return in, ln.Addr().String()
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func (in *inbox) NewSession(c *smtp.Conn) (smtp.Session, error) {
	return &session{in: in, conn: c}, nil
}

type session struct {
	in   *inbox
	conn *smtp.Conn
	user string
	msg  received
}

func (s *session) AuthMechanisms() []string { return []string{sasl.Plain} }
func (s *session) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, user, password string) error {
		if s.in.user == "" || user != s.in.user || password != s.in.password {
			return errors.New("invalid login")
		}
		s.user = user
		return nil
	}), nil
}

func (s *session) Reset()        { s.msg = received{} }
func (s *session) Logout() error { return nil }
func (s *session) Mail(from string, _ *smtp.MailOptions) error {
	s.msg.from = from
	return nil
}
func (s *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	s.msg.to = append(s.msg.to, to)
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
	if s.in.onData != nil {
		if err := s.in.onData(try); err != nil {
			return err
		}
	}
	if try <= s.in.failures {
		return tryLater
	}
	s.msg.data = string(b)
	_, s.msg.tls = s.conn.TLSConnectionState()
	s.msg.user = s.user
	s.in.mu.Lock()
	defer s.in.mu.Unlock()
	s.in.got = append(s.in.got, s.msg)
	return nil
}

var tryLater = &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"}

func (in *inbox) messages() []received {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]received(nil), in.got...)
}

var tokenInBody = regexp.MustCompile(`ev_[0-9A-Za-z]+`)

// A signup's verification message reaches a real SMTP server (after two refusals,
// retried), carries a token that verifies the address once, and the account is then
// verified; a wrong, used or foreign token is refused.
func TestVerificationMailOverSMTP(t *testing.T) {
	pool := pgtest.NewDB(t)
	in, addr := startInbox(t, 2)
	logger := slog.New(slog.DiscardHandler)
	h := commands.New(eventstore.NewStore(pool, logger), []byte("mail-test-pepper-0123456789"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sender := mail.NewSender(mail.Config{SMTPAddr: addr, From: "noreply@chessd.test", Poll: 50 * time.Millisecond, RetryBase: 20 * time.Millisecond}, pool, logger)
	done := make(chan struct{})
	go func() { sender.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	su, err := h.Signup(context.Background(), domain.Signup{Email: "Grace@Example.com"}, "req-1")
	if err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, "the verification message", func() bool { return len(in.messages()) == 1 })
	msg := in.messages()[0]
	if msg.from != "noreply@chessd.test" || len(msg.to) != 1 || msg.to[0] != "grace@example.com" ||
		!strings.Contains(msg.data, "Subject: Verify your e-mail address for chessd") || !strings.Contains(msg.data, su.AccountID) {
		t.Fatalf("message %+v", msg)
	}
	var attempts int
	var via string
	sent := func() bool {
		return pool.QueryRow(context.Background(), `SELECT attempts, sent_via FROM mail_outbox WHERE account_id = $1 AND sent_at IS NOT NULL`,
			su.AccountID).Scan(&attempts, &via) == nil
	}
	pgtest.WaitFor(t, "the message to be marked sent", sent)
	if attempts != 3 || via != "smtp" {
		t.Fatalf("sent after %d attempts via %q, want the third via smtp", attempts, via)
	}
	token := tokenInBody.FindString(msg.data)
	if token == "" {
		t.Fatalf("no token in %q", msg.data)
	}

	bg := context.Background()
	for _, bad := range []string{"ev_" + strings.Repeat("x", 32), token + "x", ""} {
		if _, err := h.VerifyEmail(bg, bad, "r"); domain.ErrorCode(err) != domain.CodeInvalid {
			t.Fatalf("token %q: %v, want invalid", bad, err)
		}
	}
	a, err := commands.LoadAccount(bg, pool, su.AccountID)
	if err != nil || a.Verified() {
		t.Fatalf("verified before the token: %v %v", a.Verified(), err)
	}
	a, err = h.VerifyEmail(bg, token, "r")
	if err != nil || !a.Verified() || a.ID() != su.AccountID {
		t.Fatalf("verify: %+v %v", a, err)
	}
	if _, err := h.VerifyEmail(bg, token, "r"); domain.ErrorCode(err) != domain.CodeInvalid {
		t.Fatalf("a used token: %v, want invalid", err)
	}
	var verified int
	if err := pool.QueryRow(bg, `SELECT count(*) FROM events WHERE stream_id = $1 AND event_type = 'EmailVerified'`, domain.AccountStream(su.AccountID)).Scan(&verified); err != nil || verified != 1 {
		t.Fatalf("%d EmailVerified events (%v)", verified, err)
	}
	// a verified account asks for no new message
	key, err := commands.LoadKey(bg, pool, su.KeyID)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.ResendVerification(bg, commands.Actor{Key: key}); domain.ErrorCode(err) != domain.CodeConflict {
		t.Fatalf("resend when verified: %v", err)
	}
}

// Without an SMTP server the message goes to the log and is marked sent there.
func TestMailToTheLogWithoutSMTP(t *testing.T) {
	pool := pgtest.NewDB(t)
	var buf syncbuf.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	h := commands.New(eventstore.NewStore(pool, logger), []byte("mail-test-pepper-0123456789"))
	if _, err := h.Signup(context.Background(), domain.Signup{Email: "log@example.com"}, "r"); err != nil {
		t.Fatal(err)
	}
	sender := mail.NewSender(mail.Config{}, pool, logger)
	if n := sender.SendDue(context.Background()); n != 1 {
		t.Fatalf("sent %d messages, want 1", n)
	}
	if !strings.Contains(buf.String(), "to=log@example.com") || !tokenInBody.MatchString(buf.String()) {
		t.Fatalf("log: %s", buf.String())
	}
	var via string
	if err := pool.QueryRow(context.Background(), `SELECT sent_via FROM mail_outbox WHERE sent_at IS NOT NULL`).Scan(&via); err != nil || via != "log" {
		t.Fatalf("sent via %q (%v)", via, err)
	}
	if n := sender.SendDue(context.Background()); n != 0 {
		t.Fatalf("sent %d more", n)
	}
}

// A server that accepts and never answers fails the message within the timeout (kept
// for a retry, its error recorded) instead of holding the sender.
func TestSilentSMTPServerTimesOut(t *testing.T) {
	pool := pgtest.NewDB(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() //nolint:gocritic // held open, silent, until the test ends
		}
	}()
	logger := slog.New(slog.DiscardHandler)
	h := commands.New(eventstore.NewStore(pool, logger), []byte("mail-test-pepper-0123456789"))
	if _, err := h.Signup(context.Background(), domain.Signup{Email: "silent@example.com"}, "r"); err != nil {
		t.Fatal(err)
	}
	sender := mail.NewSender(mail.Config{SMTPAddr: ln.Addr().String(), Timeout: 300 * time.Millisecond}, pool, logger)
	if n := sender.SendDue(context.Background()); n != 1 {
		t.Fatalf("tried %d messages, want 1", n)
	}
	var sent bool
	var lastError *string
	if err := pool.QueryRow(context.Background(), `SELECT sent_at IS NOT NULL, last_error FROM mail_outbox`).Scan(&sent, &lastError); err != nil {
		t.Fatal(err)
	}
	if sent || lastError == nil || !strings.Contains(*lastError, "timeout") {
		t.Fatalf("sent %v, last error %v", sent, lastError)
	}
}
