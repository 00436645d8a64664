package httpapi_test

import (
	"chessd/postgres/pgtest"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"chessd/webhook"
)

// A webhook endpoint gets a signed test delivery: the receiver refuses it twice, the
// third try arrives, and the delivery log shows the three tries; another account sees
// none of it, and a deleted endpoint gets nothing more.
func TestWebhookTestDeliveryIsSignedAndRetried(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("hooks@example.com")
	var mu sync.Mutex
	var bodies [][]byte
	var signatures []string
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		bodies, signatures = append(bodies, b), append(signatures, r.Header.Get("Chessd-Signature"))
		if len(bodies) <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer receiver.Close()

	ctx, cancel := context.WithCancel(context.Background())
	sender := webhook.NewSender(webhook.Config{AllowPrivate: true, RetryBase: 20 * time.Millisecond, Poll: 50 * time.Millisecond,
		Secrets: testWebhookSecrets(t)},
		e.pool, slog.New(slog.DiscardHandler))
	done := make(chan struct{})
	go func() { sender.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	wantProblem(t, e.do("POST", "/v1/webhooks", key, map[string]any{"url": "ftp://example.com/x"}), 400, "fix_request")
	created := e.do("POST", "/v1/webhooks", key, map[string]any{"url": receiver.URL + "/hooks"})
	if created.Status != 201 || created.Body["secret"] == nil {
		t.Fatalf("create: %d %s", created.Status, created.Raw)
	}
	id, secret := created.Body["id"].(string), created.Body["secret"].(string)
	var stored string
	if err := e.pool.QueryRow(context.Background(), `SELECT secret FROM webhook_endpoints WHERE endpoint_id = $1`, id).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stored, strings.TrimPrefix(secret, "whsec_")) || !strings.HasPrefix(stored, "sealed1:") {
		t.Fatalf("the database holds the signing secret as %q: want it sealed", stored)
	}
	if list := e.do("GET", "/v1/webhooks", key, nil); len(list.Body["webhooks"].([]any)) != 1 || list.Body["webhooks"].([]any)[0].(map[string]any)["secret"] != nil {
		t.Fatalf("list: %s", list.Raw)
	}
	other := e.signupPro("not-hooks@example.com")
	wantProblem(t, e.do("POST", "/v1/webhooks/"+id+"/test", other, nil), 404, "fix_request")
	wantProblem(t, e.do("GET", "/v1/webhooks/"+id+"/deliveries", other, nil), 404, "fix_request")

	if r := e.do("POST", "/v1/webhooks/"+id+"/test", key, nil); r.Status != 202 {
		t.Fatalf("test delivery: %d %s", r.Status, r.Raw)
	}
	var log []any
	pgtest.WaitFor(t, "the third try to be delivered", func() bool {
		log = e.do("GET", "/v1/webhooks/"+id+"/deliveries", key, nil).Body["deliveries"].([]any)
		return len(log) == 1 && log[0].(map[string]any)["state"] == "delivered"
	})
	d := log[0].(map[string]any)
	if d["attempts"] != float64(3) || d["last_status"] != float64(204) || d["type"] != "ping" {
		t.Fatalf("delivery log: %v", d)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 3 {
		t.Fatalf("the receiver got %d tries, want 3", len(bodies))
	}
	for i, b := range bodies {
		if !webhook.Verify(secret, signatures[i], b, time.Now(), 5*time.Minute) {
			t.Fatalf("try %d: signature %q does not verify", i+1, signatures[i])
		}
		if webhook.Verify("whsec_wrong", signatures[i], b, time.Now(), 5*time.Minute) {
			t.Fatal("a signature verifies under another secret")
		}
		var env struct {
			ID      string `json:"id"`
			Type    string `json:"type"`
			Attempt int    `json:"attempt"`
		}
		if err := json.Unmarshal(b, &env); err != nil || env.ID != d["delivery_id"] || env.Type != "ping" || env.Attempt != i+1 {
			t.Fatalf("try %d body %s (%v)", i+1, b, err)
		}
	}
	if r := e.do("DELETE", "/v1/webhooks/"+id, key, nil); r.Status != 204 {
		t.Fatalf("delete: %d %s", r.Status, r.Raw)
	}
	wantProblem(t, e.do("POST", "/v1/webhooks/"+id+"/test", key, nil), 404, "fix_request")
	// A deleted endpoint's log goes with it, as for an endpoint that had none.
	wantProblem(t, e.do("GET", "/v1/webhooks/"+id+"/deliveries", key, nil), 404, "fix_request")
}

// An endpoint gets at most webhook.MaxTestPings test deliveries a minute, however many
// keys ask at once (each key had its own rate, so an account could aim thousands of
// requests a minute at any address it registered); then 429 with when to come back.
func TestWebhookTestPingsCapped(t *testing.T) {
	e := newEnv(t)
	owner := e.signupPro("pings@example.com")
	created := e.do("POST", "/v1/webhooks", owner, map[string]any{"url": "https://example.com/victim"})
	if created.Status != 201 {
		t.Fatal(created.Raw)
	}
	id := created.Body["id"].(string)
	keys := []string{owner}
	for range 3 {
		k, _ := e.createKey(owner, map[string]any{"scopes": []string{"billing"}})
		keys = append(keys, k)
	}
	var queued atomic.Int32
	var refused []response
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			r := e.do("POST", "/v1/webhooks/"+id+"/test", keys[i%len(keys)], nil)
			switch r.Status {
			case 202:
				queued.Add(1)
			case 429:
				mu.Lock()
				refused = append(refused, r)
				mu.Unlock()
			default:
				t.Errorf("ping: %d %s", r.Status, r.Raw)
			}
		})
	}
	wg.Wait()
	if queued.Load() != webhook.MaxTestPings || len(refused) != 16-webhook.MaxTestPings {
		t.Fatalf("%d pings queued and %d refused of 16; want %d queued", queued.Load(), len(refused), webhook.MaxTestPings)
	}
	wantProblem(t, refused[0], 429, "retry_after")
	if ra, err := strconv.Atoi(refused[0].Header.Get("Retry-After")); err != nil || ra < 1 || ra > 60 {
		t.Fatalf("Retry-After %q: want the seconds until the oldest ping is a minute old", refused[0].Header.Get("Retry-After"))
	}
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1`, id).Scan(&n); err != nil || n != webhook.MaxTestPings {
		t.Fatalf("%d deliveries queued (%v)", n, err)
	}
	// a minute on, pings go again once fewer than five are still to go
	if _, err := e.pool.Exec(context.Background(), `UPDATE webhook_deliveries SET created_at = created_at - interval '61 seconds' WHERE endpoint_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if r := e.do("POST", "/v1/webhooks/"+id+"/test", owner, nil); r.Status != 429 || !strings.Contains(r.Body["detail"].(string), "still to go") {
		t.Fatalf("a minute later, five still to go: %d %s", r.Status, r.Raw)
	}
	if _, err := e.pool.Exec(context.Background(), `UPDATE webhook_deliveries SET delivered_at = now() WHERE endpoint_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if r := e.do("POST", "/v1/webhooks/"+id+"/test", owner, nil); r.Status != 202 {
		t.Fatalf("a minute later, none still to go: %d %s", r.Status, r.Raw)
	}
}

// Creations racing for an account's last endpoints never pass the cap (each counted
// room in its own statement, and 40 at once made 11 to 17).
func TestWebhookCapHoldsUnderRace(t *testing.T) {
	e := newEnv(t)
	for round := range 3 {
		key, _ := e.signup(fmt.Sprintf("hook-race-%d@example.com", round))
		var created atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 40 {
			wg.Go(func() {
				<-start
				r := e.do("POST", "/v1/webhooks", key, map[string]any{"url": fmt.Sprintf("https://example.com/h%d", i)})
				switch r.Status {
				case 201:
					created.Add(1)
				case 409:
				default:
					t.Errorf("create: %d %s", r.Status, r.Raw)
				}
			})
		}
		close(start)
		wg.Wait()
		listed := len(e.do("GET", "/v1/webhooks", key, nil).Body["webhooks"].([]any))
		if created.Load() != webhook.MaxEndpoints || listed != webhook.MaxEndpoints {
			t.Fatalf("round %d: %d creations answered 201 and %d endpoints listed; the cap is %d", round, created.Load(), listed, webhook.MaxEndpoints)
		}
	}
}

// An account registers at most webhook.MaxCreations endpoints an hour per env, those
// deleted since counted; then 429 with when to come back. Its keys (120 managing calls
// a minute each) registered and deleted endpoints in a loop, thousands a minute, each
// record kept 30 days.
func TestWebhookCreationsCapped(t *testing.T) {
	e := newEnv(t)
	key, _ := e.signup("hook-churn@example.com")
	for i := range webhook.MaxCreations {
		r := e.do("POST", "/v1/webhooks", key, map[string]any{"url": fmt.Sprintf("https://example.com/churn%d", i)})
		if r.Status != 201 {
			t.Fatalf("create %d: %d %s", i+1, r.Status, r.Raw)
		}
		if d := e.do("DELETE", "/v1/webhooks/"+r.Body["id"].(string), key, nil); d.Status != 204 {
			t.Fatalf("delete %d: %d %s", i+1, d.Status, d.Raw)
		}
	}
	r := e.do("POST", "/v1/webhooks", key, map[string]any{"url": "https://example.com/churn"})
	wantProblem(t, r, 429, "retry_after")
	if ra, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || ra < 1 || ra > 3600 {
		t.Fatalf("Retry-After %q: want the seconds until the oldest creation is an hour old", r.Header.Get("Retry-After"))
	}
	if l := e.do("GET", "/v1/webhooks", key, nil); len(l.Body["webhooks"].([]any)) != 0 {
		t.Fatalf("endpoints listed after the refusal: %s", l.Raw)
	}
}

// heldDelivery registers an endpoint whose receiver holds each request until release
// gets a value (or is closed), then answers status; it queues a test delivery and starts
// a sender, returning once the receiver has the delivery; cancel stops the sender, whose
// Run then ends (done) once the held try is answered and recorded.
func heldDelivery(t *testing.T, e *env, key string, status int) (endpointID string, release chan struct{}, cancel context.CancelFunc, done <-chan struct{}) {
	t.Helper()
	arrived := make(chan struct{}, 4)
	release = make(chan struct{})
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		w.WriteHeader(status)
	}))
	t.Cleanup(receiver.Close)
	created := e.do("POST", "/v1/webhooks", key, map[string]any{"url": receiver.URL + "/hooks"})
	if created.Status != 201 {
		t.Fatalf("create: %d %s", created.Status, created.Raw)
	}
	endpointID = created.Body["id"].(string)
	if r := e.do("POST", "/v1/webhooks/"+endpointID+"/test", key, nil); r.Status != 202 {
		t.Fatalf("test delivery: %d %s", r.Status, r.Raw)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sender := webhook.NewSender(webhook.Config{AllowPrivate: true, Timeout: 5 * time.Second, Poll: 50 * time.Millisecond,
		Secrets: testWebhookSecrets(t)}, e.pool, slog.New(slog.DiscardHandler))
	ended := make(chan struct{})
	go func() { sender.Run(ctx); close(ended) }()
	<-arrived
	return endpointID, release, cancel, ended
}

// A sender stopped while a delivery is on its way finishes that try and records it
// (so it is not sent again after the restart), and claims nothing more.
func TestWebhookStopMidDeliveryRecordsIt(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("hooks-stop@example.com")
	id, release, cancel, done := heldDelivery(t, e, key, http.StatusNoContent)
	defer close(release)
	cancel() // the server stops while the receiver holds the request
	if r := e.do("POST", "/v1/webhooks/"+id+"/test", key, nil); r.Status != 202 {
		t.Fatalf("test delivery: %d %s", r.Status, r.Raw)
	}
	release <- struct{}{} // the receiver answers 204
	<-done
	var delivered, claimed int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE delivered_at IS NOT NULL), count(*) FILTER (WHERE attempts > 0)
		FROM webhook_deliveries WHERE endpoint_id = $1`, id).Scan(&delivered, &claimed); err != nil {
		t.Fatal(err)
	}
	if delivered != 1 || claimed != 1 {
		t.Fatalf("after the stop: %d deliveries recorded as delivered, %d claimed; want the one under way delivered and no other claimed", delivered, claimed)
	}
}

