// Package webhook delivers an account's notifications to the HTTPS endpoints it
// registered: each message is signed (HMAC-SHA256 over the timestamp and the body, in
// the Chessd-Signature header), tried until the endpoint answers 2xx, with a doubling
// wait between tries, and every try is recorded where the customer can read it, until
// Expire deletes the delivery once it has been finished for the retention age, and a
// deleted endpoint once it has been deleted that long and its deliveries are gone.
package webhook

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/postgres"
)

// Topic is announced when a delivery is queued: the sender wakes at the commit.
const Topic = "webhook_deliveries"

// MaxEndpoints is how many endpoints an account may have in one env.
const MaxEndpoints = 10

// MaxCreations is how many endpoints an account may register in one env an hour, those
// deleted since counted. Without it an account's keys (each with its own rate) could
// register and delete endpoints in a loop, thousands a minute, each kept with its URL
// for the 30 days before Expire deletes it.
const MaxCreations = 20

// CreationsFull refuses an endpoint past MaxCreations an hour (429, Retry-After).
type CreationsFull struct{ wait time.Duration }

func (e *CreationsFull) Error() string { return "too many webhook endpoints registered" }
func (e *CreationsFull) Unwrap() error {
	return domain.Errorf(domain.CodeRateLimited, "an account registers at most %d webhook endpoints an hour per env, those deleted since counted; retry after the Retry-After delay", MaxCreations)
}
func (e *CreationsFull) RetryAfter() time.Duration { return e.wait }

// Endpoint is a registered endpoint.
type Endpoint struct {
	ID, AccountID, Env, URL string
	Secret                  string // shown once, at creation
	CreatedAt               time.Time
}

func newID(prefix string) string {
	b := make([]byte, 12)
	rand.Read(b) //nolint:errcheck // crypto/rand does not fail
	return prefix + hex.EncodeToString(b)
}

// CheckURL refuses what is not an absolute https URL (http is allowed only when
// insecure, for tests and development), written as RFC 3986 has it: url.Parse takes
// spaces, quotes and angle brackets as they come, and the URL is shown back as given.
// Nor may it name a host no delivery could reach, always: a port outside 1 to 65535,
// or a host that reads as an IP address without being one netip reads (numericHost).
// Unless insecure (which lets the sender reach them), nor may its host be an address
// the sender would refuse (publicOnly), localhost or a name under it (RFC 6761: the
// loopback), or a single-label name, which only a resolver's search list completes,
// inside our network.
func CheckURL(raw string, insecure bool) error {
	u, err := url.Parse(raw)
	if err != nil || u.Hostname() == "" || u.User != nil || u.Fragment != "" || len(raw) > 2000 || !uriText(raw) {
		return domain.Invalid("url", "must be an absolute URL (RFC 3986: other characters percent-encoded) without credentials or fragment, up to 2000 bytes")
	}
	if u.Scheme != "https" && !(insecure && u.Scheme == "http") {
		return domain.Invalid("url", "must be https")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return domain.Invalid("url", "must have a port from 1 to 65535, or none (443 for https)")
		}
	}
	host := u.Hostname()
	ip, err := netip.ParseAddr(host)
	if err != nil && numericHost(host) {
		return domain.Invalid("url", "must name its host by a DNS name, an IPv4 address as four decimal numbers (1.2.3.4) or an IPv6 address in brackets: "+
			"a numeric host in any other form (2130706433, 0x7f000001, 127.1, 0177.0.0.1) is an IP address to some clients and a name to others")
	}
	if insecure {
		return nil
	}
	// An address written in the URL is refused now, by the sender's own rule, rather
	// than at every delivery; a name is checked when sending, on the address it
	// resolves to then.
	if err == nil {
		if !isPublic(ip) {
			return domain.Invalid("url", "must not be a loopback, private or other non-public address: deliveries go only to public addresses")
		}
		return nil
	}
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return domain.Invalid("url", "must not be localhost or a name under it: it is the loopback address, and deliveries go only to public addresses")
	}
	if !strings.Contains(name, ".") {
		return domain.Invalid("url", "must have a fully qualified host name (such as example.com): a single-label name is completed, if at all, only inside the service's own network, and deliveries go only to public addresses")
	}
	return nil
}

