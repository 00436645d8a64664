// Package httpapi is the HTTP interface under /v1: routing, authentication, request
// decoding and problem+json. It is the only package that knows status codes.
package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"runtime/debug"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/analysis"
	"chessd/auth"
	"chessd/commands"
	"chessd/console"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/ledger"
	"chessd/ratelimit"
	"chessd/webhook"
)

// Config is what the HTTP layer needs to know about its deployment.
type Config struct {
	// BaseURL is the public address including /v1, used in problem type URIs.
	BaseURL string
	// MaxBodyBytes bounds every request body.
	MaxBodyBytes int64
	// NoRateLimits turns rate limiting off (benchmarks of the charge path).
	NoRateLimits bool
	// KeyRequestsPerMinute, when set, replaces every plan's requests per minute (tests
	// of the limit; the plans' own rates are in domain/plans.go).
	KeyRequestsPerMinute int
	// TrustedProxies are the proxies (load balancers) whose X-Forwarded-For tells the
	// client's address (clientIP); without them every client behind one would share
	// its per-address limits.
	TrustedProxies []netip.Prefix
	// KeylessPerDay, when set, replaces the keyless daily allowance per address
	// (KeylessPerDay; load tests, whose every call comes from 127.0.0.1).
	KeylessPerDay int
	// InsecureWebhooks accepts http:// webhook URLs (development and tests).
	InsecureWebhooks bool
	// StreamsPerAccount, when set, replaces StreamsPerAccount (tests).
	StreamsPerAccount int
}

// Server holds the handlers' dependencies.
type Server struct {
	baseURL string
	maxBody int64
	cfg     Config
	// streams ends (EndStreams) when the server stops: the job event streams, which
	// would hold its stop for as long as their jobs run, end with it.
	streams    context.Context
	endStreams context.CancelFunc
	slots      *streamSlots // the job event streams open on this server, by account
	badKeys    *badKeys     // addresses held back for their bad credentials (heldBack)
	pool       *pgxpool.Pool
	commands   *commands.Handler
	auth       *auth.Authenticator
	analysis   *analysis.Service
	meter      *ledger.Meter
	wakeups    *eventstore.Wakeups
	billing    BillingProvider
	limiter    *ratelimit.Limiter
	keyRate    int // Config.KeyRequestsPerMinute
	keyless    int // keyless calls per address and day: Config.KeylessPerDay or KeylessPerDay
	logger     *slog.Logger
	router     *mux.Router
	observe    func(route, method string, status int, took time.Duration) // Deps.ObserveRequest
	hooks      *webhook.Secrets
}

// Deps are the parts the server is built from.
type Deps struct {
	Pool     *pgxpool.Pool
	Commands *commands.Handler
	Auth     *auth.Authenticator
	Analysis *analysis.Service
	Meter    *ledger.Meter   // the money path
	Billing  BillingProvider // nil: paid subscriptions not enabled
	Logger   *slog.Logger
	// Wakeups, when set, wakes job event streams at the commits that add to them
	// (without it they poll).
	Wakeups *eventstore.Wakeups
	// ObserveRequest, when set, is told of every answered request with its route's
	// template ("/v1/jobs/{id}"; "unmatched" when no route took it): the metrics.
	ObserveRequest func(route, method string, status int, took time.Duration)
	// WebhookSecrets seals the signing secrets of the endpoints POST /webhooks
	// registers (webhook.NewSecrets of the key pepper); nil: registering one fails.
	WebhookSecrets *webhook.Secrets
}

// EndStreams ends every open job event stream, and any opened later, at once: the server
// is stopping. Their clients reconnect, with Last-Event-ID, to another server.
func (s *Server) EndStreams() { s.endStreams() }

