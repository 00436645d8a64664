package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"chessd/postgres/pgtest"
	"chessd/webhook"
)

// A test delivery is refused while webhook.MaxTestPings of its endpoint's are still to
// go, however long ago they were asked for (a slow endpoint's pings piled up without
// end, five a minute), and taken again once one has gone.
func TestPingsStillToGoCapped(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	account := fmt.Sprintf("acct_%d", accounts.Add(1))
	e, err := webhook.Create(ctx, pool, testSecrets(t), account, "live", "http://127.0.0.1:9/hooks", true, nil)
	if err != nil {
		t.Fatal(err)
	}
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
