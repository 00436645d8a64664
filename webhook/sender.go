package webhook

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/eventstore"
)

// Config tunes a Sender.
type Config struct {
	Timeout     time.Duration // one try; default 10 s
	RetryBase   time.Duration // the wait after a first failure, doubled after each; default 5 s (at most an hour)
	MaxAttempts int           // then the delivery is failed; default 8
	Poll        time.Duration // look for due deliveries at least this often; default 5 s
	// AllowPrivate lets deliveries reach loopback and private addresses (tests and
	// development); production refuses them.
	AllowPrivate bool
	// Secrets opens the endpoints' sealed signing secrets (NewSecrets of the key pepper).
	Secrets *Secrets
}

// Sender delivers queued messages. Any number of servers may run one: each delivery
// is claimed by one (SKIP LOCKED) and tried at least once per claim.
type Sender struct {
	cfg    Config
	pool   *pgxpool.Pool
	logger *slog.Logger
	client *http.Client
	now    func() time.Time
}

// NewSender builds a Sender.
func NewSender(cfg Config, pool *pgxpool.Pool, logger *slog.Logger) *Sender {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = 5 * time.Second
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 8
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 5 * time.Second
	}
	dialer := &net.Dialer{Timeout: cfg.Timeout}
	if !cfg.AllowPrivate {
		dialer.Control = publicOnly // checked on the address actually dialled: DNS cannot smuggle one in
	}
	client := &http.Client{
		Timeout:   cfg.Timeout,
		Transport: &http.Transport{DialContext: dialer.DialContext, Proxy: nil, MaxIdleConnsPerHost: 2},
		// a redirect would send the signed body somewhere the customer did not register
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return &Sender{cfg: cfg, pool: pool, logger: logger.With("component", "webhook"), client: client, now: time.Now}
}

// recordTimeout bounds recording how a try went, which goes on after ctx ends: a
// delivery that arrived and was not recorded would be sent again.
const recordTimeout = 10 * time.Second

// Run delivers due messages until ctx ends, woken by each queued delivery's commit. The
// tries under way when ctx ends are finished (within Timeout) and recorded; no other
// is started.
func (s *Sender) Run(ctx context.Context) {
	eventstore.Drain(ctx, s.pool, s.logger, Topic, s.cfg.Poll, s.SendDue)
}

type due struct {
	id, endpointID, url, secret, eventType string
	payload                                []byte
	attempts                               int
}

// SendDue claims up to ten due deliveries and tries them at once; it returns how many.
//
// The claim takes endpoints in turn (each endpoint's oldest due delivery first, then
// each one's second, ...), so one endpoint's backlog, a slow one's above all, does not
// hold back other endpoints' deliveries: they were taken oldest first, ten at a time,
// and tried one after another, each up to Timeout. Tried at once, a batch takes one
// Timeout at most, well within the claim (twice Timeout): tried in turn, ten slow ones
// outlasted it, and another server claimed and sent the last of them again.
func (s *Sender) SendDue(ctx context.Context) int {
	if ctx.Err() != nil {
		return 0
	}
	// The claim moves the next try past the timeout, so a sender that dies mid-try
	// leaves the delivery to be tried again then, by any server. A delivery another
	// sender claims meanwhile is skipped: the claim's conditions are checked again on
	// the row it committed.
	rows, err := s.pool.Query(ctx, `UPDATE webhook_deliveries d SET attempts = d.attempts + 1,
			next_attempt_at = now() + $1::interval
		FROM (SELECT delivery_id FROM (
		        SELECT delivery_id, next_attempt_at,
		               row_number() OVER (PARTITION BY endpoint_id ORDER BY next_attempt_at) AS turn
		          FROM webhook_deliveries
		         WHERE delivered_at IS NULL AND failed_at IS NULL AND next_attempt_at <= now()) t
		      ORDER BY turn, next_attempt_at LIMIT 10) c, webhook_endpoints e
		WHERE d.delivery_id = c.delivery_id AND e.endpoint_id = d.endpoint_id
		  AND d.delivered_at IS NULL AND d.failed_at IS NULL AND d.next_attempt_at <= now()
		RETURNING d.delivery_id, e.endpoint_id, e.url, e.secret, d.event_type, d.payload::text, d.attempts`, (2 * s.cfg.Timeout).String())
	if err != nil {
		if ctx.Err() == nil {
			s.logger.Warn("claim webhook deliveries", "err", err)
		}
		return 0
	}
	claimed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (due, error) {
		var d due
		var payload string
		err := r.Scan(&d.id, &d.endpointID, &d.url, &d.secret, &d.eventType, &payload, &d.attempts)
		d.payload = []byte(payload)
		return d, err
	})
	if err != nil {
		s.logger.Warn("claim webhook deliveries", "err", err)
		return 0
	}
	// Claimed, each is tried to its end whatever ctx does meanwhile (Timeout bounds it):
	// a try cut off mid-request may or may not have arrived, and would be sent again.
	tries := context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	for _, d := range claimed {
		wg.Go(func() { s.try(tries, d) })
	}
	wg.Wait()
	return len(claimed)
}

// try sends one delivery and records how it went.
func (s *Sender) try(ctx context.Context, d due) {
	status, err := s.post(ctx, d)
	rctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	var tag pgconn.CommandTag
	switch {
	case err == nil && status/100 == 2:
		// recorded whoever holds the claim now: it arrived, so no server sends it again
		tag, err = s.pool.Exec(rctx, `UPDATE webhook_deliveries SET delivered_at = now(), last_status = $2, last_error = NULL
			WHERE delivery_id = $1 AND delivered_at IS NULL`, d.id, status)
	default:
		msg := fmt.Sprintf("HTTP %d", status)
		if err != nil {
			msg = err.Error()
		}
		var statusArg *int
		if status != 0 {
			statusArg = &status
		}
		wait := min(s.cfg.RetryBase<<min(d.attempts-1, 20), time.Hour)
		// only while the claim is still ours (attempts is raised by each claim): a claim
		// that lapsed may be another server's now, which this would cut short
		tag, err = s.pool.Exec(rctx, `UPDATE webhook_deliveries SET last_status = $2, last_error = $3,
				next_attempt_at = now() + $4::interval, failed_at = CASE WHEN attempts >= $5 THEN now() END
			WHERE delivery_id = $1 AND attempts = $6 AND delivered_at IS NULL`, d.id, statusArg, msg, wait.String(), s.cfg.MaxAttempts, d.attempts)
	}
	switch {
	case err != nil:
		s.logger.Warn("webhook try not recorded; it will be tried again", "delivery_id", d.id, "err", err)
	case tag.RowsAffected() == 0:
		s.logger.Warn("webhook try not recorded: another server holds the delivery now", "delivery_id", d.id)
	}
}

// post sends the delivery's envelope, signed, and returns the answer's status.
func (s *Sender) post(ctx context.Context, d due) (int, error) {
	secret, err := s.cfg.Secrets.open(d.secret, d.endpointID)
	if err != nil {
		return 0, err // recorded on the delivery, tried again: a server with the right pepper may send it
	}
	body := []byte(fmt.Sprintf(`{"id":%q,"type":%q,"attempt":%d,"data":%s}`, d.id, d.eventType, d.attempts, d.payload))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "chessd-webhooks/1")
	req.Header.Set("Chessd-Delivery", d.id)
	req.Header.Set("Chessd-Signature", Sign(secret, s.now(), body))
	res, err := s.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10)) //nolint:errcheck // drained for the connection's reuse
	return res.StatusCode, nil
}