// New builds the server and its routes.
func New(cfg Config, d Deps) *Server {
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	s := &Server{
		baseURL: strings.TrimRight(cfg.BaseURL, "/"), maxBody: cfg.MaxBodyBytes, cfg: cfg,
		pool: d.Pool, commands: d.Commands, auth: d.Auth, analysis: d.Analysis, meter: d.Meter, wakeups: d.Wakeups,
		billing: d.Billing, logger: d.Logger, keyRate: cfg.KeyRequestsPerMinute, observe: d.ObserveRequest, hooks: d.WebhookSecrets,
	}
	if s.billing == nil {
		s.billing = billingDisabled{}
	}
	s.streams, s.endStreams = context.WithCancel(context.Background())
	s.slots = newStreamSlots(StreamsPerAccount)
	s.badKeys = newBadKeys()
	if cfg.StreamsPerAccount > 0 {
		s.slots = newStreamSlots(cfg.StreamsPerAccount)
	}
	s.keyless = KeylessPerDay
	if cfg.KeylessPerDay > 0 {
		s.keyless = cfg.KeylessPerDay
	}
	if !cfg.NoRateLimits {
		s.limiter = ratelimit.New(d.Pool, d.Logger) // shared by every server of the database
	}
	s.routes()
	return s
}

// ServeHTTP runs every request through the middleware chain.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.middleware(s.router).ServeHTTP(w, r)
}