// numericHost says whether host ends in a number, as the WHATWG URL standard reads
// one: its last label (past one trailing dot) all decimal digits, or 0x followed by
// hex digits. Browsers and curl then read the whole host as an IPv4 address, in
// decimal, octal or hex, and with fewer than four parts (127.1, 2130706433); Go's
// resolver does not, and takes it for a name. Such a host that is not a dotted-quad
// address (netip's) means different things to different clients.
func numericHost(host string) bool {
	host = strings.TrimSuffix(host, ".")
	last := host[strings.LastIndexByte(host, '.')+1:]
	if hex, ok := strings.CutPrefix(strings.ToLower(last), "0x"); ok {
		return strings.Trim(hex, "0123456789abcdef") == ""
	}
	return last != "" && strings.Trim(last, "0123456789") == ""
}

// uriText says whether s holds only the characters a URI may (RFC 3986's unreserved
// and reserved ones, and '%' of its escapes; url.Parse checks the escapes).
func uriText(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-._~:/?#[]@!$&'()*+,;=%", c) >= 0) {
			return false
		}
	}
	return true
}

// Create registers url for accountID's env and returns it with its signing secret,
// which is stored sealed by secrets: 409 past MaxEndpoints, CreationsFull past
// MaxCreations in the last hour. The counts and the insert run under a lock of the
// account's endpoints: counted in one statement alone, concurrent creations each saw
// room and went past MaxEndpoints.
//
// allowed, when set, runs under that lock before anything is counted or written: what
// authorised the call may have ended since it was checked (a key recovery revoking
// every key and deleting every endpoint, DeleteAll, which takes the lock too).
func Create(ctx context.Context, pool *pgxpool.Pool, secrets *Secrets, accountID, env, rawURL string, insecure bool,
	allowed func(context.Context, eventstore.Querier) error) (*Endpoint, error) {
	if err := CheckURL(rawURL, insecure); err != nil {
		return nil, err
	}
	if secrets == nil {
		return nil, errors.New("webhook: no Secrets to seal the endpoint's secret with")
	}
	e := &Endpoint{ID: newID("whe_"), AccountID: accountID, Env: env, URL: rawURL, Secret: "whsec_" + newID("")}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := lockEndpoints(ctx, tx, accountID); err != nil {
			return err
		}
		if allowed != nil {
			if err := allowed(ctx, tx); err != nil {
				return err
			}
		}
		// Counted in a statement after the lock's (its snapshot sees the creations that
		// held the lock meanwhile), by the clock, not now(), as Ping does. The hour's
		// creations, deleted ones too, are found by migration 0051's index: the clock is
		// read once (a subquery), so the hour bounds the index's range, where read on
		// each row it filtered all 30 days of the account's endpoints. A refusal waits
		// until enough of them are an hour old to leave room for one more (more than
		// MaxCreations were made before the cap).
		var live, recent int
		var room, now time.Time
		if err := tx.QueryRow(ctx, `SELECT
				(SELECT count(*) FROM webhook_endpoints WHERE account_id = $1 AND env = $2 AND deleted_at IS NULL),
				count(*), coalesce((array_agg(created_at ORDER BY created_at))[greatest(count(*) - $3, 0) + 1], clock_timestamp()),
				clock_timestamp()
			FROM webhook_endpoints WHERE account_id = $1 AND env = $2 AND created_at > (SELECT clock_timestamp() - interval '1 hour')`,
			accountID, env, MaxCreations).Scan(&live, &recent, &room, &now); err != nil {
			return err
		}
		if live >= MaxEndpoints {
			return domain.Errorf(domain.CodeConflict, "an account has at most %d webhook endpoints per env", MaxEndpoints)
		}
		if recent >= MaxCreations {
			return &CreationsFull{wait: room.Add(time.Hour).Sub(now)}
		}
		return tx.QueryRow(ctx, `INSERT INTO webhook_endpoints (endpoint_id, account_id, env, url, secret)
			VALUES ($1, $2, $3, $4, $5) RETURNING created_at`,
			e.ID, accountID, env, rawURL, secrets.seal(e.Secret, e.ID)).Scan(&e.CreatedAt)
	})
	var refused *domain.Error // 409, or CreationsFull's 429
	if errors.As(err, &refused) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("webhook endpoint: %w", err)
	}
	return e, nil
}

