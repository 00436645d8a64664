package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/analysis"
	"chessd/auth"
	"chessd/commands"
	"chessd/domain"
	"chessd/engine"
	"chessd/eventstore"
	"chessd/executor"
	"chessd/httpapi"
	"chessd/ledger"
	"chessd/mail"
	"chessd/mail/mailtest"
	"chessd/openapi/openapitest"
	"chessd/postgres/pgtest"
	"chessd/projections"
	"chessd/webhook"
)

func TestMain(m *testing.M) {
	code := pgtest.Main(m)
	if catalog != nil {
		catalog.Close()
	}
	os.Exit(code)
}

var (
	catalogOnce sync.Once
	catalog     *engine.Catalog
	catalogErr  error
)

// testCatalog starts the real engines once per test binary. One process per pool, so a
// test can tell what a request leaves behind on the next one.
func testCatalog(t testing.TB) *engine.Catalog {
	t.Helper()
	catalogOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		catalog, catalogErr = engine.Open(ctx, engine.Config{PoolSize: 1, QueueWait: 20 * time.Second,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	})
	if catalogErr != nil {
		t.Fatalf("engines: %v (run `make engines`)", catalogErr)
	}
	return catalog
}

var testPepper = []byte("test-pepper-0123456789abcdef")

// testWebhookSecrets seals webhook secrets as a server with testPepper does.
func testWebhookSecrets(t testing.TB) *webhook.Secrets {
	t.Helper()
	s, err := webhook.NewSecrets(testPepper)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// mailedToken sends the queued mail, as `chessd serve` does, to an SMTP server of the
// test's, and answers the verification token of the last message to `to` among them:
// read as its recipient reads it, the outbox keeping none.
func (e *env) mailedToken(to string) string {
	e.t.Helper()
	in := mailtest.Start(e.t, mailtest.Config{})
	seal, err := commands.NewMailSealer(testPepper)
	if err != nil {
		e.t.Fatal(err)
	}
	sender := mail.NewSender(mail.Config{SMTPAddr: in.Addr, Seal: seal}, e.pool, e.logger)
	for sender.SendDue(context.Background()) > 0 {
	}
	msgs := in.To(to)
	if len(msgs) == 0 {
		e.t.Fatalf("no message was sent to %s", to)
	}
	token := mailtest.Token(msgs[len(msgs)-1].Data)
	if token == "" {
		e.t.Fatalf("no token in the message to %s:\n%s", to, msgs[len(msgs)-1].Data)
	}
	return token
}

// env is one API server on a fresh database, with its projections running unless the
// test asked for them to be held back.
type env struct {
	t     testing.TB
	meter *ledger.Meter
	pool  *pgxpool.Pool
	srv   *httptest.Server
	api   *httpapi.Server
	svc   *analysis.Service
	execs []*executor.Executor
	// logger and lease are the workers' (addWorker)
	logger *slog.Logger
	lease  time.Duration
	// checked is api with every exchange checked against the OpenAPI document: tests
	// that call the handler directly use it.
	checked http.Handler
}

type envOption func(*envConfig)

type envConfig struct {
	workers       int
	lease         time.Duration // executor.Config.Lease; default 3 s
	leaseIdle     time.Duration // the meter's LeaseIdle and LeaseKeep; default 200 ms
	noProjections bool
	rateLimits    bool
	secureHooks   bool // webhook URLs checked as production checks them (InsecureWebhooks off)
	keyPerMinute  int  // httpapi.Config.KeyRequestsPerMinute
	keylessPerDay int  // httpapi.Config.KeylessPerDay
	streams       int  // httpapi.Config.StreamsPerAccount
	pool          *pgxpool.Pool
	catalog       *engine.Catalog                                            // default: testCatalog's
	observe       func(route, method string, status int, took time.Duration) // Deps.ObserveRequest
}

// observing tells f of every answered request, as the metrics are told.
func observing(f func(route, method string, status int, took time.Duration)) envOption {
	return func(c *envConfig) { c.observe = f }
}

// withWorkers runs n job executors (default 1).
func withWorkers(n int) envOption { return func(c *envConfig) { c.workers = n } }

// withLease sets the executors' position lease (default 3 s; renewed every third of it).
func withLease(d time.Duration) envOption { return func(c *envConfig) { c.lease = d } }

// withLeaseIdle keeps the meter's unused leases d (LeaseIdle and LeaseKeep) before it
// gives them back.
func withLeaseIdle(d time.Duration) envOption { return func(c *envConfig) { c.leaseIdle = d } }

// withKeylessPerDay sets the keyless daily allowance per address.
func withKeylessPerDay(n int) envOption { return func(c *envConfig) { c.keylessPerDay = n } }

// withStreamsPerAccount sets the job event streams an account may hold open.
func withStreamsPerAccount(n int) envOption { return func(c *envConfig) { c.streams = n } }

// withSecureWebhooks checks webhook URLs as production does: https only, to public
// hosts (the tests' envs take http://127.0.0.1:port).
func withSecureWebhooks() envOption { return func(c *envConfig) { c.secureHooks = true } }

// withRateLimits turns the rate limiter on (off by default so tests can call freely).
func withRateLimits() envOption { return func(c *envConfig) { c.rateLimits = true } }

// onPool shares another env's database.
func onPool(p *pgxpool.Pool) envOption { return func(c *envConfig) { c.pool = p } }

// withCatalog serves the engines of cat (opened with another engine.Config) instead
// of the shared test catalog's.
func withCatalog(cat *engine.Catalog) envOption { return func(c *envConfig) { c.catalog = cat } }

// withoutProjections leaves the read models behind, to prove what must not depend on them.
func withoutProjections() envOption { return func(c *envConfig) { c.noProjections = true } }

func newEnv(t testing.TB, opts ...envOption) *env {
	t.Helper()
	cfg := envConfig{workers: 1, lease: 3 * time.Second, leaseIdle: 200 * time.Millisecond}
	for _, o := range opts {
		o(&cfg)
	}
	pool := cfg.pool
	if pool == nil {
		pool = pgtest.NewDB(t)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	store := eventstore.NewStore(pool, logger)
	cat := cfg.catalog
	if cat == nil {
		cat = testCatalog(t)
	}
	svc := analysis.NewService(cat, pool, logger)
	meterCtx, stopMeter := context.WithCancel(context.Background())
	t.Cleanup(stopMeter)
	// idle leases go back quickly, so that tests can set balances between calls
	meter := ledger.NewMeter(meterCtx, store, logger, ledger.MeterConfig{LeaseIdle: cfg.leaseIdle, LeaseKeep: cfg.leaseIdle, Housekeeping: 50 * time.Millisecond})
	authn := auth.NewAuthenticator(pool, testPepper)
	authn.Watch(meterCtx, logger) // as `chessd serve`: keys and accounts answered from memory
	cmds := commands.New(store, testPepper)
	api := httpapi.New(httpapi.Config{BaseURL: "http://chessd.test/v1", MaxBodyBytes: 64 << 10, NoRateLimits: !cfg.rateLimits, InsecureWebhooks: !cfg.secureHooks,
		KeyRequestsPerMinute: cfg.keyPerMinute, KeylessPerDay: cfg.keylessPerDay, StreamsPerAccount: cfg.streams}, httpapi.Deps{
		Pool: pool, Commands: cmds,
		Auth: authn, Analysis: svc,
		Meter: meter, Logger: logger, Wakeups: eventstore.Listen(meterCtx, pool, logger), ObserveRequest: cfg.observe,
		WebhookSecrets: testWebhookSecrets(t),
	})
	if !cfg.noProjections {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		ready := make(chan struct{})
		go func() {
			done <- projections.NewRunner(pool, logger, projections.Accounts{}, projections.Ledger{}, projections.Jobs{}).Run(ctx, ready)
		}()
		select {
		case <-ready:
		case err := <-done:
			t.Fatalf("projections did not start: %v", err)
		}
		t.Cleanup(func() { cancel(); <-done })
	}
	checked := checkedAgainstOpenAPI(t, api)
	srv := httptest.NewServer(checked)
	t.Cleanup(srv.Close)
	e := &env{t: t, meter: meter, pool: pool, srv: srv, api: api, svc: svc, checked: checked, logger: logger, lease: cfg.lease}
	for i := range cfg.workers {
		// the first is the server's own, as in `chessd serve`: it shares the server's
		// command handler (the jobs submitted here); the others are `chessd worker`s
		xcmds := cmds
		if i > 0 {
			xcmds = commands.New(store, testPepper)
		}
		e.runWorker(fmt.Sprintf("test-worker-%d", i), xcmds)
	}
	return e
}

// addWorker starts a `chessd worker` on e's database, stopped at the test's end.
func (e *env) addWorker(name string) {
	e.runWorker(name, commands.New(eventstore.NewStore(e.pool, e.logger), testPepper))
}

func (e *env) runWorker(name string, cmds *commands.Handler) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	x := executor.New(executor.Config{Worker: name, Lease: e.lease, Scan: 200 * time.Millisecond},
		e.pool, cmds, e.svc, e.logger)
	e.execs = append(e.execs, x)
	go func() { done <- x.Run(ctx) }()
	e.t.Cleanup(func() { cancel(); <-done })
}

var (
	contractOnce sync.Once
	contract     *openapitest.Validator
	contractErr  error
)

// checkedAgainstOpenAPI runs every exchange with h through the OpenAPI document's
// validator: a request or an answer the document does not describe fails t, naming the
// method, the path and what differs (package openapitest has the rules).
func checkedAgainstOpenAPI(t testing.TB, h http.Handler) http.Handler {
	t.Helper()
	contractOnce.Do(func() { contract, contractErr = openapitest.NewValidator() })
	if contractErr != nil {
		t.Fatal(contractErr)
	}
	report := func(_ *http.Request, msg string) { t.Errorf("OpenAPI: %s", msg) }
	if _, fuzz := t.(*testing.F); fuzz {
		// A fuzz target may not fail f from inside it: its mismatches fail f when it ends.
		var mu sync.Mutex
		var held []string
		report = func(_ *http.Request, msg string) {
			mu.Lock()
			defer mu.Unlock()
			held = append(held, msg)
		}
		t.Cleanup(func() {
			mu.Lock()
			defer mu.Unlock()
			for i, msg := range held {
				if i == 20 {
					t.Errorf("OpenAPI: and %d more mismatches", len(held)-i)
					break
				}
				t.Errorf("OpenAPI: %s", msg)
			}
		})
	}
	return contract.Handler(h, report)
}

// response is a decoded answer.
type response struct {
	Status int
	Header http.Header
	Body   map[string]any
	Raw    string
}

func (e *env) do(method, path, key string, body any) response {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		buf, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	return e.send(req)
}

// send runs a prepared request and decodes the answer.
func (e *env) send(req *http.Request) response {
	e.t.Helper()
	method, path := req.Method, req.URL.Path
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	r := response{Status: res.StatusCode, Header: res.Header, Raw: string(raw)}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &r.Body); err != nil {
			e.t.Fatalf("%s %s: body is not a JSON object: %q", method, path, raw)
		}
	}
	return r
}