func (s *Server) routes() {
	// SkipClean: a path is taken as sent. gorilla/mux would otherwise answer a path
	// with an empty, . or .. segment (/v1//keys, /v1/keys/%2F, /v1/keys/../keys/key_…)
	// with a bare 301 to its cleaned form, for every method: a client following it
	// turns a POST into a GET of the list, and believes it created what it did not.
	root := mux.NewRouter().SkipClean(true)
	// An unclean path is refused whether or not a route would take it: /v1/keys/.. is
	// /keys/{id} with the id "..", and would reach its handler.
	unclean := func(w http.ResponseWriter, r *http.Request) bool {
		if !uncleanPath(r.URL.Path) {
			return false
		}
		s.writeError(w, r, domain.Errorf(domain.CodeNotFound, "no endpoint %s %s: the path holds an empty, . or .. segment (an encoded slash, %%2F, is one too), and paths are taken as sent, never cleaned or redirected", r.Method, r.URL.Path))
		return true
	}
	root.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if unclean(w, r) {
			return
		}
		s.writeError(w, r, domain.Errorf(domain.CodeNotFound, "no endpoint %s %s (every path is under /v1)", r.Method, r.URL.Path))
	})
	root.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if unclean(w, r) {
			return
		}
		allowed := allowedMethods(root, r)
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		s.writeError(w, r, &domain.Error{Code: codeMethodNotAllowed,
			Message: fmt.Sprintf("%s is not allowed on %s; allowed: %s", r.Method, r.URL.Path, strings.Join(allowed, ", "))})
	})
	// Every route under /v1 takes only what the OpenAPI document declares of its
	// operation (declaredOnly; filled in by declareRoutes below).
	declaredOf := map[*mux.Route]*declared{}
	handle := func(method, path string, h http.HandlerFunc) {
		d := &declared{}
		methods := []string{method}
		// RFC 9110 (9.1): a general-purpose server takes HEAD wherever it takes GET;
		// net/http sends the GET answer's headers without its body. A job's event stream
		// is left out: a HEAD would hold its connection for as long as the job runs.
		if method == http.MethodGet && path != "/jobs/{id}/events" {
			methods = append(methods, http.MethodHead)
		}
		declaredOf[root.HandleFunc("/v1"+path, s.declaredOnly(d, h)).Methods(methods...)] = d
	}
	// The costed calls first: the router tries routes in order, and these take nearly
	// all requests (no two routes here match one path, so the order changes nothing else).
	handle("POST", "/eval", s.eval) // keyless allowed: costed authenticates itself
	handle("POST", "/bestmove", s.bestMove)
	handle("GET", "/healthz", s.healthz)
	handle("GET", "/readyz", s.readyz)
	handle("GET", "/health", s.health)
	handle("GET", "/problems/{slug}", s.problemPage)
	handle("GET", "/openapi.json", s.openAPIJSON)
	handle("GET", "/openapi.yaml", s.openAPIYAML)
	handle("GET", "/docs", s.docsPage)
	handle("GET", "/docs/{file}", s.docsAsset)
	root.HandleFunc("/docs", s.docsPage).Methods("GET", "HEAD") // the reference page where people look for it
	// The web console, outside /v1 (docs/API.md "Console"): its pages and its bundle.
	// Any other path stays a problem+json 404.
	pages := console.New()
	pages.NotFound = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, domain.Errorf(domain.CodeNotFound, "the console's bundle holds no file %s", r.URL.Path))
	})
	for _, p := range console.Pages {
		root.Handle(p, pages).Methods("GET", "HEAD")
	}
	root.PathPrefix(console.AssetPrefix).Handler(pages).Methods("GET", "HEAD")

	handle("POST", "/signup", s.idempotent(s.signup))
	handle("POST", "/verify-email", s.idempotent(s.verifyEmail))
	handle("POST", "/recover", s.idempotent(s.requestRecovery))
	handle("POST", "/recover/confirm", s.idempotent(s.recoverKey))
	handle("GET", "/usage", s.authed(domain.ScopeUsageRead, s.usage))
	handle("GET", "/usage/charges", s.authed(domain.ScopeUsageRead, s.statement))
	handle("GET", "/charges/{id}", s.authed(domain.ScopeUsageRead, s.explainCharge))
	handle("POST", "/billing/checkout", s.authed(domain.ScopeBilling, s.idempotent(s.checkout)))
	handle("POST", "/billing/portal", s.authed(domain.ScopeBilling, s.idempotent(s.portal)))
	handle("GET", "/me", s.authed(domain.ScopeUsageRead, s.me))
	handle("PATCH", "/me", s.authed(domain.ScopeBilling, s.updateMe))
	handle("POST", "/me/verify-email", s.authed(domain.ScopeUsageRead, s.idempotent(s.resendVerification)))
	handle("POST", "/disputes", s.authed(domain.ScopeBilling, s.idempotent(s.openDispute)))
	handle("GET", "/disputes", s.authed(domain.ScopeUsageRead, s.listDisputes))
	handle("GET", "/disputes/{id}", s.authed(domain.ScopeUsageRead, s.getDispute))
	handle("POST", "/webhooks", s.authed(domain.ScopeBilling, s.idempotent(s.createWebhook)))
	handle("GET", "/webhooks", s.authed(domain.ScopeUsageRead, s.listWebhooks))
	handle("DELETE", "/webhooks/{id}", s.authed(domain.ScopeBilling, s.deleteWebhook))
	handle("POST", "/webhooks/{id}/test", s.authed(domain.ScopeBilling, s.idempotent(s.testWebhook)))
	handle("GET", "/webhooks/{id}/deliveries", s.authed(domain.ScopeUsageRead, s.webhookDeliveries))
	handle("GET", "/keys", s.authed(domain.ScopeKeysWrite, s.listKeys))
	handle("POST", "/keys", s.authed(domain.ScopeKeysWrite, s.idempotent(s.createKey)))
	handle("PATCH", "/keys/{id}", s.authed(domain.ScopeKeysWrite, s.updateKey))
	handle("DELETE", "/keys/{id}", s.authed(domain.ScopeKeysWrite, s.revokeKey))
	handle("POST", "/keys/{id}/rotate", s.authed(domain.ScopeKeysWrite, s.idempotent(s.rotateKey)))

	handle("GET", "/engines", s.engines)
	handle("GET", "/price", s.authed(domain.ScopeEval, s.price))
	handle("POST", "/batch", s.authed(domain.ScopeJobs, s.batch)) // idempotent inside SubmitJob
	handle("POST", "/analyze", s.authed(domain.ScopeJobs, s.analyze))
	handle("GET", "/jobs", s.authed(domain.ScopeJobs, s.listJobs))
	handle("GET", "/jobs/{id}", s.authed(domain.ScopeJobs, s.getJob))
	handle("DELETE", "/jobs/{id}", s.authed(domain.ScopeJobs, s.cancelJob))
	handle("GET", "/jobs/{id}/result", s.authed(domain.ScopeJobs, s.jobResult))
	handle("GET", "/jobs/{id}/events", s.authed(domain.ScopeJobs, s.jobEvents))
	handle("POST", "/validate", s.authed(domain.ScopeEval, s.idempotent(s.validate)))
	handle("POST", "/legal-moves", s.authed(domain.ScopeEval, s.idempotent(s.legalMoves)))
	declareRoutes(root, declaredOf)
	// Only the router knows which route took a request: it tells the middleware's box
	// (runs for matched routes only).
	root.Use(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if unclean(w, r) {
				return
			}
			if box, _ := r.Context().Value(ctxRoute).(*string); box != nil {
				if t, err := mux.CurrentRoute(r).GetPathTemplate(); err == nil {
					*box = t
				}
			}
			next.ServeHTTP(w, r)
		})
	})
	s.router = root
}