// lockEndpoints takes the lock of accountID's endpoints until q's transaction ends:
// creations queue behind one another (the caps count what they see) and behind
// DeleteAll. Queueings hold it shared (shareEndpoints).
func lockEndpoints(ctx context.Context, q eventstore.Querier, accountID string) error {
	return postgres.LockXact(ctx, q, "webhooks-of-"+accountID, false)
}

// shareEndpoints takes lockEndpoints' lock shared until q's transaction ends, before
// any row of accountID's endpoints is locked (Enqueue, Ping): the queueings of one
// account go on together, and DeleteAll, which takes it exclusive before it takes any
// endpoint's row, waits for them, so the rows are never taken in two orders at once.
// Budget alerts queue crossing after crossing in one transaction, in key order, so an
// account's test endpoints could be share-locked before its live ones, while a key
// recovery's DeleteAll had the live rows and waited for the test ones: each waited
// for the other, and PostgreSQL aborted one (40P01). A transaction holding it shared
// waits for nothing DeleteAll or Create hold once they have it (they take it right
// after the keys' lock, which no queueing takes, and then only rows of the account's
// endpoints and deliveries); and it is taken again, not waited for, by the same
// transaction.
func shareEndpoints(ctx context.Context, q eventstore.Querier, accountID string) error {
	return postgres.LockXact(ctx, q, "webhooks-of-"+accountID, true)
}

// List returns accountID's endpoints in env, without their secrets.
func List(ctx context.Context, q eventstore.Querier, accountID, env string) ([]Endpoint, error) {
	rows, err := q.Query(ctx, `SELECT endpoint_id, account_id, env, url, created_at FROM webhook_endpoints
		WHERE account_id = $1 AND env = $2 AND deleted_at IS NULL ORDER BY created_at`, accountID, env)
	if err != nil {
		return nil, fmt.Errorf("webhook endpoints: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Endpoint, error) {
		var e Endpoint
		err := r.Scan(&e.ID, &e.AccountID, &e.Env, &e.URL, &e.CreatedAt)
		return e, err
	})
}

// DeletedError is the last_error of the deliveries a Delete ended.
const DeletedError = "endpoint deleted"

