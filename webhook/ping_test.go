package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/postgres/pgtest"
	"chessd/webhook"
)

// A test delivery is refused while webhook.MaxTestPings of its endpoint's are still to
// go, however long ago they were asked for (a slow endpoint's pings piled up without
// end, five a minute), and taken again once one has gone.
func TestPingsStillToGoCapped(t *testing.T) {
	ctx := context.Background()
	pool, account, e := pingedEndpoint(t)
	ping := func() error {
		_, err := webhook.Ping(ctx, pool, account, "live", e.ID, map[string]any{})
		return err
	}
	for range webhook.MaxTestPings {
		if err := ping(); err != nil {
			t.Fatal(err)
		}
	}
	// an hour ago: the minute's cap has room again, the pings are still to go
	if _, err := pool.Exec(ctx, `UPDATE webhook_deliveries SET created_at = created_at - interval '1 hour' WHERE endpoint_id = $1`, e.ID); err != nil {
		t.Fatal(err)
	}
	var full *webhook.PingsFull
	if err := ping(); !errors.As(err, &full) || full.RetryAfter() <= 0 {
		t.Fatalf("a ping with %d still to go: %v, want PingsFull with a Retry-After", webhook.MaxTestPings, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE webhook_deliveries SET delivered_at = now()
		WHERE delivery_id = (SELECT min(delivery_id) FROM webhook_deliveries WHERE endpoint_id = $1)`, e.ID); err != nil {
		t.Fatal(err)
	}
	if err := ping(); err != nil {
		t.Fatalf("a ping once one has gone: %v", err)
	}
}

// A test delivery refused for the pings still to go says to retry when the first of
// them will have had its next try: a try's length (10 s) when one is due or under way,
// and past its retry's wait when they all wait for one. It said 10 s whatever they
// waited for, so a client following Retry-After was refused again and again through a
// dead endpoint's backoff (about 70 times over its 8 tries' 12 minutes).
func TestPingsStillToGoRetryAfterTheirNextTry(t *testing.T) {
	ctx := context.Background()
	pool, account, e := pingedEndpoint(t)
	for range webhook.MaxTestPings {
		if _, err := webhook.Ping(ctx, pool, account, "live", e.ID, map[string]any{}); err != nil {
			t.Fatal(err)
		}
	}
	retryAfter := func(set string) time.Duration {
		t.Helper()
		// an hour ago, so the minute's cap has room: the pings still to go refuse
		if _, err := pool.Exec(ctx, `UPDATE webhook_deliveries SET created_at = now() - interval '1 hour', `+set+` WHERE endpoint_id = $1`, e.ID); err != nil {
			t.Fatal(err)
		}
		_, err := webhook.Ping(ctx, pool, account, "live", e.ID, map[string]any{})
		var full *webhook.PingsFull
		if !errors.As(err, &full) {
			t.Fatalf("a ping with %d still to go: %v, want PingsFull", webhook.MaxTestPings, err)
		}
		return full.RetryAfter()
	}
	// due now: a try begins and ends within its 10 s
	if d := retryAfter(`next_attempt_at = now()`); d < 9*time.Second || d > 10*time.Second {
		t.Errorf("Retry-After %v with the pings due, want 10 s", d)
	}
	// failed once or more, each waiting for its retry: the first retry's time and its try
	if d := retryAfter(`attempts = 3, last_error = 'timed out', next_attempt_at = now() + interval '5 minutes' + (random() * interval '1 minute')`); d < 5*time.Minute+9*time.Second || d > 6*time.Minute+10*time.Second {
		t.Errorf("Retry-After %v with the pings waiting for their retries (the first in 5 to 6 minutes), want that plus 10 s", d)
	}
	var first time.Time
	if err := pool.QueryRow(ctx, `SELECT min(next_attempt_at) FROM webhook_deliveries WHERE endpoint_id = $1`, e.ID).Scan(&first); err != nil {
		t.Fatal(err)
	}
	if d, until := retryAfter(`attempts = attempts`), time.Until(first); d < until+9*time.Second || d > until+11*time.Second {
		t.Errorf("Retry-After %v, want until the first retry (%v) plus 10 s", d, until)
	}
	// one of them under way on a server: its try ends within 10 s
	if _, err := pool.Exec(ctx, `UPDATE webhook_deliveries SET claimed_until = now() + interval '20 seconds', next_attempt_at = now() + interval '20 seconds'
		WHERE delivery_id = (SELECT min(delivery_id) FROM webhook_deliveries WHERE endpoint_id = $1)`, e.ID); err != nil {
		t.Fatal(err)
	}
	if d := retryAfter(`attempts = attempts`); d < 9*time.Second || d > 10*time.Second {
		t.Errorf("Retry-After %v with a ping's try under way, want 10 s", d)
	}
}

// pingedEndpoint is an endpoint of a new account on a database of its own, at an
// address that refuses connections.
func pingedEndpoint(t *testing.T) (*pgxpool.Pool, string, *webhook.Endpoint) {
	t.Helper()
	pool := pgtest.NewDB(t)
	account := fmt.Sprintf("acct_%d", accounts.Add(1))
	e, err := webhook.Create(context.Background(), pool, testSecrets(t), account, "live", "http://127.0.0.1:9/hooks", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	return pool, account, e
}