// uncleanPath says whether path (decoded) holds an empty, . or .. segment, a trailing
// slash aside.
func uncleanPath(path string) bool {
	path = strings.TrimSuffix(strings.TrimPrefix(path, "/"), "/")
	for seg := range strings.SplitSeq(path, "/") { // no slice: it runs on every request
		if seg == "" || seg == "." || seg == ".." {
			return path != "" // the root, /, is clean
		}
	}
	return false
}

// allowedMethods lists the methods the router would accept for r's path.
func allowedMethods(router *mux.Router, r *http.Request) []string {
	var out []string
	for _, m := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"} {
		probe := r.Clone(r.Context())
		probe.Method = m
		var match mux.RouteMatch
		if router.Match(probe, &match) && match.MatchErr == nil {
			out = append(out, m)
		}
	}
	return out
}

// middleware: request id, panic recovery, body limit, the door's checks, an access
// log line and the request's metrics.
func (s *Server) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		// one usable id, else a generated one: neither of two ids sent is taken
		var id string
		if v := r.Header["X-Request-Id"]; len(v) == 1 && validRequestID(v[0]) {
			id = v[0]
		} else {
			id = newRequestID()
		}
		w.Header().Set("X-Request-Id", id)
		ctx := context.WithValue(r.Context(), ctxRequestID, id)
		ctx = context.WithValue(ctx, ctxPrincipal, &principalBox{})
		route := "unmatched" // the router names it (routes)
		ctx = context.WithValue(ctx, ctxRoute, &route)
		r = r.WithContext(ctx)
		r.Body = http.MaxBytesReader(w, r.Body, s.maxBody)
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				s.logger.ErrorContext(ctx, "panic", "request_id", id, "panic", p, "stack", string(debug.Stack()))
				if !rec.wrote {
					s.writeError(rec, r, errors.New("panic"))
				}
			}
			if s.logger.Enabled(ctx, slog.LevelInfo) { // else the line's attributes are garbage made for nothing
				attrs := []slog.Attr{slog.String("request_id", id), slog.String("method", r.Method),
					slog.String("path", r.URL.Path), slog.Int("status", rec.status),
					slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000)}
				if k := principal(r.Context()); k != nil {
					attrs = append(attrs, slog.String("key_id", k.ID()))
				}
				s.logger.LogAttrs(ctx, slog.LevelInfo, "request", attrs...)
			}
			if s.observe != nil {
				s.observe(route, r.Method, rec.status, time.Since(start))
			}
		}()
		if err := door(r); err != nil {
			s.writeError(rec, r, err)
			return
		}
		next.ServeHTTP(rec, r)
	})
}

type statusRecorder struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (r *statusRecorder) WriteHeader(code int) {
	if !r.wrote {
		r.status, r.wrote = code, true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	r.wrote = true
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (flush, deadlines).
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

type ctxKey int

const (
	ctxRequestID ctxKey = iota
	ctxPrincipal
	ctxRoute // *string: the matched route's template, for the metrics
)

func requestID(ctx context.Context) string {
	id, _ := ctx.Value(ctxRequestID).(string)
	return id
}

// principal is the authenticated key of the request, nil when keyless.
func principal(ctx context.Context) *domain.Key {
	k, _ := ctx.Value(ctxPrincipal).(*principalBox)
	if k == nil {
		return nil
	}
	return k.key
}

// principalBox is set by the router before authentication so the access log, which
// runs outside, can read the key the handler authenticated.
type principalBox struct {
	key     *domain.Key
	account *domain.Account
}

// account is the authenticated key's account, nil when keyless.
func account(ctx context.Context) *domain.Account {
	k, _ := ctx.Value(ctxPrincipal).(*principalBox)
	if k == nil {
		return nil
	}
	return k.account
}

func validRequestID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
			return false
		}
	}
	return true
}

func newRequestID() string {
	b := make([]byte, 12)
	rand.Read(b) //nolint:errcheck // crypto/rand does not fail on Linux
	return "req_" + hex.EncodeToString(b)
}

func pathVar(r *http.Request, name string) string { return mux.Vars(r)[name] }

func (s *Server) actor(r *http.Request) commands.Actor {
	return commands.Actor{Key: principal(r.Context()), RequestID: requestID(r.Context())}
}