// Delete stops deliveries to an endpoint of accountID's env; 404 for anyone else's.
// Its pending deliveries fail (DeletedError) in the same transaction, so no server
// claims them again; a try under way still goes out, and records nothing over that
// unless it arrived. The deliveries are ended by a statement of their own, after the
// endpoint's row: a delivery queued as the endpoint was being deleted (Enqueue holds
// the endpoint's row meanwhile) has committed by then and is seen, where one
// statement's snapshot, taken before the wait for the row, missed it and left it
// pending for ever.
func Delete(ctx context.Context, pool *pgxpool.Pool, accountID, env, id string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE webhook_endpoints SET deleted_at = now()
			WHERE endpoint_id = $1 AND account_id = $2 AND env = $3 AND deleted_at IS NULL`, id, accountID, env)
		if err != nil {
			return fmt.Errorf("webhook endpoint: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return domain.Errorf(domain.CodeNotFound, "no webhook endpoint %q on this account", id)
		}
		if _, err := tx.Exec(ctx, `UPDATE webhook_deliveries SET failed_at = now(), last_error = $2
			WHERE endpoint_id = $1 AND delivered_at IS NULL AND failed_at IS NULL`, id, DeletedError); err != nil {
			return fmt.Errorf("webhook endpoint's deliveries: %w", err)
		}
		return nil
	})
}

// DeleteAll stops deliveries to every endpoint of accountID, in every env, inside the
// caller's transaction (a key recovery that takes the account: endpoints someone else
// registered would go on receiving its events), and answers their ids. Their pending
// deliveries fail as Delete's do, by a statement after the endpoints'. It holds the
// lock creations take: one under way, authorised before, ends first and is deleted
// with the others; one after finds its key revoked (Create's allowed). It takes the
// lock before any endpoint's row, and queueings hold it shared before theirs
// (shareEndpoints): one under way, budget alerts' too, ends first, and its deliveries
// are ended with the others.
func DeleteAll(ctx context.Context, q eventstore.Querier, accountID string) ([]string, error) {
	if err := lockEndpoints(ctx, q, accountID); err != nil {
		return nil, err
	}
	rows, err := q.Query(ctx, `UPDATE webhook_endpoints SET deleted_at = now()
		WHERE account_id = $1 AND deleted_at IS NULL RETURNING endpoint_id`, accountID)
	if err != nil {
		return nil, fmt.Errorf("webhook endpoints: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("webhook endpoints: %w", err)
	}
	slices.Sort(ids)
	if _, err := q.Exec(ctx, `UPDATE webhook_deliveries SET failed_at = now(), last_error = $2
		WHERE endpoint_id = ANY($1) AND delivered_at IS NULL AND failed_at IS NULL`, ids, DeletedError); err != nil {
		return nil, fmt.Errorf("webhook endpoints' deliveries: %w", err)
	}
	return ids, nil
}

// Enqueue queues eventType with data for every endpoint of accountID's env (or only
// endpointID when set), inside the caller's transaction when q is one, and returns
// the deliveries' ids. 404 when endpointID is not the account's. It holds the
// account's endpoints lock shared (shareEndpoints), then their rows.
func Enqueue(ctx context.Context, q eventstore.Querier, accountID, env, endpointID, eventType string, data any) ([]string, error) {
	body, err := json.Marshal(data)
	if err != nil {
		return nil, err
	}
	if err := shareEndpoints(ctx, q, accountID); err != nil {
		return nil, err
	}
	rows, err := q.Query(ctx, `INSERT INTO webhook_deliveries (delivery_id, endpoint_id, account_id, event_type, payload)
		SELECT 'whd_' || replace(gen_random_uuid()::text, '-', ''), endpoint_id, account_id, $4, $5::jsonb
		  FROM webhook_endpoints WHERE account_id = $1 AND env = $2 AND deleted_at IS NULL AND ($3 = '' OR endpoint_id = $3)
		   FOR SHARE -- a Delete waits for this transaction, then ends what it queued (Delete)
		RETURNING delivery_id`, accountID, env, endpointID, eventType, body)
	if err != nil {
		return nil, fmt.Errorf("queue webhook: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("queue webhook: %w", err)
	}
	if endpointID != "" && len(ids) == 0 {
		return nil, domain.Errorf(domain.CodeNotFound, "no webhook endpoint %q on this account", endpointID)
	}
	if err := eventstore.Notify(ctx, q, Topic); err != nil {
		return nil, err
	}
	return ids, nil
}

// MaxTestPings is how many test deliveries (POST /webhooks/{id}/test) one endpoint
// gets a minute. An endpoint's URL is the customer's word, not proven theirs: without
// a cap, an account's keys (each with its own rate) could have the service send
// thousands of requests a minute to any https address.
const MaxTestPings = 5

// PingsFull refuses a test delivery past MaxTestPings a minute, or while MaxTestPings
// are still to go (429, Retry-After): a slow endpoint's pings would pile up without end.
type PingsFull struct {
	wait    time.Duration
	pending bool // refused for the pings still to go
}

func (e *PingsFull) Error() string { return "too many test deliveries" }
func (e *PingsFull) Unwrap() error {
	if e.pending {
		return domain.Errorf(domain.CodeRateLimited, "an endpoint has at most %d test deliveries still to go; retry once one is delivered or has failed (GET /webhooks/{id}/deliveries)", MaxTestPings)
	}
	return domain.Errorf(domain.CodeRateLimited, "an endpoint gets at most %d test deliveries a minute; retry after the Retry-After delay", MaxTestPings)
}
func (e *PingsFull) RetryAfter() time.Duration { return e.wait }

// Ping queues a test delivery (a "ping" with data) to endpointID of accountID's env
// and returns its id: 404 when the endpoint is not the account's, PingsFull past
// MaxTestPings in the last minute or with MaxTestPings still to go. Pings of one endpoint take turns on its row, so
// concurrent ones cannot all find room.
func Ping(ctx context.Context, pool *pgxpool.Pool, accountID, env, endpointID string, data any) (string, error) {
	var id string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// Enqueue's lock before the endpoint's row, as Enqueue takes them (shareEndpoints):
		// taken after, a DeleteAll holding it and waiting for the row would wait for this.
		if err := shareEndpoints(ctx, tx, accountID); err != nil {
			return err
		}
		// The lock first, the count in a statement of its own: one statement's snapshot
		// predates the wait for the lock, so it would miss the pings queued meanwhile.
		err := tx.QueryRow(ctx, `SELECT 1 FROM webhook_endpoints
			WHERE endpoint_id = $1 AND account_id = $2 AND env = $3 AND deleted_at IS NULL
			FOR UPDATE`, endpointID, accountID, env).Scan(new(int))
		if errors.Is(err, pgx.ErrNoRows) {
			return domain.Errorf(domain.CodeNotFound, "no webhook endpoint %q on this account", endpointID)
		}
		if err != nil {
			return fmt.Errorf("webhook pings: %w", err)
		}
		// The clock, not now(): this transaction began before its wait for the lock, and
		// the pings queued meanwhile carry later times than its start (a Retry-After of
		// 61 s read the minute from there).
		var n int
		var oldest, now time.Time
		if err := tx.QueryRow(ctx, `SELECT count(*), coalesce(min(created_at), clock_timestamp()), clock_timestamp() FROM webhook_deliveries
			WHERE endpoint_id = $1 AND event_type = 'ping' AND created_at > clock_timestamp() - interval '1 minute'`,
			endpointID).Scan(&n, &oldest, &now); err != nil {
			return fmt.Errorf("webhook pings: %w", err)
		}
		if n >= MaxTestPings {
			return &PingsFull{wait: oldest.Add(time.Minute).Sub(now)}
		}
		// pending ones by migration 0052's index, up to the cap
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM webhook_deliveries
			WHERE endpoint_id = $1 AND event_type = 'ping' AND delivered_at IS NULL AND failed_at IS NULL LIMIT $2) p`,
			endpointID, MaxTestPings).Scan(&n); err != nil {
			return fmt.Errorf("webhook pings: %w", err)
		}
		if n >= MaxTestPings {
			return pendingFull(ctx, tx, endpointID)
		}
		ids, err := Enqueue(ctx, tx, accountID, env, endpointID, "ping", data)
		if err != nil {
			return err
		}
		id = ids[0]
		return nil
	})
	return id, err
}

