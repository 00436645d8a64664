package webhook_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/postgres/pgtest"
	"chessd/syncbuf"
	"chessd/webhook"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func testSecrets(t *testing.T) *webhook.Secrets {
	t.Helper()
	s, err := webhook.NewSecrets([]byte("webhook test pepper"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// hook is a registered endpoint of its own account.
type hook struct{ id, account string }

var accounts atomic.Int64

// register registers url for a new account, insecure (http, private addresses).
func register(t *testing.T, pool *pgxpool.Pool, secrets *webhook.Secrets, url string) hook {
	t.Helper()
	account := fmt.Sprintf("acct_%d", accounts.Add(1))
	e, err := webhook.Create(context.Background(), pool, secrets, account, "live", url, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	return hook{id: e.ID, account: account}
}

// queue queues n deliveries to h (Enqueue, so the test pings' cap does not apply).
func queue(t *testing.T, pool *pgxpool.Pool, h hook, n int) {
	t.Helper()
	for i := range n {
		if _, err := webhook.Enqueue(context.Background(), pool, h.account, "live", h.id, "ping", map[string]int{"n": i}); err != nil {
			t.Fatal(err)
		}
	}
}

// run runs a sender until the test ends, then waits for its Run to return.
func run(t *testing.T, pool *pgxpool.Pool, cfg webhook.Config) {
	t.Helper()
	runLogged(t, pool, cfg, slog.New(slog.DiscardHandler))
}

// runLogged is run with the sender logging to logger.
func runLogged(t *testing.T, pool *pgxpool.Pool, cfg webhook.Config, logger *slog.Logger) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { webhook.NewSender(cfg, pool, logger).Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// receiver counts the requests it gets, the most it held at once, and when each came.
// indexedHooks serves /hooks/<i> for i below n, each with a receiver of its own that
// counts its requests while answer runs.
func indexedHooks(t *testing.T, n int, answer func(i int, w http.ResponseWriter)) (*httptest.Server, []*receiver) {
	t.Helper()
	recs := make([]*receiver, n)
	for i := range recs {
		recs[i] = &receiver{}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var i int
		if _, err := fmt.Sscanf(r.URL.Path, "/hooks/%d", &i); err != nil || i < 0 || i >= n {
			t.Errorf("request for %s", r.URL.Path)
			return
		}
		recs[i].begin()
		defer recs[i].end()
		answer(i, w)
	}))
	t.Cleanup(srv.Close)
	return srv, recs
}

type receiver struct {
	mu           sync.Mutex
	got, now, hi int
	at           []time.Time
}

func (r *receiver) begin() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got, r.now = r.got+1, r.now+1
	r.hi = max(r.hi, r.now)
	r.at = append(r.at, time.Now())
}

func (r *receiver) end() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.now--
}

func (r *receiver) stats() (got, hi int, at []time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got, r.hi, append([]time.Time(nil), r.at...)
}

// serve starts an endpoint answering status, or never answering when status is 0 (the
// sender's timeout ends each try).
func serve(t *testing.T, status int) (*receiver, string) {
	t.Helper()
	rec := &receiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.begin()
		defer rec.end()
		io.Copy(io.Discard, r.Body) //nolint:errcheck // read whole, so the server notices the client hang up
		if status == 0 {
			<-r.Context().Done()
			return
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return rec, srv.URL + "/hooks"
}

// count is a count of deliveries matching where (with $1 the endpoint).
func count(t *testing.T, pool *pgxpool.Pool, where string, endpointIDs ...string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM webhook_deliveries
		WHERE endpoint_id = ANY ($1) AND `+where, endpointIDs).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Endpoints that never answer, each with a backlog, do not hold back a healthy one:
// each has one try under way at a time, and once their tries have failed they share
// half the slots, so the healthy endpoint's deliveries go out while most of the
// backlog is still untried. (Claimed ten at a time, endpoints in turn, and each batch
// waited for its slowest try: the healthy deliveries went after all fifty slow tries.)
func TestDeadEndpointsDoNotHoldBackAHealthyOne(t *testing.T) {
	pool := pgtest.NewDB(t)
	secrets := testSecrets(t)
	const dead, backlog = 10, 5
	var deadIDs []string
	var deadRecs []*receiver
	for range dead {
		rec, url := serve(t, 0)
		h := register(t, pool, secrets, url)
		queue(t, pool, h, backlog)
		deadIDs, deadRecs = append(deadIDs, h.id), append(deadRecs, rec)
	}
	run(t, pool, webhook.Config{AllowPrivate: true, Timeout: time.Second, RetryBase: time.Hour, Poll: 50 * time.Millisecond, Secrets: secrets})
	pgtest.WaitFor(t, "every dead endpoint's first try", func() bool {
		for _, rec := range deadRecs {
			if got, _, _ := rec.stats(); got == 0 {
				return false
			}
		}
		return true
	})

	healthy, url := serve(t, http.StatusNoContent)
	h := register(t, pool, secrets, url)
	queue(t, pool, h, backlog)
	pgtest.WaitFor(t, "the healthy endpoint's deliveries", func() bool {
		return count(t, pool, "delivered_at IS NOT NULL", h.id) == backlog
	})
	if untried := count(t, pool, "attempts = 0", deadIDs...); untried < dead*backlog/2 {
		t.Errorf("only %d of the dead endpoints' %d deliveries were still untried when the healthy endpoint's were delivered", untried, dead*backlog)
	}
	if got, _, _ := healthy.stats(); got != backlog {
		t.Errorf("the healthy endpoint got %d requests, want %d", got, backlog)
	}
	for i, rec := range deadRecs {
		if _, hi, _ := rec.stats(); hi > 1 {
			t.Errorf("dead endpoint %d had %d tries under way at once, want at most 1", i, hi)
		}
	}
}

// A failing endpoint's retries come after RetryBase, doubled each time, whatever the
// poll (5 s by default) and an endpoint that never answers beside it (which held each batch, and so
// every retry, for its timeout).
func TestRetriesKeepTheirSpacing(t *testing.T) {
	pool := pgtest.NewDB(t)
	secrets := testSecrets(t)
	_, deadURL := serve(t, 0)
	queue(t, pool, register(t, pool, secrets, deadURL), 5)
	failing, url := serve(t, http.StatusInternalServerError)
	h := register(t, pool, secrets, url)
	queue(t, pool, h, 1)
	const base, attempts = 100 * time.Millisecond, 5
	run(t, pool, webhook.Config{AllowPrivate: true, Timeout: 2 * time.Second, RetryBase: base, MaxAttempts: attempts, Secrets: secrets})
	pgtest.WaitFor(t, "the failing endpoint's delivery to fail", func() bool {
		return count(t, pool, "failed_at IS NOT NULL", h.id) == 1
	})
	got, _, at := failing.stats()
	if got != attempts {
		t.Fatalf("the failing endpoint got %d tries, want %d", got, attempts)
	}
	for i := 1; i < len(at); i++ {
		want := base << (i - 1)
		if gap := at[i].Sub(at[i-1]); gap < want-10*time.Millisecond || gap > want+400*time.Millisecond {
			t.Errorf("try %d came %v after try %d, want %v", i+1, gap, i, want)
		}
	}
}

// A deleted endpoint gets no more tries: DELETE ends its pending deliveries ("endpoint
// deleted"), even one whose try is under way, whose failure then records nothing over
// it, and the claim skips a deleted endpoint's deliveries (those an older server's
// DELETE left pending). It kept getting them: the claim did not look at deleted_at.
func TestDeletedEndpointGetsNoMoreTries(t *testing.T) {
	deleteEndpoint := func(t *testing.T, pool *pgxpool.Pool, h hook) {
		if err := webhook.Delete(context.Background(), pool, h.account, "live", h.id); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name      string
		midTry    bool // deleted while the first try is under way, not once it is recorded
		delete    func(*testing.T, *pgxpool.Pool, hook)
		wantError string // the delivery's last_error then; "" when it stays pending
	}{
		{"deleted after a failed try", false, deleteEndpoint, "endpoint deleted"},
		{"deleted during a try", true, deleteEndpoint, "endpoint deleted"},
		{"deleted by an older server", false, func(t *testing.T, pool *pgxpool.Pool, h hook) {
			if _, err := pool.Exec(context.Background(), `UPDATE webhook_endpoints SET deleted_at = now() WHERE endpoint_id = $1`, h.id); err != nil {
				t.Fatal(err)
			}
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := pgtest.NewDB(t)
			secrets := testSecrets(t)
			rec := &receiver{}
			arrived, release := make(chan struct{}, 8), make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				rec.begin()
				defer rec.end()
				arrived <- struct{}{}
				if tc.midTry {
					<-release
				}
				w.WriteHeader(http.StatusInternalServerError)
			}))
			t.Cleanup(srv.Close)
			h := register(t, pool, secrets, srv.URL+"/hooks")
			queue(t, pool, h, 1)
			// another endpoint failing alike: its tries tell the time of the deleted one's retries
			control, url := serve(t, http.StatusInternalServerError)
			queue(t, pool, register(t, pool, secrets, url), 1)
			run(t, pool, webhook.Config{AllowPrivate: true, RetryBase: 300 * time.Millisecond, Poll: 50 * time.Millisecond, Secrets: secrets})

			pgtest.Within(t, "the first try", arrived)
			if !tc.midTry {
				pgtest.WaitFor(t, "the first try's failure recorded", func() bool {
					return count(t, pool, "last_status = 500", h.id) == 1
				})
			}
			tc.delete(t, pool, h)
			close(release)
			pgtest.WaitFor(t, "three tries of the other endpoint", func() bool {
				got, _, _ := control.stats()
				return got >= 3
			})
			if got, _, _ := rec.stats(); got != 1 {
				t.Errorf("the deleted endpoint got %d tries, want 1", got)
			}
			var attempts int
			var lastError string
			var pending bool
			if err := pool.QueryRow(context.Background(), `SELECT attempts, coalesce(last_error, ''), failed_at IS NULL AND delivered_at IS NULL
				FROM webhook_deliveries WHERE endpoint_id = $1`, h.id).Scan(&attempts, &lastError, &pending); err != nil {
				t.Fatal(err)
			}
			if attempts != 1 || pending != (tc.wantError == "") || tc.wantError != "" && lastError != tc.wantError {
				t.Errorf("the delivery: %d attempts, pending %v, last_error %v; want 1 attempt and last_error %q", attempts, pending, lastError, tc.wantError)
			}
		})
	}
}

// A delivery refused for its endpoint's address (a name resolving to a loopback or
// private one) records why without naming the address: the log is the customer's, and
// told them what the name resolves to inside our network ("dial tcp 127.0.0.1:…").
func TestRefusedAddressIsNotLogged(t *testing.T) {
	pool := pgtest.NewDB(t)
	secrets := testSecrets(t)
	rec, url := serve(t, http.StatusNoContent)
	h := register(t, pool, secrets, strings.Replace(url, "127.0.0.1", "localhost", 1))
	queue(t, pool, h, 1)
	run(t, pool, webhook.Config{AllowPrivate: false, Poll: 50 * time.Millisecond, Secrets: secrets})
	var lastError string
	pgtest.WaitFor(t, "the try's failure recorded", func() bool {
		err := pool.QueryRow(context.Background(), `SELECT last_error FROM webhook_deliveries
			WHERE endpoint_id = $1 AND last_error IS NOT NULL`, h.id).Scan(&lastError)
		return err == nil
	})
	if !strings.Contains(lastError, "not public") || regexp.MustCompile(`\d+\.\d+\.\d+\.\d+|::|:\d+`).MatchString(lastError) {
		t.Errorf("last_error %q: want the refusal, naming no address", lastError)
	}
	if got, _, _ := rec.stats(); got != 0 {
		t.Errorf("the private address got %d requests", got)
	}
}

// A delivery queued as its endpoint is being deleted ends with the others: the Delete
// waits for the queueing transaction, then ends what it queued. It stayed pending for
// ever (never sent: the claim skips deleted endpoints), because Delete's one statement
// neither waited for the queueing nor saw its delivery.
func TestDeleteEndsADeliveryQueuedMeanwhile(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	h := register(t, pool, testSecrets(t), "http://127.0.0.1:9/hooks")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := webhook.Enqueue(ctx, tx, h.account, "live", "", "budget.threshold", map[string]int{"n": 1}); err != nil {
		t.Fatal(err)
	}
	deleted := make(chan error, 1)
	go func() { deleted <- webhook.Delete(ctx, pool, h.account, "live", h.id) }()
	// the Delete waits for the queueing transaction's hold on the endpoint's row
	pgtest.WaitFor(t, "the Delete to wait for the queueing", func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND datname = current_database())`).Scan(&waiting)
		return err == nil && waiting
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, "delivered_at IS NULL AND failed_at IS NULL", h.id); n != 0 {
		t.Fatalf("%d deliveries of the deleted endpoint still pending", n)
	}
	if n := count(t, pool, "last_error = 'endpoint deleted'", h.id); n != 1 {
		t.Fatalf("%d deliveries ended by the Delete, want the one queued meanwhile", n)
	}
}

