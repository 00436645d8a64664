// Package mail sends what the commands queue in mail_outbox: through an SMTP server
// when one is configured, to the log otherwise (a development server's mail shows in
// its output). Any number of servers may run a Sender on one database: each message is
// claimed by one (SKIP LOCKED) for longer than sending it can take, and sent at least
// once; a failed send is tried again with a growing wait, and each row keeps how it went.
//
// A body is stored sealed (commands.NewMailSealer), opened only to be sent, and cleared
// once sent or given up (after MaxAttempts tries): a message carries a usable token,
// and the database must not hold one. Expire deletes the rows sent or given up longer
// ago than the retention age: the recipient and subject are not kept for ever either.
//
// Messages are scheduled by due_at (migration 0047); next_attempt_at stays 'infinity',
// so that an older chessd's sender, still running in a rolling upgrade and claiming by
// next_attempt_at, never takes one: it would mail the sealed body as the message. The
// rows an older server queues (no due_at) this sender takes over (adoptOlder), and it
// clears the bodies older senders leave on what they sent (clearSent).
package mail

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/smtp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
)

// Config says where mail goes.
type Config struct {
	// SMTPAddr is the SMTP server, host:port; empty: messages are written to the log.
	SMTPAddr string
	From     string // the sender's address; default chessd@localhost
	// Username and Password authenticate with PLAIN (only over TLS, or to localhost:
	// net/smtp refuses otherwise).
	Username, Password string
	// TLS is what happens when the server offers STARTTLS; default TLSVerify.
	TLS  TLSMode
	Poll time.Duration // look for due messages at least this often; default 5 s
	// Timeout bounds the sending of one message, connecting included; default 1 min. A
	// message is claimed for twice as long.
	Timeout time.Duration
	// RetryBase is the wait after a first failure, doubled after each next one (at most
	// an hour); default 2 s.
	RetryBase time.Duration
	// Seal opens the sealed bodies (commands.NewMailSealer of the key pepper); without
	// it a sealed message fails, and is tried again.
	Seal *domain.Sealer
}

// TLSMode says whether the sender encrypts with STARTTLS and checks the certificate.
type TLSMode string

const (
	// TLSVerify encrypts when the server offers STARTTLS and fails the message (tried
	// again later) unless the certificate is valid for the server's host name.
	TLSVerify TLSMode = "verify"
	// TLSSkipVerify encrypts when offered but accepts any certificate: for a local MTA
	// with a self-signed one (postfix's snakeoil); it does not stop an impersonator.
	TLSSkipVerify TLSMode = "skip-verify"
	// TLSOff never starts TLS: the conversation, a password included, goes in the clear.
	TLSOff TLSMode = "off"
)

// ParseTLSMode reads a TLSMode; empty is TLSVerify.
func ParseTLSMode(v string) (TLSMode, error) {
	switch m := TLSMode(v); m {
	case "":
		return TLSVerify, nil
	case TLSVerify, TLSSkipVerify, TLSOff:
		return m, nil
	}
	return "", fmt.Errorf("unknown SMTP TLS mode %q: want verify, skip-verify or off", v)
}

// MaxAttempts is how many times a message is tried: then it is given up, its error
// kept and its body cleared, and Expire deletes it once it has been given up for the
// retention age. One number for every server, not a setting: the sweep, on any server,
// tells a message given up from one still being tried by its attempts alone.
const MaxAttempts = 10

// recordTimeout bounds recording how a send went, which goes on after ctx ends: a
// message delivered and not recorded would be sent again.
const recordTimeout = 10 * time.Second

// Sender sends the outbox.
type Sender struct {
	cfg    Config
	pool   *pgxpool.Pool
	logger *slog.Logger
	roots  *x509.CertPool // the certificates TLSVerify trusts; nil: the system's
}

// NewSender builds a Sender.
func NewSender(cfg Config, pool *pgxpool.Pool, logger *slog.Logger) *Sender {
	if cfg.From == "" {
		cfg.From = "chessd@localhost"
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 5 * time.Second
	}
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = 2 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Minute
	}
	if cfg.TLS == "" {
		cfg.TLS = TLSVerify
	}
	return &Sender{cfg: cfg, pool: pool, logger: logger.With("component", "mail")}
}

