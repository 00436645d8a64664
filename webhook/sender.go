package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/eventstore"
	"chessd/postgres"
)

// Config tunes a Sender.
type Config struct {
	Timeout     time.Duration // one try; default DefaultTimeout
	RetryBase   time.Duration // the wait after a first failure, doubled after each; default 5 s (at most an hour)
	MaxAttempts int           // then the delivery is failed; default 8
	Poll        time.Duration // look for due deliveries at least this often; default 5 s
	// Slots is how many tries a server runs at once; default 10. Failing endpoints'
	// tries hold at most half of them (failingSlots); one account's endpoints' at most
	// three in ten (accountSlots), and that many across all servers too (claim).
	Slots int
	// AllowPrivate lets deliveries reach loopback and private addresses (tests and
	// development); production refuses them.
	AllowPrivate bool
	// Secrets opens the endpoints' sealed signing secrets (NewSecrets of the key pepper).
	Secrets *Secrets
}

// DefaultTimeout is how long a try waits for its answer unless Config says otherwise.
const DefaultTimeout = 10 * time.Second

// Sender delivers queued messages. Any number of servers may run one: each delivery
// is claimed by one (SKIP LOCKED) and tried at least once per claim, an endpoint has
// one try under way and an account accountSlots, across all servers (claim). The
// slots, the failing endpoints' share of them and the accounts' turns are each
// server's own.
type Sender struct {
	cfg    Config
	pool   *pgxpool.Pool
	logger *slog.Logger
	client *http.Client
	now    func() time.Time

	mu       sync.Mutex
	busy     map[string]bool // endpoints with a try under way here
	failing  int             // tries under way to failing endpoints
	accounts map[string]int  // tries under way here, by the endpoints' account
	freed    chan struct{}   // a try ended: its slot and its endpoint are free

	// turned are the accounts claimed for in this round (Run's alone): the others
	// with a due delivery go first (claimNext).
	turned map[string]bool
}