// A failed try records what failed, in words that name no address or port (the
// error's text named our side of the connection, and a DNS error our resolver: GET
// /webhooks/{id}/deliveries shows last_error to the customer), and the server's log
// keeps the error whole. Each endpoint here fails a way of its own, for real.
func TestFailuresNameNoAddress(t *testing.T) {
	pool := pgtest.NewDB(t)
	secrets := testSecrets(t)
	closed := func(t *testing.T) string { // a port nothing listens on any more
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln.Close()
		return "http://" + ln.Addr().String() + "/hooks"
	}
	hangUp := func(t *testing.T) string { // reads the request, closes without an answer
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body) //nolint:errcheck // read whole before hanging up
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
		}))
		t.Cleanup(srv.Close)
		return srv.URL + "/hooks"
	}
	selfSigned := func(t *testing.T) string {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake the sender refuses
		srv.StartTLS()
		t.Cleanup(srv.Close)
		return srv.URL + "/hooks"
	}
	plainOnHTTPS := func(t *testing.T) string {
		_, url := serve(t, http.StatusNoContent)
		return strings.Replace(url, "http://", "https://", 1)
	}
	silent := func(t *testing.T) string { _, url := serve(t, 0); return url }
	unavailable := func(t *testing.T) string { _, url := serve(t, http.StatusServiceUnavailable); return url }
	cases := []struct {
		name   string
		url    func(*testing.T) string
		want   string
		logged string // in the server's log line for the try; "" when none is logged
		hook   hook
	}{
		{name: "refused", url: closed, want: "connection refused: nothing listens at the endpoint's address and port", logged: "connect: connection refused"},
		{name: "hung up", url: hangUp, want: "the endpoint closed the connection without answering", logged: "EOF"},
		{name: "self-signed", url: selfSigned, want: "TLS certificate error: the endpoint's certificate is signed by an unknown authority", logged: "certificate signed by unknown authority"},
		{name: "plain HTTP", url: plainOnHTTPS, want: "TLS handshake failed: the endpoint does not speak TLS (plain HTTP on an https URL?)", logged: "HTTP response to HTTPS client"},
		{name: "silent", url: silent, want: "timed out: no answer within 1s", logged: "Client.Timeout exceeded"},
		{name: "an answer", url: unavailable, want: "HTTP 503"},
	}
	var ids []string
	for i := range cases {
		cases[i].hook = register(t, pool, secrets, cases[i].url(t))
		queue(t, pool, cases[i].hook, 1)
		ids = append(ids, cases[i].hook.id)
	}
	var logs syncbuf.Buffer
	runLogged(t, pool, webhook.Config{AllowPrivate: true, Timeout: time.Second, RetryBase: time.Hour, Poll: 50 * time.Millisecond, Secrets: secrets},
		slog.New(slog.NewTextHandler(&logs, nil)))
	pgtest.WaitFor(t, "every endpoint's first try recorded", func() bool {
		return count(t, pool, "last_error IS NOT NULL", ids...) == len(ids)
	})
	address := regexp.MustCompile(`\d+\.\d+\.\d+\.\d+|::|:\d+`)
	for _, tc := range cases {
		var lastError string
		if err := pool.QueryRow(context.Background(), `SELECT last_error FROM webhook_deliveries WHERE endpoint_id = $1`, tc.hook.id).Scan(&lastError); err != nil {
			t.Fatal(err)
		}
		if lastError != tc.want || address.MatchString(lastError) {
			t.Errorf("%s: last_error %q, want %q", tc.name, lastError, tc.want)
		}
		line := regexp.MustCompile(`(?m)^.*"webhook try failed".*endpoint_id=` + tc.hook.id + `.*$`).FindString(logs.String())
		switch {
		case tc.logged == "" && line != "":
			t.Errorf("%s: the server logged %q for an answer", tc.name, line)
		case tc.logged != "" && (!strings.Contains(line, tc.logged) || !strings.Contains(line, "127.0.0.1:")):
			t.Errorf("%s: the server's log line is %q, want the error whole (%q, and the address)", tc.name, line, tc.logged)
		}
	}
}