// pendingFull is Ping's refusal for the pings still to go, with a Retry-After until the
// first of them will have had its next try, the earliest a slot can free (a ping
// leaves the count once delivered, or failed for good): a try's length from now for
// one due or under way (claimed_until; an older server's claim, which does not set it,
// reads as due at its lease's end, later than its try ends), from its retry's time for
// one waiting for it. It said a try's length whatever the pings waited for, so through
// a dead endpoint's backoff, minutes between tries, a client following it was refused
// every 10 s. A try ending in failure frees nothing: the next retry is later still.
func pendingFull(ctx context.Context, tx pgx.Tx, endpointID string) error {
	// the clock read once (materialized): read on each row, each row had a time of its own
	var next *time.Time
	var now time.Time
	if err := tx.QueryRow(ctx, `WITH c AS MATERIALIZED (SELECT clock_timestamp() AS t)
		SELECT (SELECT min(CASE WHEN d.claimed_until > c.t THEN c.t ELSE greatest(d.next_attempt_at, c.t) END)
			FROM webhook_deliveries d
			WHERE d.endpoint_id = $1 AND d.event_type = 'ping' AND d.delivered_at IS NULL AND d.failed_at IS NULL), c.t
		FROM c`, endpointID).Scan(&next, &now); err != nil {
		return fmt.Errorf("webhook pings: %w", err)
	}
	if next == nil { // one went since they were counted
		return &PingsFull{wait: time.Second, pending: true}
	}
	return &PingsFull{wait: max(next.Sub(now)+DefaultTimeout, time.Second), pending: true}
}

// Delivery is one message to one endpoint and how its tries went.
type Delivery struct {
	ID, EndpointID, EventType string
	Payload                   json.RawMessage
	CreatedAt                 time.Time
	Attempts                  int
	DeliveredAt, FailedAt     *time.Time
	LastStatus                *int
	LastError                 *string
	NextAttemptAt             time.Time
}

