// Package mail sends what the commands queue in mail_outbox: through an SMTP server
// when one is configured, to the log otherwise (a development server's mail shows in
// its output). Any number of servers may run a Sender on one database: each message is
// claimed by one (SKIP LOCKED) and sent at least once; a failed send is tried again
// with a growing wait, and each row keeps how it went.
package mail

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/smtp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/commands"
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
	Poll               time.Duration // look for due messages at least this often; default 5 s
	MaxAttempts        int           // then the message is left unsent, its error kept; default 10
	// Timeout bounds one message's whole SMTP conversation; default 1 min.
	Timeout time.Duration
	// RetryBase is the wait after a first failure, doubled after each next one (at most
	// an hour); default 2 s.
	RetryBase time.Duration
}

// Sender sends the outbox.
type Sender struct {
	cfg    Config
	pool   *pgxpool.Pool
	logger *slog.Logger
}

// NewSender builds a Sender.
func NewSender(cfg Config, pool *pgxpool.Pool, logger *slog.Logger) *Sender {
	if cfg.From == "" {
		cfg.From = "chessd@localhost"
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 5 * time.Second
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 10
	}
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = 2 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Minute
	}
	return &Sender{cfg: cfg, pool: pool, logger: logger.With("component", "mail")}
}

// message is one claimed row.
type message struct {
	id                int64
	to, subject, body string
	attempts          int
}

// Run sends due messages until ctx ends, woken by each queued message's commit.
func (s *Sender) Run(ctx context.Context) {
	eventstore.Drain(ctx, s.pool, s.logger, commands.TopicMail, s.cfg.Poll, s.SendDue)
}

// SendDue claims up to ten due messages and sends them; it returns how many it tried.
func (s *Sender) SendDue(ctx context.Context) int {
	// The claim pushes the next attempt a minute away, so a sender that dies mid-send
	// leaves the message to be tried again then, by any server.
	rows, err := s.pool.Query(ctx, `UPDATE mail_outbox o SET attempts = o.attempts + 1, next_attempt_at = now() + interval '1 minute'
		FROM (SELECT id FROM mail_outbox WHERE sent_at IS NULL AND next_attempt_at <= now() AND attempts < $1
		      ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED) due
		WHERE o.id = due.id RETURNING o.id, o.to_email, o.subject, o.body, o.attempts`, s.cfg.MaxAttempts)
	if err != nil {
		if ctx.Err() == nil {
			s.logger.Warn("claim mail", "err", err)
		}
		return 0
	}
	msgs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (message, error) {
		var m message
		err := r.Scan(&m.id, &m.to, &m.subject, &m.body, &m.attempts)
		return m, err
	})
	if err != nil {
		s.logger.Warn("claim mail", "err", err)
		return 0
	}
	for _, m := range msgs {
		via, err := s.send(m)
		if err != nil {
			wait := min(s.cfg.RetryBase<<min(m.attempts-1, 20), time.Hour)
			s.logger.Warn("mail not sent; will retry", "id", m.id, "attempt", m.attempts, "retry_in", wait, "err", err)
			_, err = s.pool.Exec(ctx, `UPDATE mail_outbox SET last_error = $2, next_attempt_at = now() + $3::interval WHERE id = $1`,
				m.id, err.Error(), wait.String())
		} else {
			_, err = s.pool.Exec(ctx, `UPDATE mail_outbox SET sent_at = now(), sent_via = $2, last_error = NULL WHERE id = $1`, m.id, via)
		}
		if err != nil && ctx.Err() == nil {
			s.logger.Warn("record mail outcome", "id", m.id, "err", err)
		}
	}
	return len(msgs)
}

// send delivers one message and says how.
func (s *Sender) send(m message) (string, error) {
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
// message (retried later) instead of holding the sender for ever.
func (s *Sender) sendSMTP(m message) error {
	host, _, _ := strings.Cut(s.cfg.SMTPAddr, ":")
	conn, err := net.DialTimeout("tcp", s.cfg.SMTPAddr, s.cfg.Timeout)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(s.cfg.Timeout)); err != nil {
		return err
	}
	c, err := smtp.NewClient(conn, host)
	if err != nil {
		return err
	}
	defer c.Close()
	if ok, _ := c.Extension("STARTTLS"); ok {
		if err := c.StartTLS(&tls.Config{ServerName: host}); err != nil {
			return err
		}
	}
	if s.cfg.Username != "" {
		if err := c.Auth(smtp.PlainAuth("", s.cfg.Username, s.cfg.Password, host)); err != nil {
			return err
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
