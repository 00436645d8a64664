package mail_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/commands"
	"chessd/eventstore"
	"chessd/mail"
	"chessd/mail/mailtest"
	"chessd/postgres/pgtest"
)

// The SQL of the previous release (aabf4a4), which runs beside this one during a
// rolling upgrade: how it queued a message, and how its sender claimed one (with its
// defaults: 10 attempts, a claim of twice its 1-minute Timeout), gave a claim back when
// stopping, and recorded a failure or a send. Copied, not derived: this release must
// not change what they do.
const (
	olderQueue = `INSERT INTO mail_outbox (account_id, to_email, subject, body) VALUES ($1, $2, $3, $4)`
	olderClaim = `UPDATE mail_outbox SET attempts = attempts + 1, next_attempt_at = now() + make_interval(secs => $2)
		WHERE id = (SELECT id FROM mail_outbox WHERE sent_at IS NULL AND next_attempt_at <= now() AND attempts < $1
		            ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
		RETURNING id, to_email, subject, body, attempts`
	olderRelease = `UPDATE mail_outbox SET attempts = attempts - 1, next_attempt_at = now()
			WHERE id = $1 AND attempts = $2 AND sent_at IS NULL`
	olderSent = `UPDATE mail_outbox SET sent_at = now(), sent_via = $2, last_error = NULL
			WHERE id = $1 AND sent_at IS NULL`
	olderFailure = `UPDATE mail_outbox SET last_error = $3, next_attempt_at = now() + make_interval(secs => $4)
		WHERE id = $1 AND attempts = $2 AND sent_at IS NULL`
)

// olderClaimed is what the older claim took: the row's id, recipient, body and attempts.
type olderClaimed struct {
	id       int64
	to, body string
	attempts int
}

// querier is a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// claimAsOlder runs the older release's claim; ok is false when it took nothing.
func claimAsOlder(q querier) (m olderClaimed, ok bool, err error) {
	var subject string
	err = q.QueryRow(context.Background(), olderClaim, 10, 120).Scan(&m.id, &m.to, &subject, &m.body, &m.attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		return m, false, nil
	}
	return m, err == nil, err
}

// noOlderClaim fails the test when the older release's sender would claim a message
// (the claim is rolled back: only looked for).
func noOlderClaim(t *testing.T, pool *pgxpool.Pool, when string) {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // only looked
	m, ok, err := claimAsOlder(tx)
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		t.Fatalf("%s, the older release's sender claims message %d to %s, body %.30q…", when, m.id, m.to, m.body)
	}
}

// queueAsOlder queues a message as the older release's commands did: its body in the
// clear, announced to the senders at the commit.
func queueAsOlder(t *testing.T, pool *pgxpool.Pool, to, body string) {
	t.Helper()
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(context.Background(), olderQueue, "acct_older", to, "Verify", body); err != nil {
			return err
		}
		return eventstore.Notify(context.Background(), tx, commands.TopicMail)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The older release's sender, still running during a rolling upgrade, never claims a
// message this release queued (sealed: it would mail the ciphertext as the message and
// mark it sent, the token lost), nor one this release took over from an older server:
// queued, failed and waiting for its retry, due again, or sent.
func TestOlderSenderClaimsNoneOfThisReleasesMail(t *testing.T) {
	pool := pgtest.NewDB(t)
	bg := context.Background()
	logger := slog.New(slog.DiscardHandler)
	queue(t, pool, 2)
	noOlderClaim(t, pool, "with this release's messages queued")

	const body = "use this token: ev_0123456789abcdefABCDEF"
	queueAsOlder(t, pool, "older@example.com", body) // the older sender may claim this one, until taken over
	down := mail.NewSender(mail.Config{SMTPAddr: closedAddr(t), RetryBase: time.Hour, Seal: sealer(t)}, pool, logger)
	for mail.Pass(bg, down) > 0 {
	}
	var failed int
	if err := pool.QueryRow(bg, `SELECT count(*) FROM mail_outbox WHERE attempts = 1 AND last_error IS NOT NULL`).Scan(&failed); err != nil || failed != 3 {
		t.Fatalf("%d messages failed once (%v), want 3", failed, err)
	}
	noOlderClaim(t, pool, "with the messages failed and waiting, one of them taken over from an older server")
	if _, err := pool.Exec(bg, `UPDATE mail_outbox SET due_at = now()`); err != nil {
		t.Fatal(err) // their retry is due
	}
	noOlderClaim(t, pool, "with the messages due again")

	in := mailtest.Start(t, mailtest.Config{})
	up := mail.NewSender(mail.Config{SMTPAddr: in.Addr, Seal: sealer(t)}, pool, logger)
	for mail.Pass(bg, up) > 0 {
	}
	if n := unsent(t, pool); n != 0 {
		t.Fatalf("%d messages unsent", n)
	}
	noOlderClaim(t, pool, "with the messages sent")
	if msgs := in.To("older@example.com"); len(msgs) != 1 || !strings.Contains(msgs[0].Data, body) {
		t.Fatalf("received %+v, want the older server's message as it was queued, once", msgs)
	}
	if got := len(in.Messages()); got != 3 {
		t.Fatalf("%d messages received, want 3", got)
	}
	for _, row := range outboxRows(t, pool) {
		if mailtest.Token(row) != "" {
			t.Fatalf("a token in the outbox: %s", row)
		}
	}
}

// closedAddr is the address of an SMTP server that is down.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	return ln.Addr().String()
}