// message is one claimed row. attempts, raised by each claim, tells claims apart: a
// sender still holds its claim while the row's attempts is the one it claimed with.
type message struct {
	id                int64
	to, subject, body string
	attempts          int
}

// Run sends due messages until ctx ends, woken by each queued message's commit. A
// message being sent when ctx ends is finished (within Timeout) and recorded; no other
// is started.
func (s *Sender) Run(ctx context.Context) {
	eventstore.Drain(ctx, s.pool, s.logger, commands.TopicMail, s.cfg.Poll, s.pass)
}

// pass sends the next due message; when none is, it first takes over what older
// servers left in the outbox, each pass (at least every Poll): an older server may
// queue, and send, at any time while it runs.
func (s *Sender) pass(ctx context.Context) int {
	if n := s.SendDue(ctx); n > 0 {
		return n
	}
	if n, err := s.adoptOlder(ctx); err != nil && ctx.Err() == nil {
		s.logger.Warn("mail an older server queued not taken over; tried again at the next pass", "err", err)
	} else if n > 0 {
		s.logger.Info("took over mail an older server queued", "messages", n)
	}
	if err := s.clearSent(ctx); err != nil && ctx.Err() == nil {
		s.logger.Warn("sent mail's bodies not cleared; tried again at the next pass", "err", err)
	}
	return s.SendDue(ctx)
}

// SendDue claims the oldest due message and sends it; it returns how many it tried (0
// or 1). Messages are claimed one at a time, each for twice the longest its sending can
// take (Timeout): a batch claimed at once and sent in turn outlasted its claim, and
// another server claimed and sent the batch's later messages again.
func (s *Sender) SendDue(ctx context.Context) int {
	if ctx.Err() != nil {
		return 0
	}
	m, err := s.claim(ctx)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0
	}
	if err != nil {
		if ctx.Err() == nil {
			s.logger.Warn("no mail claimed", "err", err)
		}
		return 0
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	if ctx.Err() != nil {
		// stopping: give the message back untried rather than start sending it now; not
		// one Expire has given up meanwhile, its body cleared (a last try's claim that
		// lapsed while this server was paused), which would be sent empty
		if _, err := s.pool.Exec(rctx, `UPDATE mail_outbox SET attempts = attempts - 1, due_at = now()
			WHERE id = $1 AND attempts = $2 AND sent_at IS NULL AND body <> ''`, m.id, m.attempts); err != nil {
			s.logger.Warn("release mail claim; it is tried again when the claim lapses", "id", m.id, "err", err)
		}
		return 0
	}
	// Sent whatever ctx does meanwhile: cut off mid-conversation, the message may or
	// may not have arrived, and would be sent again.
	via, sendErr := s.send(m)
	if sendErr == nil {
		// recorded whoever holds the claim now: it went out, so no server sends it again;
		// its body is cleared, the token it carried being the recipient's alone
		tag, err := s.pool.Exec(rctx, `UPDATE mail_outbox SET sent_at = now(), sent_via = $2, last_error = NULL, body = ''
			WHERE id = $1 AND sent_at IS NULL`, m.id, via)
		switch {
		case err != nil:
			s.logger.Error("mail sent but not recorded as sent; it will be sent again", "id", m.id, "err", err)
		case tag.RowsAffected() == 0:
			s.logger.Warn("mail sent by another server too", "id", m.id)
		}
		return 1
	}
	// The last try given up: its body, never to be opened again, is cleared, and its
	// due_at, which no claim reads any more, says when it was given up (Expire).
	giveUp := m.attempts >= MaxAttempts
	wait := min(s.cfg.RetryBase<<min(m.attempts-1, 20), time.Hour)
	if giveUp {
		wait = 0
		s.logger.Warn("mail not sent; out of tries, given up", "id", m.id, "attempt", m.attempts, "err", sendErr)
	} else {
		s.logger.Warn("mail not sent; will retry", "id", m.id, "attempt", m.attempts, "retry_in", wait, "err", sendErr)
	}
	// only while the claim is still ours: a claim that lapsed (this server paused past
	// it) may be another server's now, which this would cut short
	tag, err := s.pool.Exec(rctx, `UPDATE mail_outbox SET last_error = $3, due_at = now() + make_interval(secs => $4),
			body = CASE WHEN $5 THEN '' ELSE body END
		WHERE id = $1 AND attempts = $2 AND sent_at IS NULL`, m.id, m.attempts, sendErr.Error(), wait.Seconds(), giveUp)
	switch {
	case err != nil:
		s.logger.Warn("record mail failure", "id", m.id, "err", err)
	case tag.RowsAffected() == 0:
		s.logger.Warn("mail failure not recorded: the claim lapsed and another server has the message", "id", m.id)
	}
	return 1
}

