package httpapi_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"chessd/domain"
	"chessd/postgres/pgtest"
)

// A lost key is recovered by mail: the address's account gets a new key with every
// scope (its address verified by the token), its other keys keep working, and the
// token works once, an hour, and only where it is meant for. An address no account
// holds is answered alike, and gets nothing.
func TestKeyRecovery(t *testing.T) {
	e := newEnv(t, withRateLimits())
	ctx := context.Background()
	lost, lostID := e.signup("lost@example.com")
	signupToken := e.mailedToken("lost@example.com")

	// the signup's message went a moment ago: the next waits its minute
	wantProblem(t, e.do("POST", "/v1/recover", "", `{"email":"lost@example.com"}`), 429, "retry_after")
	if _, err := e.pool.Exec(ctx, `UPDATE email_verifications SET created_at = created_at - interval '61 seconds'`); err != nil {
		t.Fatal(err)
	}
	for _, email := range []string{" Lost@Example.COM", "nobody@example.com"} {
		r := e.do("POST", "/v1/recover", "", map[string]string{"email": email})
		if r.Status != 202 || len(r.Body) != 1 || r.Body["email"] == nil {
			t.Fatalf("POST /recover %q: %d %s, want 202 with the address alone", email, r.Status, r.Raw)
		}
		if r.Header.Get("RateLimit-Policy") != `"recover";q=10;w=3600` {
			t.Fatalf("POST /recover's policy header: %q", r.Header.Get("RateLimit-Policy"))
		}
	}
	var toNobody int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM mail_outbox WHERE to_email = 'nobody@example.com'`).Scan(&toNobody); err != nil || toNobody != 0 {
		t.Fatalf("%d messages to an address no account holds (%v)", toNobody, err)
	}
	wantProblem(t, e.do("POST", "/v1/recover", "", `{"email":"lost@example.com"}`), 429, "retry_after") // a minute apart
	wantProblem(t, e.do("POST", "/v1/recover", "", `{"email":"not an address"}`), 400, "fix_request")
	wantProblem(t, e.do("POST", "/v1/recover", "", `{}`), 400, "fix_request")

	var readable int // queued, the message is sealed: no token at rest
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM mail_outbox WHERE body LIKE '%rk\_%'`).Scan(&readable); err != nil || readable != 0 {
		t.Fatalf("%d queued messages show a recovery token (%v)", readable, err)
	}
	token := e.mailedToken("lost@example.com")
	if !strings.HasPrefix(token, "rk_") {
		t.Fatalf("the recovery message's token %q, want rk_…", token)
	}
	// each kind of token only where it is meant for
	wantProblem(t, e.do("POST", "/v1/verify-email", "", map[string]string{"token": token}), 400, "fix_request")
	wantProblem(t, e.do("POST", "/v1/recover/confirm", "", map[string]string{"token": signupToken}), 400, "fix_request")
	wantProblem(t, e.do("POST", "/v1/recover/confirm", "", map[string]string{"token": token + "0"}), 400, "fix_request")

	r := e.do("POST", "/v1/recover/confirm", "", map[string]string{"token": token})
	if r.Status != 201 || r.Body["key_id"] == lostID {
		t.Fatalf("POST /recover/confirm: %d %s, want 201 with a new key", r.Status, r.Raw)
	}
	recovered := r.Body["api_key"].(string)
	me := e.do("GET", "/v1/me", recovered, nil)
	if me.Status != 200 || me.Body["email"] != "lost@example.com" || me.Body["email_verified"] != true {
		t.Fatalf("GET /me with the recovered key: %d %s, want the account, its address verified", me.Status, me.Raw)
	}
	if k := e.do("GET", "/v1/keys", recovered, nil); k.Status != 200 || len(k.Body["keys"].([]any)) != 2 {
		t.Fatalf("GET /keys with the recovered key (every scope): %d %s, want both keys", k.Status, k.Raw)
	}
	if old := e.do("GET", "/v1/me", lost, nil); old.Status != 200 {
		t.Fatalf("the account's first key after a recovery: %d %s, want it working", old.Status, old.Raw)
	}
	wantProblem(t, e.do("POST", "/v1/recover/confirm", "", map[string]string{"token": token}), 400, "fix_request") // used

	// an hour, no more
	if _, err := e.pool.Exec(ctx, `UPDATE email_verifications SET created_at = created_at - interval '61 seconds'`); err != nil {
		t.Fatal(err)
	}
	if r := e.do("POST", "/v1/recover", "", `{"email":"lost@example.com"}`); r.Status != 202 {
		t.Fatalf("a second recovery: %d %s", r.Status, r.Raw)
	}
	late := e.mailedToken("lost@example.com")
	if late == token {
		t.Fatal("the second recovery's message carries the first's token")
	}
	if _, err := e.pool.Exec(ctx, `UPDATE email_verifications SET expires_at = now() - interval '1 second' WHERE purpose = 'recover' AND used_at IS NULL`); err != nil {
		t.Fatal(err)
	}
	wantProblem(t, e.do("POST", "/v1/recover/confirm", "", map[string]string{"token": late}), 400, "fix_request")
}