// While this release's sender runs (no restart), an older server still running queues
// messages in the clear. One this sender takes over: sealed at once, sent, cleared. One
// the older server's own sender claims and sends first: this sender clears the body
// the older one leaves, at its next pass.
func TestOlderServersMailTakenOverWhileRunning(t *testing.T) {
	pool := pgtest.NewDB(t)
	bg := context.Background()
	in := mailtest.Start(t, mailtest.Config{})
	cfg := mail.Config{SMTPAddr: in.Addr, Poll: 50 * time.Millisecond, Seal: sealer(t)}
	run(t, mail.NewSender(cfg, pool, slog.New(slog.DiscardHandler)))

	const queued = "use this token: ev_QueuedByAnOlderServer0123"
	queueAsOlder(t, pool, "taken@example.com", queued)
	pgtest.WaitFor(t, "the older server's message sent", func() bool { return unsent(t, pool) == 0 })
	if msgs := in.To("taken@example.com"); len(msgs) != 1 || !strings.Contains(msgs[0].Data, queued) {
		t.Fatalf("received %+v, want the message as the older server queued it, once", msgs)
	}

	// the older server queues and its sender sends before this one's next pass
	const sentByOlder = "use this token: ev_SentByAnOlderSender456789"
	err := pgx.BeginFunc(bg, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(bg, olderQueue, "acct_older", "older@example.com", "Verify", sentByOlder); err != nil {
			return err
		}
		m, ok, err := claimAsOlder(tx)
		if err != nil {
			return err
		}
		if !ok || m.body != sentByOlder {
			return fmt.Errorf("the older sender claimed %+v, want its message", m)
		}
		_, err = tx.Exec(bg, olderSent, m.id, "smtp")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, "the body the older sender left cleared", func() bool {
		for _, row := range outboxRows(t, pool) {
			if mailtest.Token(row) != "" {
				return false
			}
		}
		return true
	})
	if got := len(in.To("older@example.com")); got != 0 {
		t.Fatalf("the message the older sender sent was sent again %d times", got)
	}
	var cleared int
	if err := pool.QueryRow(bg, `SELECT count(*) FROM mail_outbox WHERE sent_at IS NOT NULL AND body = ''`).Scan(&cleared); err != nil || cleared != 2 {
		t.Fatalf("%d messages sent and cleared (%v), want 2", cleared, err)
	}
}