// Deliveries lists the newest deliveries to an endpoint of accountID's env; a
// deleted endpoint has none to show, as it is no longer listed either.
func Deliveries(ctx context.Context, q eventstore.Querier, accountID, env, endpointID string, limit int) ([]Delivery, error) {
	rows, err := q.Query(ctx, `SELECT d.delivery_id, d.endpoint_id, d.event_type, d.payload::text, d.created_at, d.attempts,
			d.delivered_at, d.failed_at, d.last_status, d.last_error, d.next_attempt_at
		FROM webhook_deliveries d JOIN webhook_endpoints e USING (endpoint_id)
		WHERE d.endpoint_id = $1 AND e.account_id = $2 AND e.env = $3 AND e.deleted_at IS NULL
		ORDER BY d.created_at DESC, d.delivery_id LIMIT $4`, endpointID, accountID, env, limit)
	if err != nil {
		return nil, fmt.Errorf("webhook deliveries: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Delivery, error) {
		var d Delivery
		var payload string
		err := r.Scan(&d.ID, &d.EndpointID, &d.EventType, &payload, &d.CreatedAt, &d.Attempts,
			&d.DeliveredAt, &d.FailedAt, &d.LastStatus, &d.LastError, &d.NextAttemptAt)
		d.Payload = json.RawMessage(payload)
		return d, err
	})
}

// Sign is the Chessd-Signature header of body sent at t: "t=<unix seconds>,v1=<hex
// HMAC-SHA256 of "<t>.<body>" under the endpoint's secret>". A receiver recomputes it
// and refuses old timestamps, so a captured message cannot be replayed later.
func Sign(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

// Verify checks a Chessd-Signature header against body, accepting timestamps within
// tolerance of now (what a receiver does; used by tests and documented for clients).
func Verify(secret, header string, body []byte, now time.Time, tolerance time.Duration) bool {
	var ts string
	for _, part := range strings.Split(header, ",") {
		if v, ok := strings.CutPrefix(part, "t="); ok {
			ts = v
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || now.Sub(time.Unix(sec, 0)).Abs() > tolerance {
		return false
	}
	want := Sign(secret, time.Unix(sec, 0), body)
	return hmac.Equal([]byte(want), []byte(header))
}

// errNotPublic is publicOnly's refusal. The net package wraps it in an error naming
// the address dialled, so the sender records NotPublicError instead (errors.Is).
var errNotPublic = errors.New("webhook: the address is not public")

// NotPublicError is the last_error of a try refused by publicOnly. It names no
// address: the delivery log would tell a customer what a name resolves to inside our
// network.
const NotPublicError = "the endpoint's host resolves to an address that is not public (loopback, private or other special-purpose): deliveries go only to public addresses"

// publicOnly refuses connections to loopback, private, link-local, unspecified,
// multicast and other special-purpose addresses (nonPublic): a customer's URL must not
// reach inside our network.
func publicOnly(_, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return err
	}
	if !isPublic(ip) {
		return errNotPublic
	}
	return nil
}

// isPublic says whether ip is none of the addresses publicOnly refuses.
func isPublic(ip netip.Addr) bool {
	ip = ip.Unmap()
	if ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsUnspecified() || ip.IsMulticast() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(ip) {
			return false
		}
	}
	return true
}

// nonPublic are the special-purpose ranges (IANA's registries) that Go's address
// predicates leave out: shared address space (carrier-grade NAT, and some clouds'
// metadata services), protocol assignments, documentation, benchmarking, reserved,
// and the IPv6 ranges that carry an IPv4 address inside (NAT64, 6to4, Teredo, the old
// IPv4-compatible form), which could lead to any of the others.
var nonPublic = func() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8", "100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24", "198.18.0.0/15", "198.51.100.0/24",
		"203.0.113.0/24", "240.0.0.0/4",
		"64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "2001::/32", "2001:db8::/32", "2002::/16",
		"::/96", "fec0::/10", // IPv4-compatible (a host that routes them reaches the IPv4 inside) and site-local, both deprecated
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}()