// held is how many of r's requests are under way.
func (r *receiver) held() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.now
}

// Accounts whose endpoints answer slowly, but within the timeout (never failing), do
// not hold back another account's delivery, however large their backlog: one
// account's endpoints hold at most 3 of the 10 slots, and accounts take turns at the
// free ones. The slow answers here wait for the test: two slow accounts hold 6 slots
// and the fast account's delivery goes at once; four hold all 10, and once a slot is
// freed for each slow account at most, it has gone, every other slow delivery still
// waiting. Claimed by oldest due alone, the slow accounts' tries took every slot, and
// their backlog went before the fast delivery queued after it (a review measured
// 41-87 s where 29 ms was usual).
func TestSlowAccountsDoNotHoldBackAnother(t *testing.T) {
	const endpoints, backlog, slots = webhook.MaxEndpoints, 2, 10
	for _, tc := range []struct {
		name        string
		slow        int // accounts whose endpoints answer only when the test says
		held        int // the slots their tries take
		maxReleases int // slow tries ended, at most, before the fast delivery went
	}{
		{"two slow accounts", 2, 6, 0},
		{"four slow accounts", 4, slots, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			pool := pgtest.NewDB(t)
			secrets := testSecrets(t)
			release, stop := make(chan struct{}), make(chan struct{})
			// by slow account: /hooks/<i>
			srv, recs := indexedHooks(t, tc.slow, func(int, http.ResponseWriter) {
				select {
				case <-release:
				case <-stop:
				}
			})
			var slowIDs []string
			for i := range tc.slow {
				account := fmt.Sprintf("acct_%d", accounts.Add(1))
				for range endpoints {
					e, err := webhook.Create(ctx, pool, secrets, account, "live", fmt.Sprintf("%s/hooks/%d", srv.URL, i), true, nil)
					if err != nil {
						t.Fatal(err)
					}
					queue(t, pool, hook{id: e.ID, account: account}, backlog)
					slowIDs = append(slowIDs, e.ID)
				}
			}
			held := func() (n, got int) {
				for _, rec := range recs {
					g, _, _ := rec.stats()
					n, got = n+rec.held(), got+g
				}
				return n, got
			}
			run(t, pool, webhook.Config{AllowPrivate: true, Timeout: time.Minute, Poll: 50 * time.Millisecond, Slots: slots, Secrets: secrets})
			t.Cleanup(func() { close(stop) }) // before the sender's Run is waited for
			pgtest.WaitFor(t, fmt.Sprintf("%d slow tries under way", tc.held), func() bool {
				n, _ := held()
				return n >= tc.held
			})

			fast, url := serve(t, http.StatusNoContent)
			h := register(t, pool, secrets, url)
			queue(t, pool, h, 1)
			delivered := func() bool { return count(t, pool, "delivered_at IS NOT NULL", h.id) == 1 }
			releases := 0
			if tc.maxReleases == 0 {
				pgtest.WaitFor(t, "the fast account's delivery", delivered)
			}
			for !delivered() {
				if releases == tc.maxReleases {
					t.Fatalf("the fast account's delivery is still pending after %d slow tries ended", releases)
				}
				release <- struct{}{}
				releases++
				// the freed slot took the fast delivery, whose try ended, or not; then a slow one
				pgtest.WaitFor(t, "the freed slot taken by a slow try", func() bool {
					n, got := held()
					return n == tc.held && got == tc.held+releases
				})
			}
			if got, _, _ := fast.stats(); got != 1 {
				t.Errorf("the fast endpoint got %d requests, want 1", got)
			}
			if n, got := held(); n != tc.held || got != tc.held+releases {
				t.Errorf("%d slow tries under way of %d, want %d of %d: the slow ones still held", n, got, tc.held, tc.held+releases)
			}
			if n := count(t, pool, "delivered_at IS NOT NULL", slowIDs...); n != releases {
				t.Errorf("%d slow deliveries delivered, want %d (those released)", n, releases)
			}
			for i, rec := range recs {
				if _, hi, _ := rec.stats(); hi > slots*3/10 {
					t.Errorf("slow account %d had %d tries under way at once, want at most %d", i, hi, slots*3/10)
				}
			}
		})
	}
}

