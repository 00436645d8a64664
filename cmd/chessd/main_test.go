package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"chessd/auth"
	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/httpapi"
	"chessd/ledger"
	"chessd/openapi/openapitest"
	"chessd/postgres/pgtest"
	"chessd/projections"
)

// TestMain checks every exchange of the tests' HTTP clients against the OpenAPI
// document (http.DefaultTransport, which http.Get and clients without a Transport of
// their own use): a mismatch fails the test that started the server (checkTraffic), or
// the run when no test claims the server.
func TestMain(m *testing.M) {
	v, err := openapitest.NewValidator()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	contract = v
	http.DefaultTransport = v.RoundTripper(http.DefaultTransport, reportMismatch)
	code := pgtest.Main(m)
	if len(strayMismatches) > 0 {
		fmt.Fprintf(os.Stderr, "OpenAPI mismatches of servers no test claimed:\n%s\n", strings.Join(strayMismatches, "\n"))
		code = 1
	}
	os.Exit(code)
}

var (
	contract        *openapitest.Validator
	trafficMu       sync.Mutex
	trafficTests    = map[string]testing.TB{} // host:port of a server → the test that runs it
	strayMismatches []string
)

// checkTraffic makes t the test that OpenAPI mismatches of the server at base fail.
func checkTraffic(t testing.TB, base string) {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	trafficMu.Lock()
	trafficTests[u.Host] = t
	trafficMu.Unlock()
	t.Cleanup(func() {
		trafficMu.Lock()
		defer trafficMu.Unlock()
		if trafficTests[u.Host] == t {
			delete(trafficTests, u.Host)
		}
	})
}

func reportMismatch(req *http.Request, msg string) {
	trafficMu.Lock()
	t, ok := trafficTests[req.URL.Host]
	if !ok {
		strayMismatches = append(strayMismatches, msg)
	}
	trafficMu.Unlock()
	if ok {
		t.Errorf("OpenAPI: %s", msg)
	}
}

// runCLI runs a subcommand against the database at url and returns what it printed.
func runCLI(t *testing.T, url string, args ...string) (string, error) {
	t.Helper()
	out, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": url, "LOG_LEVEL": "error", "CHESSD_DATA_DIR": t.TempDir()}
	runErr := run(context.Background(), args, func(k string) string { return env[k] }, out)
	b, _ := os.ReadFile(out.Name())
	return string(b), runErr
}

// twoSignups migrates a fresh database with the CLI and signs two accounts up on it:
// six events.
func twoSignups(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url := pgtest.URL(t)
	if _, err := runCLI(t, url, "migrate"); err != nil {
		t.Fatal(err)
	}
	pool := pgtest.NewDBAt(t, url)
	h := commands.New(eventstore.NewStore(pool, nil), []byte("pepper-for-the-cli-test"))
	for _, email := range []string{"a@example.com", "b@example.com"} {
		if _, err := h.Signup(context.Background(), domain.Signup{Email: email}, "req"); err != nil {
			t.Fatal(err)
		}
	}
	return url, pool
}

// signupActor is a command handler on pool and the first signup's key acting through it.
func signupActor(t *testing.T, pool *pgxpool.Pool) (*commands.Handler, commands.Actor) {
	t.Helper()
	var adminID string
	if err := pool.QueryRow(context.Background(), `SELECT key_id FROM key_balances ORDER BY key_id LIMIT 1`).Scan(&adminID); err != nil {
		t.Fatal(err)
	}
	admin, err := commands.LoadKey(context.Background(), pool, adminID)
	if err != nil {
		t.Fatal(err)
	}
	return commands.New(eventstore.NewStore(pool, nil), []byte("pepper-for-the-cli-test")), commands.Actor{Key: admin, RequestID: "r"}
}

