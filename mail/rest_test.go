package mail_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/mail"
	"chessd/mail/mailtest"
	"chessd/postgres/pgtest"
)

// outboxRows answers each mail_outbox row whole, as text: what a copy of the database
// shows.
func outboxRows(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT m::text FROM mail_outbox m ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// The outbox holds no usable verification token, before sending or after: a signup's
// and a resent message are queued sealed, reach their recipient with tokens that
// verify the address, and are then cleared, keeping who they went to, their subject
// and when.
func TestNoVerificationTokenAtRest(t *testing.T) {
	pool := pgtest.NewDB(t)
	bg := context.Background()
	in := mailtest.Start(t, mailtest.Config{})
	logger := slog.New(slog.DiscardHandler)
	h := commands.New(eventstore.NewStore(pool, logger), testPepper)
	su, err := h.Signup(bg, domain.Signup{Email: "victim@example.com"}, "r")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(bg, `UPDATE email_verifications SET created_at = created_at - interval '2 minutes'`); err != nil {
		t.Fatal(err) // past the minute a resend waits for
	}
	key, err := commands.LoadKey(bg, pool, su.KeyID)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.ResendVerification(bg, commands.Actor{Key: key}); err != nil {
		t.Fatal(err)
	}

	queued := outboxRows(t, pool)
	if len(queued) != 2 {
		t.Fatalf("%d messages queued, want signup's and the resent one", len(queued))
	}
	for _, row := range queued {
		if mailtest.Token(row) != "" || strings.Contains(row, "Welcome") {
			t.Fatalf("a queued message is readable in the outbox: %s", row)
		}
	}

	sender := mail.NewSender(mail.Config{SMTPAddr: in.Addr, Seal: sealer(t)}, pool, logger)
	for sender.SendDue(bg) > 0 {
	}
	msgs := in.To("victim@example.com")
	if len(msgs) != 2 {
		t.Fatalf("%d messages received, want 2", len(msgs))
	}
	sent := outboxRows(t, pool)
	for i, m := range msgs {
		token := mailtest.Token(m.Data)
		if token == "" {
			t.Fatalf("message %d carries no token:\n%s", i, m.Data)
		}
		for _, row := range sent {
			if strings.Contains(row, token) {
				t.Fatalf("the token sent is in the outbox: %s", row)
			}
		}
	}
	var cleared int
	if err := pool.QueryRow(bg, `SELECT count(*) FROM mail_outbox WHERE body = '' AND sent_at IS NOT NULL AND sent_via = 'smtp'
		AND to_email = 'victim@example.com' AND subject = 'Verify your e-mail address for chessd'`).Scan(&cleared); err != nil || cleared != 2 {
		t.Fatalf("%d messages sent and cleared, keeping recipient and subject (%v); want 2", cleared, err)
	}
	// the reviewer's query finds nothing
	var found int
	if err := pool.QueryRow(bg, `SELECT count(substring(body from 'ev_[A-Za-z0-9]+')) FROM mail_outbox`).Scan(&found); err != nil || found != 0 {
		t.Fatalf("%d tokens found in the outbox (%v)", found, err)
	}
	if a, err := h.VerifyEmail(bg, mailtest.Token(msgs[1].Data), "r"); err != nil || !a.Verified() {
		t.Fatalf("the delivered token: %v", err)
	}
}

// A sealed body opens only for the recipient it was queued for: moved to another
// address in the database, the message is not sent, and its failure is kept.
func TestSealedBodyGoesOnlyToItsRecipient(t *testing.T) {
	pool := pgtest.NewDB(t)
	bg := context.Background()
	in := mailtest.Start(t, mailtest.Config{})
	queue(t, pool, 1)
	if _, err := pool.Exec(bg, `UPDATE mail_outbox SET to_email = 'thief@example.com'`); err != nil {
		t.Fatal(err)
	}
	sender := mail.NewSender(mail.Config{SMTPAddr: in.Addr, Seal: sealer(t)}, pool, slog.New(slog.DiscardHandler))
	if n := sender.SendDue(bg); n != 1 {
		t.Fatalf("tried %d messages, want 1", n)
	}
	var lastError *string
	if err := pool.QueryRow(bg, `SELECT last_error FROM mail_outbox WHERE sent_at IS NULL`).Scan(&lastError); err != nil {
		t.Fatal(err)
	}
	if lastError == nil || !strings.Contains(*lastError, "does not open") || len(in.Messages()) != 0 {
		t.Fatalf("last error %v, %d messages received; want none sent, the failure kept", lastError, len(in.Messages()))
	}
}

// A message queued in the clear (before bodies were sealed, or by an older server) is
// sealed at a starting sender's first pass, even while it cannot be sent, and is
// delivered from its sealed form and then cleared.
func TestPlainMessageSealedAtStart(t *testing.T) {
	pool := pgtest.NewDB(t)
	bg := context.Background()
	const body = "use this token: ev_0123456789abcdefABCDEF"
	if _, err := pool.Exec(bg, `INSERT INTO mail_outbox (account_id, to_email, subject, body) VALUES ('acct_old', 'old@example.com', 'Verify', $1)`,
		body); err != nil {
		t.Fatal(err)
	}
	down, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down.Close() // an SMTP server that is down
	logger := slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithCancel(bg)
	done := make(chan struct{})
	downSender := mail.NewSender(mail.Config{SMTPAddr: down.Addr().String(), Poll: time.Hour, Seal: sealer(t)}, pool, logger)
	go func() { downSender.Run(ctx); close(done) }()
	pgtest.WaitFor(t, "the message sealed and tried", func() bool {
		rows := outboxRows(t, pool)
		var tried bool
		if err := pool.QueryRow(bg, `SELECT last_error IS NOT NULL FROM mail_outbox`).Scan(&tried); err != nil {
			t.Fatal(err)
		}
		return len(rows) == 1 && mailtest.Token(rows[0]) == "" && strings.Contains(rows[0], "sealed1:") && tried
	})
	cancel() // stopped before the message is made due: it would take it again
	<-done

	in := mailtest.Start(t, mailtest.Config{})
	if _, err := pool.Exec(bg, `UPDATE mail_outbox SET due_at = now()`); err != nil {
		t.Fatal(err)
	}
	if n := mail.NewSender(mail.Config{SMTPAddr: in.Addr, Seal: sealer(t)}, pool, logger).SendDue(bg); n != 1 {
		t.Fatalf("tried %d messages, want 1", n)
	}
	if msgs := in.To("old@example.com"); len(msgs) != 1 || !strings.Contains(msgs[0].Data, body) {
		t.Fatalf("received %+v, want the message as it was queued", msgs)
	}
	if rows := outboxRows(t, pool); mailtest.Token(rows[0]) != "" || strings.Contains(rows[0], "sealed1:") {
		t.Fatalf("after sending, the outbox keeps %s", rows[0])
	}
}