// Two servers on one database keep one try under way per endpoint and three per
// account between them: a claim records the try under way in the database, each
// server's claim skips the endpoints and accounts whose tries are under way anywhere,
// and claims of one account made at the same moment follow one another (the two
// servers' first walks, at once, each took an endpoint's room otherwise). Each server
// kept its own count, so two held 6 tries of one account at once, and an endpoint got
// a try from each (a review saw both with endpoints that never answer).
func TestCapsHoldAcrossServers(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	secrets := testSecrets(t)
	const endpoints, backlog, slots = webhook.MaxEndpoints, 3, 10
	all := &receiver{} // the account's tries, at any endpoint
	// by endpoint: /hooks/<i>
	srv, recs := indexedHooks(t, endpoints, func(_ int, w http.ResponseWriter) {
		all.begin()
		defer all.end()
		time.Sleep(200 * time.Millisecond) // slow, within the timeout
		w.WriteHeader(http.StatusNoContent)
	})
	account := fmt.Sprintf("acct_%d", accounts.Add(1))
	var ids []string
	for i := range endpoints {
		e, err := webhook.Create(ctx, pool, secrets, account, "live", fmt.Sprintf("%s/hooks/%d", srv.URL, i), true, nil)
		if err != nil {
			t.Fatal(err)
		}
		queue(t, pool, hook{id: e.ID, account: account}, backlog)
		ids = append(ids, e.ID)
	}
	cfg := webhook.Config{AllowPrivate: true, Timeout: 5 * time.Second, RetryBase: time.Hour, Poll: 20 * time.Millisecond, Slots: slots, Secrets: secrets}
	run(t, pool, cfg)
	run(t, pool, cfg)
	pgtest.WaitFor(t, "every delivery", func() bool {
		return count(t, pool, "delivered_at IS NOT NULL", ids...) == endpoints*backlog
	})
	if got, hi, _ := all.stats(); got != endpoints*backlog || hi != slots*3/10 {
		t.Errorf("the account got %d requests, at most %d at once; want %d, at most %d at once (and that many: the cap is used)", got, hi, endpoints*backlog, slots*3/10)
	}
	for i, rec := range recs {
		if got, hi, _ := rec.stats(); got != backlog || hi > 1 {
			t.Errorf("endpoint %d got %d requests, at most %d at once; want %d, one at a time", i, got, hi, backlog)
		}
	}
}