// claim takes the oldest due message, raising its attempts, and moves its next
// attempt past the time its sending can take: a sender that dies mid-send leaves it to
// be tried again then, by any server. pgx.ErrNoRows: none is due.
func (s *Sender) claim(ctx context.Context) (message, error) {
	var m message
	// A scalar subquery runs once. Joined instead (FROM), the planner may rescan it for
	// each row of mail_outbox, and each rescan skips the rows claimed so far and locks
	// the next: it claimed every due message. FOR UPDATE checks its conditions again on
	// a row another sender claimed meanwhile.
	err := s.pool.QueryRow(ctx, `UPDATE mail_outbox SET attempts = attempts + 1, due_at = now() + make_interval(secs => $2)
		WHERE id = (SELECT id FROM mail_outbox WHERE sent_at IS NULL AND due_at <= now() AND attempts < $1
		            ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
		RETURNING id, to_email, subject, body, attempts`,
		MaxAttempts, (2*s.cfg.Timeout).Seconds()).Scan(&m.id, &m.to, &m.subject, &m.body, &m.attempts)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return m, fmt.Errorf("claim mail: %w", err)
	}
	return m, err
}

// adoptOlder takes over the unsent messages an older chessd queued (due_at NULL: the
// older release's, still running in a rolling upgrade, or queued before migration
// 0047): it seals a body in the clear and moves the row's time to due_at, out of the
// older claim's reach (next_attempt_at 'infinity'). The time kept is next_attempt_at's
// as it is, so a claim an older sender holds (it may be sending the message right now)
// is kept: this sender tries the message only when that claim would have lapsed. An
// older sender holding one still records it sent, which ends the message; its failure
// or give-back, either of which would make it due for the older claim again, its body
// sealed, is refused by 0047's check. It answers how many it took over.
func (s *Sender) adoptOlder(ctx context.Context) (int, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, to_email, body FROM mail_outbox WHERE sent_at IS NULL AND due_at IS NULL ORDER BY id`)
	if err != nil {
		return 0, fmt.Errorf("read older servers' mail: %w", err)
	}
	older, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (message, error) {
		var m message
		return m, r.Scan(&m.id, &m.to, &m.body)
	})
	if err != nil {
		return 0, fmt.Errorf("read older servers' mail: %w", err)
	}
	n := 0
	for _, m := range older {
		body := m.body // an older server never changes a body: this is the one taken over
		if s.cfg.Seal != nil && body != "" && !domain.IsSealed(body) {
			body = s.cfg.Seal.Seal(body, m.to)
		}
		// The row's attempts stay as they are (one more would take a waiting row's last
		// try): an older sender holding a claim on it can still record it sent, while its
		// failure or give-back, which would make it due at once for older claims, sealed,
		// is refused by 0047's check (next_attempt_at stays 'infinity').
		tag, err := s.pool.Exec(ctx, `UPDATE mail_outbox SET body = $2, due_at = next_attempt_at, next_attempt_at = 'infinity'
			WHERE id = $1 AND due_at IS NULL AND sent_at IS NULL`, m.id, body)
		if err != nil {
			return n, fmt.Errorf("take over mail %d: %w", m.id, err)
		}
		n += int(tag.RowsAffected())
	}
	return n, nil
}

// clearSent clears the bodies of the messages an older chessd's sender sent: it keeps
// them (this one clears a body as it records the message sent).
func (s *Sender) clearSent(ctx context.Context) error {
	if _, err := s.pool.Exec(ctx, `UPDATE mail_outbox SET body = '' WHERE sent_at IS NOT NULL AND body <> ''`); err != nil {
		return fmt.Errorf("clear sent mail: %w", err)
	}
	return nil
}

// open answers the message's body: sealed, opened for its recipient; in the clear (an
// older server's, taken over without a Seal), as it is.
func (s *Sender) open(m message) (string, error) {
	if !domain.IsSealed(m.body) {
		return m.body, nil
	}
	body, err := s.cfg.Seal.Open(m.body, m.to)
	if err != nil {
		return "", fmt.Errorf("the message's body: %w", err)
	}
	return body, nil
}

// send delivers one message and says how.
func (s *Sender) send(m message) (string, error) {
	body, err := s.open(m)
	if err != nil {
		return "", err
	}
	m.body = body
	if s.cfg.SMTPAddr == "" {
		s.logger.Info("mail (no SMTP server configured)", "to", m.to, "subject", m.subject, "body", m.body)
		return "log", nil
	}
	if err := s.sendSMTP(m); err != nil {
		return "", fmt.Errorf("smtp %s: %w", s.cfg.SMTPAddr, err)
	}
	return "smtp", nil
}

// sendSMTP is smtp.SendMail with a deadline: a server that stops answering fails this
// message (retried later) instead of holding the sender for ever. One deadline covers
// connecting and the conversation, so sending takes at most Timeout, within the claim.
func (s *Sender) sendSMTP(m message) error {
	host, _, err := net.SplitHostPort(s.cfg.SMTPAddr) // [::1]:25 too
	if err != nil {
		return err
	}
	deadline := time.Now().Add(s.cfg.Timeout)
	conn, err := (&net.Dialer{Deadline: deadline}).Dial("tcp", s.cfg.SMTPAddr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(deadline); err != nil {
		return err
	}
	c, err := smtp.NewClient(conn, host)
	if err != nil {
		return err
	}
	defer c.Close()
	if ok, _ := c.Extension("STARTTLS"); ok && s.cfg.TLS != TLSOff {
		//nolint:gosec // skip-verify is the operator's explicit choice (CHESSD_SMTP_TLS)
		cfg := &tls.Config{ServerName: host, RootCAs: s.roots, InsecureSkipVerify: s.cfg.TLS == TLSSkipVerify}
		if err := c.StartTLS(cfg); err != nil {
			return fmt.Errorf("starttls (CHESSD_SMTP_TLS=%s): %w", s.cfg.TLS, err)
		}
	}
	if s.cfg.Username != "" {
		if err := c.Auth(smtp.PlainAuth("", s.cfg.Username, s.cfg.Password, host)); err != nil {
			return fmt.Errorf("auth: %w", err)
		}
	}
	if err := c.Mail(s.cfg.From); err != nil {
		return err
	}
	if err := c.Rcpt(m.to); err != nil {
		return err
	}
	w, err := c.Data()
	if err != nil {
		return err
	}
	if _, err := w.Write(s.compose(m)); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	return c.Quit()
}

// compose writes the message in RFC 5322 form. Addresses and subjects come from our
// own commands (addresses validated at signup: no CR or LF can reach a header).
func (s *Sender) compose(m message) []byte {
	id := make([]byte, 12)
	rand.Read(id) //nolint:errcheck // crypto/rand does not fail
	_, domainPart, _ := strings.Cut(s.cfg.From, "@")
	var b strings.Builder
	fmt.Fprintf(&b, "From: %s\r\nTo: %s\r\nSubject: %s\r\nDate: %s\r\nMessage-ID: <%s@%s>\r\n",
		s.cfg.From, m.to, m.subject, time.Now().UTC().Format(time.RFC1123Z), hex.EncodeToString(id), domainPart)
	b.WriteString("MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n")
	b.WriteString(strings.ReplaceAll(strings.ReplaceAll(m.body, "\r\n", "\n"), "\n", "\r\n"))
	return []byte(b.String())
}
