package httpapi_test

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/httpapi"
)

// GET /health: ok on a healthy service; degraded, naming the projection, once an event
// is set aside (appended below the HTTP layer: an account name with a NUL, which
// PostgreSQL refuses in text); a 503 problem when PostgreSQL is out of reach.
func TestHealthShowsSetAsideEvents(t *testing.T) {
	e := newEnv(t, withWorkers(0))
	e.signup("health@example.com")
	projection := func(r response, name string) map[string]any {
		t.Helper()
		checks, _ := r.Body["checks"].(map[string]any)
		ps, _ := checks["projections"].(map[string]any)
		p, _ := ps[name].(map[string]any)
		if p == nil {
			t.Fatalf("no projection %s in %s", name, r.Raw)
		}
		return p
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := e.do("GET", "/v1/health", "", nil)
		if r.Status != 200 || r.Body["status"] != "ok" {
			t.Fatalf("health of a healthy service: %d %s", r.Status, r.Raw)
		}
		for _, name := range []string{"accounts_v1", "ledger_v1", "jobs_v1", "disputes_v1"} { // every one chessd serve runs
			projection(r, name)
		}
		if projection(r, "accounts_v1")["lag"] == float64(0) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the accounts projection never caught up: %s", r.Raw)
		}
		time.Sleep(10 * time.Millisecond)
	}

	_, err := eventstore.NewStore(e.pool, nil).Transact(context.Background(), func(ctx context.Context, tx *eventstore.Tx) error {
		return tx.Append(ctx, domain.AccountStream("acct_nul"), domain.StreamAccount, 0, eventstore.Metadata{},
			eventstore.New{Type: "AccountCreated", Payload: &domain.AccountCreated{AccountID: "acct_nul", Email: "nul@example.com",
				Name: "\x00", Plan: "free", CreatedAt: time.Now().UTC()}})
	})
	if err != nil {
		t.Fatal(err)
	}
	e.signup("after@example.com")
	for {
		r := e.do("GET", "/v1/health", "", nil)
		p := projection(r, "accounts_v1")
		if r.Status == 200 && r.Body["status"] == "degraded" && p["status"] == "degraded" && p["set_aside"] == float64(1) && p["lag"] == float64(0) {
			if l := projection(r, "ledger_v1"); l["status"] != "ok" || l["set_aside"] != float64(0) {
				t.Fatalf("another projection is reported degraded: %s", r.Raw)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health never showed the set-aside event: %s", r.Raw)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r := e.do("GET", "/v1/healthz", "", nil); r.Status != 200 {
		t.Fatalf("healthz: %d", r.Status)
	}

	// Nothing listens on port 1.
	pool, err := pgxpool.New(context.Background(), "postgres://chessd@127.0.0.1:1/chessd?sslmode=disable&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	srv := httptest.NewServer(checkedAgainstOpenAPI(t, httpapi.New(httpapi.Config{BaseURL: "http://chessd.test/v1"},
		httpapi.Deps{Pool: pool, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})))
	defer srv.Close()
	down := &env{t: t, srv: srv}
	r := down.do("GET", "/v1/health", "", nil)
	wantProblem(t, r, 503, "retry_after")
	if r.Header.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
}

// A server whose database a newer chessd migrated steps aside: not ready, and health
// names the migrations it does not know.
func TestNewerSchemaIsNotReady(t *testing.T) {
	e := newEnv(t, withWorkers(0))
	if r := e.do("GET", "/v1/readyz", "", nil); r.Status != 200 {
		t.Fatalf("readyz: %d %s", r.Status, r.Raw)
	}
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO schema_migrations (name) VALUES ('9999_from_the_future.sql')`); err != nil {
		t.Fatal(err)
	}
	if r := e.do("GET", "/v1/readyz", "", nil); r.Status != 503 || !strings.Contains(r.Raw, "migrations newer") {
		t.Fatalf("readyz on a newer schema: %d %s, want 503 naming it", r.Status, r.Raw)
	}
	r := e.do("GET", "/v1/health", "", nil)
	m, _ := r.Body["checks"].(map[string]any)["migrations"].(map[string]any)
	if r.Status != 200 || r.Body["status"] != "degraded" || m["status"] != "newer" ||
		!reflect.DeepEqual(m["newer"], []any{"9999_from_the_future.sql"}) {
		t.Fatalf("health on a newer schema: %d %s", r.Status, r.Raw)
	}
}