// A try under way on a server that died holds its endpoint until the claim's lease
// lapses, no longer: the endpoint's next delivery waits for the lease, then goes, and
// the lapsed claim is tried again.
func TestDeadServersClaimHoldsTheEndpointUntilItLapses(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	secrets := testSecrets(t)
	rec, url := serve(t, http.StatusNoContent)
	h := register(t, pool, secrets, url)
	queue(t, pool, h, 2)
	// the first delivery claimed by a server that died: its lease runs a second more
	var lease time.Time
	if err := pool.QueryRow(ctx, `UPDATE webhook_deliveries SET attempts = 1,
			next_attempt_at = now() + interval '1 second', claimed_until = now() + interval '1 second'
		WHERE delivery_id = (SELECT min(delivery_id) FROM webhook_deliveries WHERE endpoint_id = $1)
		RETURNING claimed_until`, h.id).Scan(&lease); err != nil {
		t.Fatal(err)
	}
	run(t, pool, webhook.Config{AllowPrivate: true, Poll: 20 * time.Millisecond, Secrets: secrets})
	time.Sleep(500 * time.Millisecond)
	if got, _, _ := rec.stats(); got != 0 {
		t.Fatalf("the endpoint got %d requests while the dead server's try was under way, want none", got)
	}
	pgtest.WaitFor(t, "both deliveries", func() bool {
		return count(t, pool, "delivered_at IS NOT NULL", h.id) == 2
	})
	var early int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1 AND delivered_at < $2`, h.id, lease).Scan(&early); err != nil || early != 0 {
		t.Errorf("%d deliveries went before the lease lapsed (%v)", early, err)
	}
	if n := count(t, pool, "claimed_until IS NOT NULL", h.id); n != 0 {
		t.Errorf("%d deliveries still claimed once tried", n)
	}
}