func TestVerifyAndRebuildCommands(t *testing.T) {
	url, pool := twoSignups(t)
	ctx := context.Background()
	out, err := runCLI(t, url, "verify")
	if err != nil || !strings.Contains(out, "ok: 6 events") {
		t.Fatalf("verify on an intact log: %v %q", err, out)
	}
	out, err = runCLI(t, url, "rebuild")
	if err != nil || !strings.Contains(out, "rebuilt accounts_v1 from 6 events") {
		t.Fatalf("rebuild: %v %q", err, out)
	}
	var keys int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM api_keys`).Scan(&keys); err != nil || keys != 2 {
		t.Fatalf("after rebuild api_keys has %d rows (%v)", keys, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE events SET payload = '{"account_id":"acct_evil"}' WHERE position = 4`); err != nil {
		t.Fatal(err)
	}
	out, err = runCLI(t, url, "verify")
	if code, _ := exitStatus(err); code != 1 || !strings.Contains(out, "position 4 edited") {
		t.Fatalf("verify after an edit: exit %d (%v) %q, want 1", code, err, out)
	}
	// a walk that cannot be made is not tampering: exit 2, not 1
	out, err = runCLI(t, "postgres://chessd:%zz@localhost/chessd", "verify")
	if code, msg := exitStatus(err); code != 2 || !strings.Contains(msg, "DATABASE_URL") {
		t.Fatalf("verify without a database: exit %d %q %q, want 2", code, msg, out)
	}
}