// This sender takes over a message an older sender has claimed and may be sending:
// it keeps that claim, so it does not send the message while the claim holds. The
// older sender's failure then is not recorded (which would make the message due for
// the older claim again, sealed now); once the claim lapses this sender sends it, once.
// A message the older sender records sent after the takeover is not sent again.
func TestOlderSendersClaimKeptOnTakeover(t *testing.T) {
	pool := pgtest.NewDB(t)
	bg := context.Background()
	in := mailtest.Start(t, mailtest.Config{})
	sender := mail.NewSender(mail.Config{SMTPAddr: in.Addr, Seal: sealer(t)}, pool, slog.New(slog.DiscardHandler))
	const failing, delivered = "token ev_TheOlderSenderFails0123", "token ev_TheOlderSenderDelivers45"
	queueAsOlder(t, pool, "fails@example.com", failing)
	queueAsOlder(t, pool, "delivers@example.com", delivered)
	first, ok, err := claimAsOlder(pool)
	if err != nil {
		t.Fatal(err)
	}
	second, ok2, err := claimAsOlder(pool)
	if err != nil {
		t.Fatal(err)
	}
	if !ok || !ok2 || first.body != failing || second.body != delivered {
		t.Fatalf("the older sender claimed %+v and %+v, want both messages", first, second)
	}

	if n := mail.Pass(bg, sender); n != 0 {
		t.Fatalf("sent %d messages an older sender holds", n)
	}
	for _, row := range outboxRows(t, pool) {
		if mailtest.Token(row) != "" || !strings.Contains(row, "sealed1:") {
			t.Fatalf("not sealed on takeover: %s", row)
		}
	}
	// refused (0047's check) or matching nothing: either way not recorded
	if tag, err := pool.Exec(bg, olderFailure, first.id, first.attempts, "smtp: refused", 2); err == nil && tag.RowsAffected() != 0 {
		t.Fatal("the older sender's failure recorded: the takeover left it the claim")
	}
	if tag, err := pool.Exec(bg, olderRelease, first.id, first.attempts); err == nil && tag.RowsAffected() != 0 {
		t.Fatal("the older sender gave the claim back: the takeover left it the claim")
	}
	if tag, err := pool.Exec(bg, olderSent, second.id, "smtp"); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("the older sender's send not recorded (%v)", err)
	}
	noOlderClaim(t, pool, "after the takeover")

	if _, err := pool.Exec(bg, `UPDATE mail_outbox SET due_at = now()`); err != nil {
		t.Fatal(err) // the older claim lapses
	}
	for mail.Pass(bg, sender) > 0 {
	}
	if msgs := in.To("fails@example.com"); len(msgs) != 1 || !strings.Contains(msgs[0].Data, failing) {
		t.Fatalf("received %+v, want the message the older sender failed, once", msgs)
	}
	if got := len(in.Messages()); got != 1 {
		t.Fatalf("%d messages received, want the one the older sender did not deliver", got)
	}
	for _, row := range outboxRows(t, pool) {
		if mailtest.Token(row) != "" || strings.Contains(row, "sealed1:") {
			t.Fatalf("a body left after sending: %s", row)
		}
	}
}

// A message an older server queued that failed and waits for its last try keeps that
// try when this sender takes it over (taking over counted as a try: at 9 of 10 the
// message was never sent).
func TestTakeoverKeepsTheLastTry(t *testing.T) {
	pool := pgtest.NewDB(t)
	bg := context.Background()
	in := mailtest.Start(t, mailtest.Config{})
	sender := mail.NewSender(mail.Config{SMTPAddr: in.Addr, Seal: sealer(t)}, pool, slog.New(slog.DiscardHandler))
	const body = "token ev_NineTriesFailedAlready012"
	queueAsOlder(t, pool, "ninth@example.com", body)
	if _, err := pool.Exec(bg, `UPDATE mail_outbox SET attempts = 9, last_error = 'smtp: 451', next_attempt_at = now()`); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		for mail.Pass(bg, sender) > 0 {
		}
	}
	if msgs := in.To("ninth@example.com"); len(msgs) != 1 || !strings.Contains(msgs[0].Data, body) {
		t.Fatalf("received %d messages, want the one on its last try", len(msgs))
	}
}