// signup makes an account and returns its key and key id.
func (e *env) signup(email string) (key, keyID string) {
	e.t.Helper()
	r := e.do("POST", "/v1/signup", "", map[string]string{"email": email})
	if r.Status != 201 {
		e.t.Fatalf("signup: %d %s", r.Status, r.Raw)
	}
	return r.Body["api_key"].(string), r.Body["key_id"].(string)
}

// signupProID makes an account on the pro plan (whose caps allow everything) and
// returns its key and the key's id.
func (e *env) signupProID(email string) (key, keyID string) {
	e.t.Helper()
	r := e.do("POST", "/v1/signup", "", map[string]string{"email": email})
	if r.Status != 201 {
		e.t.Fatalf("signup: %d %s", r.Status, r.Raw)
	}
	h := commands.New(eventstore.NewStore(e.pool, nil), testPepper)
	if err := h.ChangePlan(context.Background(), r.Body["account_id"].(string), domain.PlanPro, "test"); err != nil {
		e.t.Fatal(err)
	}
	return r.Body["api_key"].(string), r.Body["key_id"].(string)
}

// signupPro is signupProID without the key's id.
func (e *env) signupPro(email string) string {
	e.t.Helper()
	key, _ := e.signupProID(email)
	return key
}

// createKey makes a key with the given body using key, expecting success.
func (e *env) createKey(key string, body map[string]any) (secret, keyID string) {
	e.t.Helper()
	r := e.do("POST", "/v1/keys", key, body)
	if r.Status != 201 {
		e.t.Fatalf("create key: %d %s", r.Status, r.Raw)
	}
	return r.Body["api_key"].(string), r.Body["key_id"].(string)
}

// wantProblem checks a problem+json answer.
func wantProblem(t testing.TB, r response, status int, next string) {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d: %s", r.Status, status, r.Raw)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("content type %q, want application/problem+json", ct)
	}
	if r.Body["next_action"] != next {
		t.Fatalf("next_action %v, want %s: %s", r.Body["next_action"], next, r.Raw)
	}
	typ, _ := r.Body["type"].(string)
	if !strings.HasPrefix(typ, "http://chessd.test/v1/problems/") {
		t.Fatalf("type %q is not a problem URI under the base URL", typ)
	}
	if r.Body["title"] == "" || r.Body["detail"] == "" || r.Body["status"] != float64(status) {
		t.Fatalf("incomplete problem: %s", r.Raw)
	}
	if status == 401 {
		want := "Bearer" // no credential
		if next != "sign_up" {
			want = `Bearer error="invalid_token"` // one sent and refused
		}
		if got := r.Header.Values("WWW-Authenticate"); len(got) != 1 || got[0] != want {
			t.Fatalf("WWW-Authenticate %q, want %q", got, want)
		}
	}
}