// `chessd verify` prints an anchor; kept outside the database, it catches a rewrite of
// the log that recomputes every hash and moves the head along, which verify without it
// cannot (the documented limit).
func TestVerifyAnchorCommand(t *testing.T) {
	url, pool := twoSignups(t)
	ctx := context.Background()
	out, err := runCLI(t, url, "verify")
	m := regexp.MustCompile(`(?m)^anchor: (6:[0-9a-f]{64}) `).FindStringSubmatch(out)
	if err != nil || m == nil {
		t.Fatalf("verify: %v %q, want an anchor at position 6", err, out)
	}
	file := t.TempDir() + "/anchors"
	if err := os.WriteFile(file, []byte("# taken after the signups\n"+m[1]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := runCLI(t, url, "verify", "--anchors", file); err != nil || !strings.Contains(out, "and at the 1 anchors given") {
		t.Fatalf("verify --anchors on an intact log: %v %q", err, out)
	}
	if _, err := runCLI(t, url, "verify", "--anchor", "6:nothex"); err == nil {
		t.Fatal("verify --anchor with a bad hash ran")
	} else if code, _ := exitStatus(err); code != 2 {
		t.Fatalf("verify --anchor with a bad hash: exit %d (%v), want 2 (tampering is 1)", code, err)
	}
	// Someone who can write the database edits event 2 and recomputes the chain after it.
	if _, err := pool.Exec(ctx, `UPDATE events SET metadata = '{}' WHERE position = 2`); err != nil {
		t.Fatal(err)
	}
	evs, err := eventstore.ReadFrom(ctx, pool, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var prev []byte
	for i := range evs {
		evs[i].Hash = eventstore.ChainHash(prev, &evs[i])
		prev = evs[i].Hash
		if _, err := pool.Exec(ctx, `UPDATE events SET hash = $1 WHERE position = $2`, prev, evs[i].Position); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE event_chain SET hash = $1`, prev); err != nil {
		t.Fatal(err)
	}
	if out, err := runCLI(t, url, "verify"); err != nil {
		t.Fatalf("verify without the anchor: %v %q, want ok (the rewrite is consistent)", err, out)
	}
	out, err = runCLI(t, url, "verify", "--anchor", m[1])
	if err == nil || !strings.Contains(out, "position 6 rewritten") {
		t.Fatalf("verify --anchor after the rewrite: %v %q", err, out)
	}
}

// `chessd replay` compares the closed key balances with the keys' revocations: one a
// revocation left open (as a chessd older than migration 0041 leaves it) is reported,
// and a DELETE of the key again closes it.
func TestReplayChecksRevokedBalances(t *testing.T) {
	url, pool := twoSignups(t)
	ctx := context.Background()
	h, actor := signupActor(t, pool)
	key, _, err := h.CreateKey(ctx, actor, domain.KeySettings{Label: "to revoke", Scopes: []domain.Scope{domain.ScopeEval}, Env: domain.EnvLive})
	if err != nil {
		t.Fatal(err)
	}
	keyID := key.ID()
	revoke := func() {
		t.Helper()
		if _, err := h.RevokeKey(ctx, actor, keyID); err != nil {
			t.Fatal(err)
		}
	}
	revoke()
	if out, err := runCLI(t, url, "rebuild"); err != nil { // the read models, which no runner keeps here
		t.Fatalf("rebuild: %v\n%s", err, out)
	}
	if out, err := runCLI(t, url, "replay"); err != nil || !strings.Contains(out, "equal   key_balances.revoked: 1 rows") {
		t.Fatalf("replay after a revocation: %v\n%s", err, out)
	}
	if _, err := pool.Exec(ctx, `UPDATE key_balances SET revoked_at = NULL WHERE key_id = $1`, keyID); err != nil {
		t.Fatal(err)
	}
	if out, err := runCLI(t, url, "replay"); err == nil || !strings.Contains(out, "DIFFERS key_balances.revoked") {
		t.Fatalf("replay with a revoked key's balance open: %v\n%s", err, out)
	}
	revoke() // again: nothing new to record, but the balance closes
	if out, err := runCLI(t, url, "replay"); err != nil || !strings.Contains(out, "equal   key_balances.revoked: 1 rows") {
		t.Fatalf("replay after the key was revoked again: %v\n%s", err, out)
	}
}

// `chessd replay` compares the budgets and zones the meter enforces (and GET /me
// shows) with the events that set them: a key's budget, an account's budget and its
// zone drifted in the write side's tables are each reported; replay said every line
// equal and exited 0.
func TestReplayChecksBudgetSettings(t *testing.T) {
	url, pool := twoSignups(t)
	ctx := context.Background()
	h, actor := signupActor(t, pool)
	units, usd := int64(90000), decimal.RequireFromString("1.25")
	key, _, err := h.CreateKey(ctx, actor, domain.KeySettings{Label: "budgeted", Scopes: []domain.Scope{domain.ScopeEval}, Env: domain.EnvLive,
		BudgetUnits: &units, BudgetUSD: &usd, Period: domain.PeriodDay})
	if err != nil {
		t.Fatal(err)
	}
	tz, accountUnits := "Europe/Paris", int64(5000)
	if _, err := h.UpdateAccount(ctx, actor, commands.AccountChange{Timezone: &tz, Budget: &domain.BudgetChange{Units: &accountUnits}}); err != nil {
		t.Fatal(err)
	}
	if out, err := runCLI(t, url, "rebuild"); err != nil { // the read models, which no runner keeps here
		t.Fatalf("rebuild: %v\n%s", err, out)
	}
	out, err := runCLI(t, url, "replay")
	for _, line := range []string{"equal   key_balances.budget: 3 rows", "equal   account_budgets.budget: 1 rows", "equal   account_zones: 1 rows"} {
		if err != nil || !strings.Contains(out, line) {
			t.Fatalf("replay of the settings as set, want %q: %v\n%s", line, err, out)
		}
	}
	for _, tc := range []struct{ name, drift, undo string }{
		{"key_balances.budget", `UPDATE key_balances SET budget_units = 5 WHERE key_id = '` + key.ID() + `'`,
			`UPDATE key_balances SET budget_units = 90000 WHERE key_id = '` + key.ID() + `'`},
		{"account_budgets.budget", `UPDATE account_budgets SET budget_units = 999`, `UPDATE account_budgets SET budget_units = 5000`},
		{"account_zones", `UPDATE account_zones SET tz = 'Asia/Tokyo'`, `UPDATE account_zones SET tz = 'Europe/Paris'`},
	} {
		if _, err := pool.Exec(ctx, tc.drift); err != nil {
			t.Fatal(err)
		}
		if out, err := runCLI(t, url, "replay"); err == nil || !strings.Contains(out, "DIFFERS "+tc.name) {
			t.Errorf("replay with %s drifted: %v\n%s", tc.name, err, out)
		}
		if _, err := pool.Exec(ctx, tc.undo); err != nil {
			t.Fatal(err)
		}
	}
}

// A dispute: charges made through the ledger, then `chessd audit` for the key must
// print the same total as GET /usage, and `chessd replay` must find the read models
// equal to the events (and notice when they are not).
func TestAuditAndReplay(t *testing.T) {
	url := pgtest.URL(t)
	pool := pgtest.NewDBAt(t, url)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	store := eventstore.NewStore(pool, logger)
	pepper := []byte("pepper-for-the-cli-test")
	h := commands.New(store, pepper)
	res, err := h.Signup(ctx, domain.Signup{Email: "dispute@example.com"}, "req")
	if err != nil {
		t.Fatal(err)
	}
	authn := auth.NewAuthenticator(pool, pepper)
	key, acct, err := authn.Authenticate(ctx, res.Secret)
	if err != nil {
		t.Fatal(err)
	}
	meter := ledger.NewMeter(ctx, store, logger, ledger.MeterConfig{})
	for i := range 7 {
		r, err := meter.Reserve(ctx, ledger.Call{RequestID: fmt.Sprintf("req-%d", i), Key: key, Account: acct,
			Price: domain.Call{Endpoint: domain.EndpointEval, Depth: 10 + i, MultiPV: 1, Positions: 1}})
		if err != nil {
			t.Fatalf("reserve %d: %v", i, err)
		}
		if err := r.Settle(ledger.Answered{Endpoint: domain.EndpointEval, Engine: "sf-17.1", Path: "native",
			Params: ledger.Params{Depth: 10 + i, MultiPV: 1, Positions: 1}}); err != nil {
			t.Fatalf("settle %d: %v", i, err)
		}
	}
	if err := meter.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	beforeRefunds := time.Now() // the account as it stood here is asked for at the end
	runner := projections.NewRunner(pool, logger, allProjections()...)
	ready := make(chan struct{})
	go runner.Run(ctx, ready) //nolint:errcheck // stops with ctx
	<-ready
	api := httpapi.New(httpapi.Config{BaseURL: "http://x/v1", NoRateLimits: true}, httpapi.Deps{
		Pool: pool, Commands: h, Auth: authn, Meter: meter, Logger: logger})
	srv := httptest.NewServer(contract.Handler(api, func(_ *http.Request, msg string) { t.Errorf("OpenAPI: %s", msg) }))
	defer srv.Close()
	today := time.Now().UTC().Format(time.DateOnly)
	var usage struct {
		Totals struct {
			Calls int64  `json:"calls"`
			Units int64  `json:"units"`
			USD   string `json:"usd"`
		} `json:"totals"`
	}
	deadline := time.Now().Add(10 * time.Second)
	for usage.Totals.Calls != 7 {
		if time.Now().After(deadline) {
			t.Fatalf("usage never showed the 7 charges: %+v", usage)
		}
		req, _ := http.NewRequest("GET", srv.URL+"/v1/usage?group_by=key&from="+today+"&to="+today, nil)
		req.Header.Set("Authorization", "Bearer "+res.Secret)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		json.NewDecoder(resp.Body).Decode(&usage) //nolint:errcheck // retried
		resp.Body.Close()
		time.Sleep(20 * time.Millisecond)
	}
	out, err := runCLI(t, url, "audit", "--key", res.KeyID, "--from", today, "--to", today)
	want := fmt.Sprintf("total: 7 charges, %d units, %s USD", usage.Totals.Units, usage.Totals.USD)
	if err != nil || !strings.Contains(out, want) || strings.Count(out, "chg_") != 7 || !strings.Contains(out, "req-6") {
		t.Fatalf("audit (want %q): %v\n%s", want, err, out)
	}
	out, err = runCLI(t, url, "audit", "--key", res.KeyID, "--from", "2020-01-01", "--to", "2020-01-02")
	if err != nil || !strings.Contains(out, "total: 0 charges, 0 units, 0.000000 USD") {
		t.Fatalf("audit of an empty range: %v\n%s", err, out)
	}
	if out, err := runCLI(t, url, "audit", "--key", "key_nope", "--from", today, "--to", today); err == nil || !strings.Contains(err.Error(), `no key "key_nope"`) {
		t.Fatalf("audit of a key that does not exist: %v\n%s", err, out)
	}

	// /usage reads the inline ledger model; the accounts model is the runner's, which
	// may still be applying the signup on a loaded machine: replay compares both
	waitFor(t, "the accounts projection to apply the signup", 10*time.Second, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM accounts WHERE account_id = $1)
			+ (SELECT count(*) FROM api_keys WHERE key_id = $2) + (SELECT count(*) FROM key_secrets WHERE key_id = $2)`,
			key.AccountID(), key.ID()).Scan(&n)
		return err == nil && n == 3
	})
	// the 7 calls were settled in one or more group commits: a ChargesSettled each
	var batches int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM charge_batches`).Scan(&batches); err != nil || batches < 1 || batches > 7 {
		t.Fatalf("%d charge_batches rows for 7 calls (%v)", batches, err)
	}
	out, err = runCLI(t, url, "replay")
	if err != nil || !strings.Contains(out, fmt.Sprintf("equal   charge_batches: %d rows", batches)) ||
		!strings.Contains(out, "equal   key_balances.spent") {
		t.Fatalf("replay on a consistent database: %v\n%s", err, out)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM charge_batches WHERE position = (SELECT position FROM charge_lines() WHERE request_id = 'req-3')`); err != nil {
		t.Fatal(err)
	}
	out, err = runCLI(t, url, "replay")
	if err == nil || !strings.Contains(out, fmt.Sprintf("DIFFERS charge_batches: live had %d rows, the events give %d", batches-1, batches)) {
		t.Fatalf("replay after losing a read-model row: %v\n%s", err, out)
	}
	if out, err = runCLI(t, url, "replay"); err != nil {
		t.Fatalf("replay repaired the read model, the next one must be equal: %v\n%s", err, out)
	}

	// a refund of two charges: credited once each, in /usage, the audit and the budget
	out, _ = runCLI(t, url, "audit", "--key", res.KeyID, "--from", today, "--to", today)
	ids := regexp.MustCompile(`chg_[0-9]+_[0-9]+`).FindAllString(out, -1)
	if len(ids) != 7 {
		t.Fatalf("charge ids in the audit: %v", ids)
	}
	if out, err := runCLI(t, url, "refund", "--reason", "engine restarted mid-search", "--by", "ops:test", ids[1], ids[4]); err != nil ||
		strings.Count(out, "credited chg_") != 2 {
		t.Fatalf("refund: %v\n%s", err, out)
	}
	if out, err := runCLI(t, url, "refund", "--reason", "again", ids[4], ids[5]); err == nil || !strings.Contains(out+err.Error(), "already credited") {
		t.Fatalf("a second refund of a charge: %v\n%s", err, out)
	}
	var net struct {
		Totals struct {
			Units    int64  `json:"units"`
			Credits  int64  `json:"credits"`
			NetUnits int64  `json:"net_units"`
			NetUSD   string `json:"net_usd"`
		} `json:"totals"`
	}
	req, _ := http.NewRequest("GET", srv.URL+"/v1/usage?from="+today+"&to="+today, nil)
	req.Header.Set("Authorization", "Bearer "+res.Secret)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&net) //nolint:errcheck // checked below
	resp.Body.Close()
	if net.Totals.Credits != 2 || net.Totals.Units != usage.Totals.Units || net.Totals.NetUnits >= net.Totals.Units {
		t.Fatalf("usage after the refund: %+v", net.Totals)
	}
	out, err = runCLI(t, url, "audit", "--key", res.KeyID, "--from", today, "--to", today)
	if want := fmt.Sprintf("total: 7 charges, %d units, %s USD", net.Totals.NetUnits, net.Totals.NetUSD); err != nil || !strings.Contains(out, want) || strings.Count(out, "crd_") != 2 {
		t.Fatalf("audit after the refund (want %q): %v\n%s", want, err, out)
	}
	var spent int64
	if err := pool.QueryRow(ctx, `SELECT spent_units FROM key_balances WHERE key_id = $1`, res.KeyID).Scan(&spent); err != nil || spent != net.Totals.NetUnits {
		t.Fatalf("the key's spend %d after the refund, want the net %d (%v)", spent, net.Totals.NetUnits, err)
	}
	var unbalanced int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT position, currency FROM ledger_entries
		GROUP BY position, currency HAVING sum(debit) <> sum(credit)) x`).Scan(&unbalanced); err != nil || unbalanced != 0 {
		t.Fatalf("%d unbalanced transactions (%v)", unbalanced, err)
	}
	if out, err := runCLI(t, url, "replay"); err != nil || !strings.Contains(out, "equal   credits: 2 rows") || !strings.Contains(out, "equal   key_balances.spent") {
		t.Fatalf("replay with credits: %v\n%s", err, out)
	}
	if out, err := runCLI(t, url, "verify"); err != nil {
		t.Fatalf("verify with credits: %v\n%s", err, out)
	}

	// a dispute, answered from the command line
	d, err := h.OpenDispute(ctx, commands.Actor{Key: key, RequestID: "r"}, []string{ids[6]}, "the last call never answered")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := runCLI(t, url, "dispute", "list"); err != nil || !strings.Contains(out, d.DisputeID) || !strings.Contains(out, "1 open") {
		t.Fatalf("dispute list: %v\n%s", err, out)
	}
	// the flags before the id, as after it
	if out, err := runCLI(t, url, "dispute", "accept", "--note", "our timeout", "--by", "ops:test", d.DisputeID); err != nil || !strings.Contains(out, "accepted") {
		t.Fatalf("dispute accept: %v\n%s", err, out)
	}
	if out, err := runCLI(t, url, "dispute", "reject", d.DisputeID, "--reason", "too late"); err == nil {
		t.Fatalf("a second answer to a dispute: %s", out)
	}
	if out, err := runCLI(t, url, "replay"); err != nil || !strings.Contains(out, "equal   credits: 3 rows") || !strings.Contains(out, "equal   disputes: 1 rows") {
		t.Fatalf("replay with a dispute: %v\n%s", err, out)
	}

	// the account as it stood before the refunds, and now: the past view does not move
	then, err := projections.AsOf(ctx, pool, res.AccountID, beforeRefunds, beforeRefunds.Add(projections.AsOfMargin))
	if err != nil {
		t.Fatal(err)
	}
	u := then.Usage[res.KeyID]
	if u == nil || u.Calls != 7 || u.Credits != 0 || u.Units != usage.Totals.Units || len(then.Keys) != 1 || then.Account.Plan() != domain.PlanFree {
		t.Fatalf("as of before the refunds: %+v (usage %+v)", then, u)
	}
	var printed strings.Builder
	printAsOf(&printed, then) // what `chessd replay --as-of` prints for it
	if !strings.Contains(printed.String(), fmt.Sprintf("total: 7 calls, %d units", usage.Totals.Units)) || !strings.Contains(printed.String(), res.KeyID) {
		t.Fatalf("as-of view printed:\n%s", printed.String())
	}
	now := time.Now()
	later, err := projections.AsOf(ctx, pool, res.AccountID, now, now.Add(projections.AsOfMargin))
	if err != nil {
		t.Fatal(err)
	}
	if u := later.Usage[res.KeyID]; u == nil || u.Calls != 7 || u.Credits != 3 || u.Units-u.CreditedUnits >= u.Units {
		t.Fatalf("as of now: %+v", u)
	}
	if out, err := runCLI(t, url, "replay", "--as-of", now.Format(time.RFC3339Nano), "--account", res.AccountID); err == nil || !strings.Contains(out+err.Error(), "at least") {
		t.Fatalf("an as-of instant of a moment ago: %v\n%s", err, out)
	}
	if out, err := runCLI(t, url, "replay", "--as-of", "2020-01-01T00:00:00Z", "--account", res.AccountID); err == nil {
		t.Fatalf("the account as of before it existed: %s", out)
	}
}

// `chessd replay` on a service that is charging meanwhile reads the live tables and
// the rebuilt ones at different points of the log: what differs then is reported
// BUSY (exit 3, run it with the servers stopped), never DIFFERS, which says the read
// models disagree with the events; once the charging stops it finds them equal.
func TestReplayWhileChargingSaysBusy(t *testing.T) {
	url, pool := twoSignups(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if out, err := runCLI(t, url, "rebuild"); err != nil { // the read models, which no runner keeps here
		t.Fatalf("rebuild: %v\n%s", err, out)
	}
	_, actor := signupActor(t, pool)
	acct, err := commands.LoadAccount(ctx, pool, actor.Key.AccountID())
	if err != nil {
		t.Fatal(err)
	}
	meter := ledger.NewMeter(ctx, eventstore.NewStore(pool, nil), nil, ledger.MeterConfig{})
	charge := func(id string) error {
		if err := answerEval(ctx, meter, actor.Key, acct, id); err != nil {
			return err
		}
		return meter.Flush(ctx)
	}
	stop := make(chan struct{})
	charging := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				charging <- nil
				return
			default:
			}
			if err := charge(fmt.Sprintf("live-%d", i)); err != nil {
				charging <- err
				return
			}
		}
	}()
	for range 2 {
		out, err := runCLI(t, url, "replay")
		var code exitCode
		if strings.Contains(out, "DIFFERS") || (err != nil && (!errors.As(err, &code) || code != 3 || !strings.Contains(out, "BUSY"))) {
			t.Fatalf("replay while charging: %v\n%s", err, out)
		}
	}
	// the charges are no account's events: a drift of the accounts read model is still
	// told as one, traffic or not
	if _, err := pool.Exec(ctx, `UPDATE accounts SET name = 'drifted'`); err != nil {
		t.Fatal(err)
	}
	if out, err := runCLI(t, url, "replay"); err == nil || !strings.Contains(out, "DIFFERS accounts:") {
		t.Fatalf("replay of a drifted accounts table while charging: %v\n%s", err, out)
	}
	close(stop)
	if err := <-charging; err != nil {
		t.Fatal(err)
	}
	if out, err := runCLI(t, url, "replay"); err != nil {
		t.Fatalf("replay once the charging stopped: %v\n%s", err, out)
	}
}

// The as-of view counts a call by when it was answered, as GET /usage's as_of does: a
// call answered a moment before the instant and settled (its event recorded) a moment
// after is in the view; one answered after the instant is not.
func TestAsOfCountsACallByItsAnswer(t *testing.T) {
	_, pool := twoSignups(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h, actor := signupActor(t, pool)
	testKey, _, err := h.CreateKey(ctx, actor, domain.KeySettings{Label: "test", Scopes: []domain.Scope{domain.ScopeEval}, Env: domain.EnvTest})
	if err != nil {
		t.Fatal(err)
	}
	acct, err := commands.LoadAccount(ctx, pool, actor.Key.AccountID())
	if err != nil {
		t.Fatal(err)
	}
	meter := ledger.NewMeter(ctx, eventstore.NewStore(pool, nil), nil, ledger.MeterConfig{})
	answer := func(key *domain.Key, id string) {
		if err := answerEval(ctx, meter, key, acct, id); err != nil {
			t.Fatal(err)
		}
	}
	answer(actor.Key, "before") // answered (charged_at stamped) here, settled below
	answer(testKey, "test")
	at := time.Now()
	time.Sleep(time.Millisecond) // charged_at is kept to the microsecond: the next is past at
	answer(actor.Key, "after")
	if err := meter.Flush(ctx); err != nil { // both recorded after at
		t.Fatal(err)
	}
	v, err := projections.AsOf(ctx, pool, actor.Key.AccountID(), at, at.Add(projections.AsOfMargin))
	if err != nil {
		t.Fatal(err)
	}
	if u := v.Usage[actor.Key.ID()]; u == nil || u.Calls != 1 {
		t.Fatalf("as of between the two answers: %+v, want the first call alone", u)
	}
	// printed as `chessd replay --as-of` does: a total per book, as GET /usage answers
	var printed strings.Builder
	printAsOf(&printed, v)
	for _, line := range []string{"total: 1 calls, ", "total (test book): 1 calls, "} {
		if !strings.Contains(printed.String(), line) {
			t.Fatalf("as-of view printed without %q:\n%s", line, printed.String())
		}
	}
}

// answerEval reserves and settles one depth-5 eval of key through meter, as a server
// answering it does: its charge is in the meter's next group commit.
func answerEval(ctx context.Context, meter *ledger.Meter, key *domain.Key, acct *domain.Account, id string) error {
	r, err := meter.Reserve(ctx, ledger.Call{RequestID: id, Key: key, Account: acct,
		Price: domain.Call{Endpoint: domain.EndpointEval, Depth: 5, MultiPV: 1, Positions: 1}})
	if err != nil {
		return err
	}
	return r.Settle(ledger.Answered{Endpoint: domain.EndpointEval, Engine: "sf-17.1", Path: "native",
		Params: ledger.Params{Depth: 5, MultiPV: 1, Positions: 1}})
}
