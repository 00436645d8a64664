package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"chessd/postgres/pgtest"
	"chessd/webhook"
)

// An account registers at most webhook.MaxCreations endpoints an hour in one env,
// those deleted since counted, however many creations race for the last ones; then
// CreationsFull says when the oldest is an hour old. The other env and other accounts
// have their own. Registered and deleted in a loop, endpoints came thousands a minute,
// each kept 30 days.
func TestCreationsCapped(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	secrets := testSecrets(t)
	const url = "http://127.0.0.1:9/hooks"
	account := fmt.Sprintf("acct_%d", accounts.Add(1))
	create := func(account, env string) error {
		_, err := webhook.Create(ctx, pool, secrets, account, env, url, true, nil)
		return err
	}
	const before = webhook.MaxCreations - 5 // registered and deleted one by one
	for range before {
		e, err := webhook.Create(ctx, pool, secrets, account, "live", url, true, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := webhook.Delete(ctx, pool, account, "live", e.ID); err != nil {
			t.Fatal(err)
		}
	}
	// ten at once for the last five (under MaxEndpoints live)
	var wg sync.WaitGroup
	errs := make([]error, 10)
	for i := range errs {
		wg.Go(func() { errs[i] = create(account, "live") })
	}
	wg.Wait()
	created, refused := 0, 0
	for _, err := range errs {
		var full *webhook.CreationsFull
		switch {
		case err == nil:
			created++
		case errors.As(err, &full):
			refused++
			if w := full.RetryAfter(); w <= 0 || w > time.Hour {
				t.Errorf("Retry-After %v: want the time until the first creation is an hour old", w)
			}
		default:
			t.Errorf("create: %v", err)
		}
	}
	if created != webhook.MaxCreations-before || refused != len(errs)-created {
		t.Fatalf("%d of %d racing creations registered and %d refused; want %d registered, the others refused", created, len(errs), refused, webhook.MaxCreations-before)
	}

	older := func(d time.Duration) string { // makes the account's creations d earlier
		return fmt.Sprintf(`UPDATE webhook_endpoints SET created_at = created_at - make_interval(secs => %f) WHERE account_id = $1`, d.Seconds())
	}
	for _, tc := range []struct {
		name    string
		account string
		env     string
		before  string        // run first, with $1 the account (cases in turn)
		maxWait time.Duration // the Retry-After of a refusal, at most; 0: registered
		minWait time.Duration // and at least
	}{
		{"past the cap", account, "live", "", time.Hour, 0},
		{"the other env", account, "test", "", 0, 0},
		{"another account", fmt.Sprintf("acct_%d", accounts.Add(1)), "live", "", 0, 0},
		{"within the hour", account, "live", older(59 * time.Minute), time.Minute, 0},
		{"an hour later", account, "live", older(time.Minute + time.Second), 0, 0},
		// 25 made 50 to 26 minutes ago, before the cap: room once the 6 oldest are an hour old
		{"made before the cap", fmt.Sprintf("acct_%d", accounts.Add(1)), "live", `INSERT INTO webhook_endpoints (endpoint_id, account_id, env, url, secret, created_at, deleted_at)
			SELECT 'whe_before_' || i, $1, 'live', 'http://127.0.0.1:9/hooks', 's', now() - interval '50 minutes' + i * interval '1 minute', now()
			FROM generate_series(0, 24) i`, 15 * time.Minute, 14 * time.Minute},
	} {
		if tc.before != "" {
			if _, err := pool.Exec(ctx, tc.before, tc.account); err != nil {
				t.Fatal(err)
			}
		}
		err := create(tc.account, tc.env)
		var full *webhook.CreationsFull
		switch {
		case tc.maxWait == 0 && err != nil:
			t.Errorf("%s: %v, want registered", tc.name, err)
		case tc.maxWait == 0:
		case !errors.As(err, &full):
			t.Errorf("%s: %v, want CreationsFull", tc.name, err)
		case full.RetryAfter() < tc.minWait || full.RetryAfter() <= 0 || full.RetryAfter() > tc.maxWait:
			t.Errorf("%s: Retry-After %v, want %v to %v (until one more creation has room)", tc.name, full.RetryAfter(), tc.minWait, tc.maxWait)
		}
	}
}
