package mail_test

import (
	"context"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/mail"
	"chessd/mail/mailtest"
	"chessd/postgres/pgtest"
	"chessd/syncbuf"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// testPepper is the key pepper of the tests' command handlers and senders.
var testPepper = []byte("mail-test-pepper-0123456789")

// sealer opens what commands built with testPepper seal.
func sealer(t testing.TB) *domain.Sealer {
	t.Helper()
	s, err := commands.NewMailSealer(testPepper)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A signup's verification message reaches a real SMTP server (after two refusals,
// retried), carries a token that verifies the address once, and the account is then
// verified; a wrong, used or foreign token is refused.
func TestVerificationMailOverSMTP(t *testing.T) {
	pool := pgtest.NewDB(t)
	in := mailtest.Start(t, mailtest.Config{Failures: 2})
	logger := slog.New(slog.DiscardHandler)
	h := commands.New(eventstore.NewStore(pool, logger), testPepper)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sender := mail.NewSender(mail.Config{SMTPAddr: in.Addr, From: "noreply@chessd.test", Poll: 50 * time.Millisecond, RetryBase: 20 * time.Millisecond, Seal: sealer(t)}, pool, logger)
	done := make(chan struct{})
	go func() { sender.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	su, err := h.Signup(context.Background(), domain.Signup{Email: "Grace@Example.com"}, "req-1")
	if err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, "the verification message", func() bool { return len(in.Messages()) == 1 })
	msg := in.Messages()[0]
	if msg.From != "noreply@chessd.test" || len(msg.To) != 1 || msg.To[0] != "grace@example.com" ||
		!strings.Contains(msg.Data, "Subject: Verify your e-mail address for chessd") || !strings.Contains(msg.Data, su.AccountID) {
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
	token := mailtest.Token(msg.Data)
	if token == "" {
		t.Fatalf("no token in %q", msg.Data)
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
	h := commands.New(eventstore.NewStore(pool, logger), testPepper)
	if _, err := h.Signup(context.Background(), domain.Signup{Email: "log@example.com"}, "r"); err != nil {
		t.Fatal(err)
	}
	sender := mail.NewSender(mail.Config{Seal: sealer(t)}, pool, logger)
	if n := sender.SendDue(context.Background()); n != 1 {
		t.Fatalf("sent %d messages, want 1", n)
	}
	if !strings.Contains(buf.String(), "to=log@example.com") || mailtest.Token(buf.String()) == "" {
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
	h := commands.New(eventstore.NewStore(pool, logger), testPepper)
	if _, err := h.Signup(context.Background(), domain.Signup{Email: "silent@example.com"}, "r"); err != nil {
		t.Fatal(err)
	}
	sender := mail.NewSender(mail.Config{SMTPAddr: ln.Addr().String(), Timeout: 300 * time.Millisecond, Seal: sealer(t)}, pool, logger)
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