// A try whose claim lapsed (its server paused past it) and was taken by another server
// records nothing when it fails: the new holder's claim stands.
func TestWebhookLapsedClaimLeavesTheDeliveryToItsNewHolder(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("hooks-lapse@example.com")
	id, release, cancel, done := heldDelivery(t, e, key, http.StatusInternalServerError)
	// another server claims it, as it would once this claim lapsed
	if _, err := e.pool.Exec(context.Background(), `UPDATE webhook_deliveries SET attempts = attempts + 1,
		next_attempt_at = now() + interval '1 hour' WHERE endpoint_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	cancel()
	close(release) // the first try fails (500)
	<-done
	var status *int
	var soon bool
	if err := e.pool.QueryRow(context.Background(), `SELECT last_status, next_attempt_at < now() + interval '30 minutes'
		FROM webhook_deliveries WHERE endpoint_id = $1`, id).Scan(&status, &soon); err != nil {
		t.Fatal(err)
	}
	if status != nil || soon {
		t.Fatalf("the lapsed try recorded its failure (last_status %v, next try moved forward %v) over the new holder's claim", status, soon)
	}
}

// The POSTs that queue mail or a delivery, and the verification of an address, honour
// an Idempotency-Key like every other POST: a retry gets the first answer and queues
// nothing more (they ignored it, so a retried ping queued a second delivery).
func TestIdempotencyKeyOnMailAndPings(t *testing.T) {
	e := newEnv(t)
	key, _ := e.signup("idem-mail@example.com")
	ctx := context.Background()
	id := e.do("POST", "/v1/webhooks", key, map[string]any{"url": "https://example.com/h"}).Body["id"].(string)
	count := func(query string, args ...any) (n int) {
		t.Helper()
		if err := e.pool.QueryRow(ctx, query, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if _, err := e.pool.Exec(ctx, `UPDATE email_verifications SET created_at = created_at - interval '2 minutes'`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path, body string
		status     int
		queued     func() int
	}{
		{"/v1/webhooks/" + id + "/test", "", 202, func() int { return count(`SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1`, id) }},
		{"/v1/me/verify-email", "", 202, func() int { return count(`SELECT count(*) FROM mail_outbox WHERE to_email = 'idem-mail@example.com'`) }},
	} {
		first := e.withIdem(tc.path, key, "once-"+tc.path, tc.body)
		before := tc.queued()
		again := e.withIdem(tc.path, key, "once-"+tc.path, tc.body)
		if first.Status != tc.status || again.Status != tc.status || again.Raw != first.Raw || again.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%s: first %d %s, retry %d %s (replayed %q)", tc.path, first.Status, first.Raw, again.Status, again.Raw, again.Header.Get("Idempotent-Replayed"))
		}
		if after := tc.queued(); after != before {
			t.Fatalf("%s: the retry queued %d more", tc.path, after-before)
		}
	}
	token := e.mailedToken("idem-mail@example.com")
	verify := fmt.Sprintf(`{"token":%q}`, token)
	first := e.withIdem("/v1/verify-email", "", "verify-once", verify)
	again := e.withIdem("/v1/verify-email", "", "verify-once", verify)
	if first.Status != 200 || again.Status != 200 || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("verify, retried with its key: %d then %d %s (a retry without it is told the token is used)", first.Status, again.Status, again.Raw)
	}
}

// POST /webhooks refuses, with 400 naming url and why, a URL no delivery could reach:
// a numeric host in a form other than a dotted quad (an IP address to browsers and
// curl, a name to Go's resolver), localhost, a single-label name, a port out of range.
// Each was registered, and every delivery to it failed.
func TestWebhookURLsNoDeliveryCouldReach(t *testing.T) {
	e := newEnv(t, withSecureWebhooks())
	key := e.signupPro("unreachable-hooks@example.com")
	for _, tc := range []struct{ url, reason string }{
		{"https://0x7f000001/x", "numeric host"},
		{"https://127.1/", "numeric host"},
		{"https://2130706433/", "numeric host"},
		{"https://0/", "numeric host"},
		{"https://localhost/", "localhost"},
		{"https://hooks.localhost/", "localhost"},
		{"https://intranet/", "single-label"},
		{"https://example.com:99999/", "port from 1 to 65535"},
		{"https://example.com:0/", "port from 1 to 65535"},
		{"https://127.0.0.1/", "non-public address"},
		{"https://hooks.example.com:8443/x", ""}, // registered
	} {
		r := e.do("POST", "/v1/webhooks", key, map[string]any{"url": tc.url})
		if tc.reason == "" {
			if r.Status != 201 {
				t.Errorf("%s: %d %s, want 201", tc.url, r.Status, r.Raw)
			}
			continue
		}
		if got := problemFields(t, r); len(got) != 1 || got[0] != "url" || !strings.Contains(r.Raw, tc.reason) {
			t.Errorf("%s: %s, want 400 naming url, saying %q", tc.url, r.Raw, tc.reason)
		}
	}
	if list := e.do("GET", "/v1/webhooks", key, nil); len(list.Body["webhooks"].([]any)) != 1 {
		t.Errorf("registered: %s, want the one reachable URL", list.Raw)
	}
}