// Whoever reads the address's mail can take the account from whoever opened it: with
// revoke_other_keys every other key, in every env, is revoked with the new one (else
// the opener's key, holding every scope, could revoke it), and an account at its key
// cap, which a caller without a key cannot make room in, is recovered this way too.
// The recovery token is not stored as a verification token is, so a server of an older
// release (which takes any token at /verify-email) finds none.
func TestKeyRecoveryTakesTheAccount(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	squatter, squatterID := e.signup("taken@example.com")
	theirs, testID := e.createKey(squatter, map[string]any{"env": "test", "label": "theirs"})
	liveIDs := map[string]bool{squatterID: true}
	for i := range domain.MaxActiveKeys - 1 { // the live keys' cap
		_, id := e.createKey(squatter, map[string]any{"label": fmt.Sprintf("k%d", i), "scopes": []string{"eval"}})
		liveIDs[id] = true
	}
	hooks := map[string]bool{}
	for _, key := range []string{squatter, theirs} { // one endpoint an env, each with a delivery pending
		h := e.do("POST", "/v1/webhooks", key, map[string]any{"url": "http://127.0.0.1:9/hooks"})
		if h.Status != 201 {
			t.Fatalf("POST /webhooks: %d %s", h.Status, h.Raw)
		}
		id := h.Body["id"].(string)
		hooks[id] = true
		if p := e.do("POST", "/v1/webhooks/"+id+"/test", key, nil); p.Status/100 != 2 {
			t.Fatalf("POST /webhooks/%s/test: %d %s", id, p.Status, p.Raw)
		}
	}
	e.mailedToken("taken@example.com") // the signup's message
	if _, err := e.pool.Exec(ctx, `UPDATE email_verifications SET created_at = created_at - interval '61 seconds'`); err != nil {
		t.Fatal(err)
	}
	if r := e.do("POST", "/v1/recover", "", `{"email":"taken@example.com"}`); r.Status != 202 {
		t.Fatalf("POST /recover: %d %s", r.Status, r.Raw)
	}
	token := e.mailedToken("taken@example.com")
	var older int // what a server of the release before looks a token up by
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM email_verifications WHERE token_hash = $1`,
		domain.HashSecret(testPepper, token)).Scan(&older); err != nil || older != 0 {
		t.Fatalf("the recovery token is found as a verification token is (%d, %v)", older, err)
	}

	// at the cap, without revoking: refused, and the token stays usable
	wantProblem(t, e.do("POST", "/v1/recover/confirm", "", map[string]any{"token": token}), 409, "fix_request")
	r := e.do("POST", "/v1/recover/confirm", "", map[string]any{"token": token, "revoke_other_keys": true})
	if r.Status != 201 {
		t.Fatalf("POST /recover/confirm revoking the others: %d %s", r.Status, r.Raw)
	}
	revoked := map[string]bool{}
	for _, id := range r.Body["revoked_key_ids"].([]any) {
		revoked[id.(string)] = true
	}
	if len(revoked) != len(liveIDs)+1 || !revoked[testID] || !revoked[squatterID] {
		t.Fatalf("revoked %d keys (test key %v, signup key %v), want all %d live ones and the test one",
			len(revoked), revoked[testID], revoked[squatterID], len(liveIDs))
	}
	deleted := r.Body["deleted_webhook_ids"].([]any)
	if len(deleted) != len(hooks) || !hooks[deleted[0].(string)] || !hooks[deleted[1].(string)] {
		t.Fatalf("deleted webhook endpoints %v, want the squatter's %v", deleted, hooks)
	}
	var live, pending int
	if err := e.pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM webhook_endpoints WHERE endpoint_id = ANY($1) AND deleted_at IS NULL),
			(SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = ANY($1) AND delivered_at IS NULL AND failed_at IS NULL)`,
		slices.Collect(maps.Keys(hooks))).Scan(&live, &pending); err != nil || live+pending != 0 {
		t.Fatalf("after the takeover %d of the squatter's endpoints stay and %d deliveries to them are pending (%v)", live, pending, err)
	}
	mine := r.Body["api_key"].(string)
	if l := e.do("GET", "/v1/webhooks", mine, nil); l.Status != 200 || len(l.Body["webhooks"].([]any)) != 0 {
		t.Fatalf("GET /webhooks with the recovered key: %d %s", l.Status, l.Raw)
	}
	wantProblem(t, e.do("GET", "/v1/me", squatter, nil), 401, "fix_request")
	wantProblem(t, e.do("DELETE", "/v1/keys/"+r.Body["key_id"].(string), squatter, nil), 401, "fix_request")
	if k := e.do("GET", "/v1/keys", mine, nil); k.Status != 200 {
		t.Fatalf("GET /keys with the recovered key: %d %s", k.Status, k.Raw)
	} else {
		active := 0
		for _, x := range k.Body["keys"].([]any) {
			if x.(map[string]any)["status"] == "active" {
				active++
			}
		}
		if active != 1 {
			t.Fatalf("%d active live keys after the takeover, want the recovered one alone", active)
		}
	}
}