// NewSender builds a Sender.
func NewSender(cfg Config, pool *pgxpool.Pool, logger *slog.Logger) *Sender {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
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
	if cfg.Slots <= 0 {
		cfg.Slots = 10
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
	return &Sender{cfg: cfg, pool: pool, logger: logger.With("component", "webhook"), client: client, now: time.Now,
		busy: map[string]bool{}, accounts: map[string]int{}, turned: map[string]bool{}, freed: make(chan struct{}, 1)}
}

// recordTimeout bounds recording how a try went, which goes on after ctx ends: a
// delivery that arrived and was not recorded would be sent again.
const recordTimeout = 10 * time.Second

// Run delivers due messages until ctx ends. Each of its Slots takes the next due
// delivery as soon as its try ends, so a slow try holds only its own slot (a batch
// tried at once waited for its slowest try, up to Timeout, before any other began).
// It looks again at each queued delivery's commit, each ended try, the next retry's
// time and at least every Poll. The tries under way when ctx ends are finished
// (within Timeout) and recorded; no other is started.
func (s *Sender) Run(ctx context.Context) {
	queued, unsubscribe := eventstore.Listen(ctx, s.pool, s.logger).Subscribe(Topic)
	defer unsubscribe()
	var tries sync.WaitGroup
	defer tries.Wait()
	for ctx.Err() == nil {
		s.fill(ctx, &tries)
		timer := time.NewTimer(s.untilDue(ctx))
		select {
		case <-ctx.Done():
		case <-queued:
		case <-s.freed:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// fill starts a try of each due delivery the free slots may take.
func (s *Sender) fill(ctx context.Context, tries *sync.WaitGroup) {
	// Claimed, each is tried to its end whatever ctx does meanwhile (Timeout bounds it):
	// a try cut off mid-request may or may not have arrived, and would be sent again.
	tryCtx := context.WithoutCancel(ctx)
	for ctx.Err() == nil {
		d, ok := s.claimNext(ctx)
		if !ok {
			return
		}
		tries.Go(func() {
			defer s.release(d)
			s.try(tryCtx, d)
		})
	}
}

type due struct {
	id, endpointID, accountID, url, secret, eventType string
	payload                                           []byte
	attempts                                          int
	failing                                           bool // claimed for a failing endpoint: it holds one of failingSlots
}

// failingSlots is how many slots failing endpoints' tries may hold: the others stay
// for the endpoints that answer, however many endpoints are down.
func (s *Sender) failingSlots() int { return max(1, s.cfg.Slots/2) }

// accountSlots is how many slots one account's endpoints' tries may hold (3 of 10): an
// account whose endpoints answer slowly, but within the timeout, so never failing,
// held every slot with its backlog (20 endpoints pinged 5 times a minute, 9 s each,
// is more than 10 slots can serve), and every other account's deliveries, budget
// alerts too, waited behind it for minutes. It caps the account's tries on all servers
// together (claim), as this server reckons it from its Slots.
func (s *Sender) accountSlots() int { return max(1, s.cfg.Slots*3/10) }

// claimNext claims the next due delivery a free slot may take, and marks its slot,
// endpoint and account busy; false when there is none (or no free slot). Accounts take
// turns: a round gives each account with a due delivery one claim, its delivery due
// longest first, and the accounts not yet claimed for in the round go before those
// that were. So a delivery waits for free slots to be claimed for each other account
// once at most, not for the whole backlog queued before it (by the oldest due alone,
// other accounts' backlog went first, and a few accounts with 3 slots each could hold
// every slot). A round ends when no account yet to take its turn has a due delivery
// that may be claimed. Only Run claims, so the busy endpoints and accounts it reads
// cannot gain one before it marks its own.
func (s *Sender) claimNext(ctx context.Context) (due, bool) {
	s.mu.Lock()
	if len(s.busy) >= s.cfg.Slots {
		s.mu.Unlock()
		return due{}, false
	}
	busy := make([]string, 0, len(s.busy))
	for id := range s.busy {
		busy = append(busy, id)
	}
	full := []string{} // accounts holding all the slots one may (not nil: a NULL array would skip every account)
	for a, n := range s.accounts {
		if n >= s.accountSlots() {
			full = append(full, a)
		}
	}
	failingOK := s.failing < s.failingSlots()
	s.mu.Unlock()

	skip := append([]string{}, full...)
	for a := range s.turned {
		skip = append(skip, a)
	}
	d, ok, err := s.claim(ctx, busy, skip, failingOK)
	if err == nil && !ok && len(s.turned) > 0 { // none left to take its turn: a new round
		clear(s.turned)
		d, ok, err = s.claim(ctx, busy, full, failingOK)
	}
	if err != nil {
		if ctx.Err() == nil {
			s.logger.Warn("claim a webhook delivery", "err", err)
		}
		return due{}, false
	}
	if !ok {
		return due{}, false
	}
	s.turned[d.accountID] = true
	s.mu.Lock()
	s.busy[d.endpointID] = true
	s.accounts[d.accountID]++
	if d.failing {
		s.failing++
	}
	s.mu.Unlock()
	return d, true
}

// release frees d's slot, endpoint and account's slot once its try is recorded, and
// wakes Run.
func (s *Sender) release(d due) {
	s.mu.Lock()
	delete(s.busy, d.endpointID)
	if s.accounts[d.accountID]--; s.accounts[d.accountID] <= 0 {
		delete(s.accounts, d.accountID)
	}
	if d.failing {
		s.failing--
	}
	s.mu.Unlock()
	select {
	case s.freed <- struct{}{}:
	default: // Run is woken already
	}
}

// claimRaces is how many times claim walks again after losing a race for an
// endpoint's or account's room to another server's claim (each walk sees the claims
// committed before it, so the next one skips what the winner took).
const claimRaces = 3

// claim takes the oldest due delivery of an endpoint not in busy (one try under way
// per endpoint here, so a backlog holds one slot), nor deleted (Delete ends its
// deliveries; an older server's did not), nor failing unless failingOK, nor of an
// account in skip. An endpoint is failing while it has a pending delivery whose last
// try failed or timed out. The accounts are skipped on the due index's walk, as the
// busy endpoints are: the claim stays one walk in next_attempt_at order, stopped by
// LIMIT 1 at the first delivery it may take.
//
// The claim moves the next try past the timeout, so a sender that dies mid-try leaves
// the delivery to be tried again then, by any server; attempts is raised by each claim,
// so a try whose claim lapsed records nothing over the new holder's. A delivery another
// server is claiming is skipped (SKIP LOCKED), and one it claimed meanwhile too: the
// conditions are checked again on the row it committed.
//
// The caps of one try per endpoint and accountSlots per account hold across servers:
// the claim sets claimed_until to the same lease (migration 0053) and the try's record
// clears it, and the walk skips the endpoints with a try under way on any server and
// the accounts with accountSlots of them, counted while the lease runs (a server that
// died mid-try holds the endpoint until its lease lapses, no longer). busy and skip,
// this server's own, still spare the walk those it knows of. Servers older than
// migration 0053 neither set nor read claimed_until: their tries are capped per server
// only, as they were, and not seen by the others' claims.
func (s *Sender) claim(ctx context.Context, busy, skip []string, failingOK bool) (due, bool, error) {
	for range claimRaces {
		d, ok, err := s.claimOnce(ctx, busy, skip, failingOK)
		if !errors.Is(err, errClaimRaced) {
			return d, ok, err
		}
	}
	return due{}, false, nil // taken by other servers meanwhile: Run looks again by Poll
}

// errClaimRaced is claimOnce's candidate losing its endpoint's or account's room to a
// claim another server committed as it walked.
var errClaimRaced = errors.New("another server's claim took the room")

// claimOnce is one walk of claim, in a transaction of three statements. The walk picks
// the delivery and locks its row (SKIP LOCKED), its view of the tries under way as old
// as its snapshot. Two servers walking at once could each pick a delivery of one
// endpoint (or one more of an account with two under way), neither seeing the other's
// claim: SKIP LOCKED keeps them off one row, not off one endpoint, and a row lock on
// the endpoint would not do either, as a claim committed after the walk's snapshot
// would be missed by the walk that then got the lock (it rechecks only rows it locks
// that were updated). So the claim then takes a lock on the account's claims
// (pg_advisory_xact_lock, until the commit), and the UPDATE, a statement of its own and
// so with a snapshot taken after the lock, checks the caps again on every claim
// committed before it: claims of one account follow one another, and one whose room
// was taken meanwhile claims nothing (errClaimRaced). The lock is held for three short
// statements and its holder waits for nothing else (it already holds its delivery's
// row), so claims cannot deadlock on it; other servers' claims for other accounts do
// not wait at all.
func (s *Sender) claimOnce(ctx context.Context, busy, skip []string, failingOK bool) (due, bool, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return due{}, false, fmt.Errorf("claim: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed when a delivery is claimed
	var d due
	err = tx.QueryRow(ctx, `WITH failing AS (
			SELECT DISTINCT endpoint_id FROM webhook_deliveries
			 WHERE delivered_at IS NULL AND failed_at IS NULL AND last_error IS NOT NULL),
		under_way AS (
			SELECT endpoint_id, account_id FROM webhook_deliveries WHERE claimed_until > now())
		SELECT d.delivery_id, d.account_id, d.endpoint_id IN (SELECT endpoint_id FROM failing)
		  FROM webhook_deliveries d
		 WHERE d.delivered_at IS NULL AND d.failed_at IS NULL AND d.next_attempt_at <= now()
		   AND d.endpoint_id <> ALL ($1::text[])
		   AND d.account_id <> ALL ($3::text[])
		   AND EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.endpoint_id = d.endpoint_id AND e.deleted_at IS NULL)
		   AND ($2 OR d.endpoint_id NOT IN (SELECT endpoint_id FROM failing))
		   AND d.endpoint_id NOT IN (SELECT endpoint_id FROM under_way)
		   AND d.account_id NOT IN (SELECT account_id FROM under_way GROUP BY account_id HAVING count(*) >= $4)
		 ORDER BY d.next_attempt_at LIMIT 1
		   FOR UPDATE OF d SKIP LOCKED`,
		busy, failingOK, skip, s.accountSlots()).Scan(&d.id, &d.accountID, &d.failing)
	if errors.Is(err, pgx.ErrNoRows) {
		return due{}, false, nil
	}
	if err != nil {
		return due{}, false, fmt.Errorf("claim: %w", err)
	}
	if err := postgres.LockXact(ctx, tx, "webhook-claims-of-"+d.accountID, false); err != nil {
		return due{}, false, fmt.Errorf("claim: %w", err)
	}
	var payload string
	err = tx.QueryRow(ctx, `UPDATE webhook_deliveries d SET attempts = d.attempts + 1,
			next_attempt_at = now() + $2::interval, claimed_until = now() + $2::interval
		  FROM webhook_endpoints e
		 WHERE d.delivery_id = $1 AND e.endpoint_id = d.endpoint_id
		   AND NOT EXISTS (SELECT 1 FROM webhook_deliveries f
			WHERE f.claimed_until > now() AND f.endpoint_id = d.endpoint_id AND f.delivery_id <> d.delivery_id)
		   AND (SELECT count(*) FROM webhook_deliveries f
			WHERE f.claimed_until > now() AND f.account_id = d.account_id AND f.delivery_id <> d.delivery_id) < $3
		RETURNING e.endpoint_id, e.url, e.secret, d.event_type, d.payload::text, d.attempts`,
		d.id, (2*s.cfg.Timeout).String(), s.accountSlots()).
		Scan(&d.endpointID, &d.url, &d.secret, &d.eventType, &payload, &d.attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		return due{}, false, errClaimRaced
	}
	if err != nil {
		return due{}, false, fmt.Errorf("claim: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return due{}, false, fmt.Errorf("claim: %w", err)
	}
	d.payload = []byte(payload)
	return d, true, nil
}

// untilDue is how long Run may wait before looking again: until the next pending
// delivery falls due (a retry, or a claim that lapses), at most Poll. Due deliveries
// it could not take wait for a slot or their endpoint to be freed, which wakes Run;
// those whose endpoint or account another server's tries hold wait for Poll at most.
func (s *Sender) untilDue(ctx context.Context) time.Duration {
	var ms *int64
	err := s.pool.QueryRow(ctx, `SELECT ceil(extract(epoch FROM min(next_attempt_at) - now()) * 1000)::bigint
		FROM webhook_deliveries WHERE delivered_at IS NULL AND failed_at IS NULL AND next_attempt_at > now()`).Scan(&ms)
	if err != nil {
		if ctx.Err() == nil {
			s.logger.Warn("next webhook delivery due", "err", err)
		}
		return s.cfg.Poll
	}
	if ms == nil {
		return s.cfg.Poll
	}
	return min(time.Duration(*ms)*time.Millisecond, s.cfg.Poll)
}

// try sends one delivery and records how it went.
func (s *Sender) try(ctx context.Context, d due) {
	status, err := s.post(ctx, d)
	if err != nil { // last_error says what failed, not this (failure)
		s.logger.Info("webhook try failed", "delivery_id", d.id, "endpoint_id", d.endpointID, "attempt", d.attempts, "err", err)
	}
	rctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	var tag pgconn.CommandTag
	switch {
	case err == nil && status/100 == 2:
		// recorded whoever holds the claim now: it arrived, so no server sends it again
		// (even ended by Delete meanwhile: it arrived)
		// (claimed_until is cleared only while the claim is ours, as below)
		tag, err = s.pool.Exec(rctx, `UPDATE webhook_deliveries SET delivered_at = now(), failed_at = NULL, last_status = $2, last_error = NULL,
				claimed_until = CASE WHEN attempts = $3 THEN NULL ELSE claimed_until END
			WHERE delivery_id = $1 AND delivered_at IS NULL`, d.id, status, d.attempts)
	default:
		msg := failure(status, err, s.cfg.Timeout)
		var statusArg *int
		if status != 0 {
			statusArg = &status
		}
		wait := min(s.cfg.RetryBase<<min(d.attempts-1, 20), time.Hour)
		// only while the claim is still ours (attempts is raised by each claim): a claim
		// that lapsed may be another server's now, which this would cut short; and not
		// over a Delete that ended the delivery meanwhile, which would make it pending again
		tag, err = s.pool.Exec(rctx, `UPDATE webhook_deliveries SET last_status = $2, last_error = $3,
				next_attempt_at = now() + $4::interval, failed_at = CASE WHEN attempts >= $5 THEN now() END, claimed_until = NULL
			WHERE delivery_id = $1 AND attempts = $6 AND delivered_at IS NULL AND failed_at IS NULL`, d.id, statusArg, msg, wait.String(), s.cfg.MaxAttempts, d.attempts)
	}
	switch {
	case err != nil:
		s.logger.Warn("webhook try not recorded; it will be tried again", "delivery_id", d.id, "err", err)
	case tag.RowsAffected() == 0:
		s.logger.Warn("webhook try not recorded: another server holds the delivery now, or its endpoint was deleted", "delivery_id", d.id)
		// The try has ended all the same: while the claim is ours (the delivery was ended
		// meanwhile, or delivered by a lapsed claim's try), it no longer holds its endpoint.
		if _, err := s.pool.Exec(rctx, `UPDATE webhook_deliveries SET claimed_until = NULL
			WHERE delivery_id = $1 AND attempts = $2 AND claimed_until IS NOT NULL`, d.id, d.attempts); err != nil {
			s.logger.Warn("webhook try's claim not cleared; it lapses with its lease", "delivery_id", d.id, "err", err)
		}
	}
}

// failure is a failed try's last_error, which the endpoint's account reads: what went
// wrong, in words of our own, never err's text. The net package's errors name our side
// of the exchange (a DNS error names the resolver it asked, a connection's error its
// local address and port) and what a host resolved to (errNotPublic); try logs err
// whole for us. timeout is a try's limit, named when it ran out.
func failure(status int, err error, timeout time.Duration) string {
	if err == nil {
		return fmt.Sprintf("HTTP %d", status)
	}
	var (
		dnsErr      *net.DNSError
		opErr       *net.OpError
		unknownCA   x509.UnknownAuthorityError
		wrongHost   x509.HostnameError
		invalidCert x509.CertificateInvalidError
		verifyErr   *tls.CertificateVerificationError
		notTLS      tls.RecordHeaderError
		netErr      net.Error
	)
	switch {
	case errors.Is(err, errNotPublic):
		return NotPublicError
	case errors.Is(err, ErrSecretSealed):
		return "the delivery could not be signed on our side (no fault of the endpoint's); it is tried again while tries remain"
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		return "the endpoint's host name was not found (DNS: no such host)"
	case errors.As(err, &dnsErr) && dnsErr.IsTimeout:
		return "looking up the endpoint's host name timed out (DNS)"
	case errors.As(err, &dnsErr):
		return "looking up the endpoint's host name failed (DNS)"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused: nothing listens at the endpoint's address and port"
	case errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTUNREACH):
		return "the endpoint's address is unreachable"
	case errors.Is(err, syscall.ECONNRESET):
		return "the connection was reset by the endpoint before it answered"
	case errors.As(err, &unknownCA):
		return "TLS certificate error: the endpoint's certificate is signed by an unknown authority"
	case errors.As(err, &wrongHost):
		return "TLS certificate error: the endpoint's certificate is not valid for its host name"
	case errors.As(err, &invalidCert) && invalidCert.Reason == x509.Expired:
		return "TLS certificate error: the endpoint's certificate has expired or is not yet valid"
	case errors.As(err, &invalidCert), errors.As(err, &verifyErr):
		return "TLS certificate error: the endpoint's certificate is not valid"
	case errors.As(err, &notTLS), errors.Is(err, http.ErrSchemeMismatch):
		return "TLS handshake failed: the endpoint does not speak TLS (plain HTTP on an https URL?)"
	case errors.As(err, &opErr) && opErr.Op == "remote error":
		return "TLS handshake failed: the endpoint refused it (TLS alert)"
	case errors.As(err, &netErr) && netErr.Timeout(), errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("timed out: no answer within %s", timeout)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "the endpoint closed the connection without answering"
	default:
		return "the request failed before an answer came (connection or protocol error)"
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