// A webhook endpoint created while a recovery takes the account does not outlive it:
// the creation, authorised before, either ends first and is deleted with the others, or
// comes after and finds its key revoked. The endpoints' lock is held here until both
// wait on it.
func TestKeyRecoveryRacesAWebhookCreation(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	squatter, _ := e.signup("raced@example.com")
	e.mailedToken("raced@example.com")
	if _, err := e.pool.Exec(ctx, `UPDATE email_verifications SET created_at = created_at - interval '61 seconds'`); err != nil {
		t.Fatal(err)
	}
	if r := e.do("POST", "/v1/recover", "", `{"email":"raced@example.com"}`); r.Status != 202 {
		t.Fatalf("POST /recover: %d %s", r.Status, r.Raw)
	}
	token := e.mailedToken("raced@example.com")
	var accountID string
	if err := e.pool.QueryRow(ctx, `SELECT account_id FROM email_verifications WHERE email = 'raced@example.com' LIMIT 1`).Scan(&accountID); err != nil {
		t.Fatal(err)
	}
	lock, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx) //nolint:errcheck // released below
	if _, err := lock.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "webhooks-of-"+accountID); err != nil {
		t.Fatal(err)
	}
	waiting := func(n int) func() bool {
		return func() bool {
			var got int
			if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'`).Scan(&got); err != nil {
				t.Fatal(err)
			}
			return got >= n
		}
	}
	created, recovered := make(chan response, 1), make(chan response, 1)
	go func() {
		created <- e.do("POST", "/v1/webhooks", squatter, map[string]any{"url": "http://127.0.0.1:9/squatter"})
	}()
	pgtest.WaitFor(t, "the creation to wait for the endpoints' lock", waiting(1))
	go func() {
		recovered <- e.do("POST", "/v1/recover/confirm", "", map[string]any{"token": token, "revoke_other_keys": true})
	}()
	// (or, should it not take the lock, to end: the creation then comes after it)
	pgtest.WaitFor(t, "the recovery to wait for it too", func() bool { return len(recovered) > 0 || waiting(2)() })
	lock.Rollback(ctx) //nolint:errcheck // lets both go
	c, r := <-created, <-recovered
	if r.Status != 201 {
		t.Fatalf("POST /recover/confirm: %d %s", r.Status, r.Raw)
	}
	switch c.Status {
	case 201:
		if !slices.Contains(r.Body["deleted_webhook_ids"].([]any), c.Body["id"]) {
			t.Fatalf("the endpoint created first (%v) is not among those the recovery deleted: %v", c.Body["id"], r.Body["deleted_webhook_ids"])
		}
	case 401:
	default:
		t.Fatalf("POST /webhooks: %d %s", c.Status, c.Raw)
	}
	var live int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM webhook_endpoints WHERE account_id = $1 AND deleted_at IS NULL`, accountID).Scan(&live); err != nil || live != 0 {
		t.Fatalf("%d endpoints outlive the recovery (%v); the creation answered %d", live, err, c.Status)
	}
}
