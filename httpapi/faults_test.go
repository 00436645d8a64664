package httpapi_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"chessd/postgres/pgtest"
)

// proxiedEnv is an env whose every database connection goes through a fault-injecting
// proxy.
func proxiedEnv(t *testing.T, opts ...envOption) (*env, *pgtest.Proxy) {
	t.Helper()
	proxy, url := pgtest.NewProxy(t, pgtest.URL(t))
	return newEnv(t, append(opts, onPool(pgtest.NewDBAt(t, url)))...), proxy
}

const faultFEN = "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"

// charges counts the charges on a key in the log, of one endpoint or ("") all: a
// UnitsCharged each, and each line of a ChargesSettled.
func (e *env) charges(keyID, endpoint string) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM events e
		LEFT JOIN LATERAL json_array_elements(CASE WHEN e.event_type = 'ChargesSettled' THEN e.payload->'lines' ELSE json_build_array(e.payload) END) l ON true
		WHERE e.stream_id = $1 AND e.event_type <> 'UnitsCredited' AND $2 IN ('', l->>'endpoint')`,
		"ledger-"+keyID, endpoint).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// wantUnavailable checks a 503 retry_after with a Retry-After in seconds.
func wantUnavailable(t *testing.T, what string, r response) {
	t.Helper()
	if r.Status != 503 {
		t.Fatalf("%s: status %d, want 503: %s", what, r.Status, r.Raw)
	}
	wantProblem(t, r, 503, "retry_after")
	if s, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || s < 1 {
		t.Fatalf("%s: Retry-After %q", what, r.Header.Get("Retry-After"))
	}
}

// With PostgreSQL out of reach, every endpoint that needs it answers 503 retry_after
// with Retry-After (never 500), /readyz says not ready, and when it is back the service
// heals with no restart: requests, the ledger, the projections and the executor work.
func TestDatabaseAwayAnswers503AndHeals(t *testing.T) {
	e, proxy := proxiedEnv(t)
	key, keyID := e.signup("away@example.com")
	evalBody := map[string]any{"fen": faultFEN, "depth": 6}
	if r := e.do("POST", "/v1/eval", key, evalBody); r.Status != 200 {
		t.Fatalf("eval: %d %s", r.Status, r.Raw)
	}
	calls := []struct {
		method, path string
		keyed        bool
		body         any
		fromMemory   bool // may be answered without the database
	}{
		{"GET", "/v1/me", true, nil, false},
		{"GET", "/v1/keys", true, nil, false},
		{"POST", "/v1/keys", true, map[string]any{"label": "during"}, false},
		{"GET", "/v1/usage", true, nil, false},
		{"POST", "/v1/signup", false, map[string]string{"email": "during@example.com"}, false},
		// cached in memory, authenticated from memory, its units perhaps already
		// reserved: answered now and charged once the database is back, or 503
		{"POST", "/v1/eval", true, evalBody, true},
		{"POST", "/v1/batch", true, map[string]any{"fens": []string{faultFEN}, "depth": 6}, false},
		{"GET", "/v1/jobs/job_unknown", true, nil, false},
		{"GET", "/v1/readyz", false, nil, false},
		{"GET", "/v1/health", false, nil, false},
	}
	ctx := context.Background()
	if err := e.meter.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	evals := e.charges(keyID, "eval")
	proxy.Down()
	for _, c := range calls {
		k := ""
		if c.keyed {
			k = key
		}
		r := e.do(c.method, c.path, k, c.body)
		if c.fromMemory && r.Status == 200 {
			evals++
			continue
		}
		wantUnavailable(t, c.method+" "+c.path, r)
	}

	proxy.Up()
	deadline := time.Now().Add(30 * time.Second)
	for e.do("GET", "/v1/readyz", "", nil).Status != 200 {
		if time.Now().After(deadline) {
			t.Fatal("not ready after the database came back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, c := range calls {
		k := ""
		if c.keyed {
			k = key
		}
		if r := e.do(c.method, c.path, k, c.body); r.Status >= 500 || (r.Status >= 400 && c.path != "/v1/jobs/job_unknown") {
			t.Fatalf("%s %s after the database came back: %d %s", c.method, c.path, r.Status, r.Raw)
		}
	}
	evals++
	if err := e.meter.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.charges(keyID, "eval"); got != evals {
		t.Fatalf("%d evals charged, %d answered", got, evals)
	}
	// the projections heal (a subscriber whose transaction died with the connection may
	// take its ack deadline to start over): a key created now gets listed
	_, newKeyID := e.createKey(key, map[string]any{"label": "after"})
	deadline = time.Now().Add(30 * time.Second)
	for r := e.do("GET", "/v1/keys", key, nil); !strings.Contains(r.Raw, newKeyID); r = e.do("GET", "/v1/keys", key, nil) {
		if time.Now().After(deadline) {
			t.Fatalf("GET /keys does not list the key created after the outage: %s", r.Raw)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// the executor heals: a job finishes
	r := e.do("POST", "/v1/batch", key, map[string]any{"fens": []string{faultFEN}, "depth": 6})
	if r.Status != 202 {
		t.Fatalf("batch: %d %s", r.Status, r.Raw)
	}
	if job := e.waitJob(key, r.Body["job_id"].(string), finished); job["state"] != "succeeded" {
		t.Fatalf("job after the outage: %v", job)
	}
}

// When the connection drops once the COMMIT of a call's charge may have been sent, the
// ledger finds out whether it committed rather than guessing: the call is charged
// exactly once either way (a commit that did not happen is made again, one that did is
// not repeated), and a retry with the same Idempotency-Key gets the stored answer.
// Both ways of committing charges are cut: the one-round-trip fast path of a warm
// settler (the only writer that sends advance_chain), and the pipelined one of a cold
// settler.
func TestChargeWithUnknownCommitOutcome(t *testing.T) {
	for _, tc := range []struct {
		name   string
		warm   bool   // one charge first, so the next goes the fast way
		marker string // a statement only that path sends
		mode   pgtest.CutMode
	}{
		{"fast, committed", true, "advance_chain", pgtest.AfterCommit},
		{"fast, not committed", true, "advance_chain", pgtest.BeforeCommit},
		{"pipelined, committed", false, "meter_settle", pgtest.AfterCommit},
		{"pipelined, not committed", false, "meter_settle", pgtest.BeforeCommit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, proxy := proxiedEnv(t, withWorkers(0))
			ctx := context.Background()
			key, keyID := e.signup("cut@example.com")
			if tc.warm {
				if r := e.do("POST", "/v1/eval", key, map[string]any{"fen": faultFEN, "depth": 6}); r.Status != 200 {
					t.Fatalf("warm-up eval: %d %s", r.Status, r.Raw)
				}
				if err := e.meter.Flush(ctx); err != nil {
					t.Fatal(err)
				}
			}
			before := e.charges(keyID, "eval")
			cut := proxy.CutCommit(tc.marker, tc.mode)
			eval := func() response {
				req, _ := http.NewRequest("POST", e.srv.URL+"/v1/eval", strings.NewReader(`{"fen":"`+faultFEN+`","depth":6}`))
				req.Header.Set("Authorization", "Bearer "+key)
				req.Header.Set("Idempotency-Key", "cut-1")
				return e.send(req)
			}
			r := eval()
			if r.Status != 200 || r.Body["bestmove"] == nil || r.Body["cost_units"] == float64(0) {
				t.Fatalf("eval: %d %s", r.Status, r.Raw)
			}
			if err := e.meter.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case <-cut:
			default:
				t.Fatal("the connection was not cut")
			}
			if n := e.charges(keyID, "eval"); n != before+1 {
				t.Fatalf("%d charges after one call, want %d", n, before+1)
			}
			again := eval()
			if again.Status != 200 || again.Raw != r.Raw {
				t.Fatalf("retry with the same Idempotency-Key: %d %s, want the first answer %s", again.Status, again.Raw, r.Raw)
			}
			if err := e.meter.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if n := e.charges(keyID, "eval"); n != before+1 {
				t.Fatalf("%d charges after the retry, want %d", n, before+1)
			}
		})
	}
}

// A connection dropped while a job records a position does not fail the job: the
// executor retries, and each position is recorded and charged once.
func TestJobSurvivesDroppedConnection(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode pgtest.CutMode
	}{
		{"commit lost", pgtest.BeforeCommit},
		{"commit done, answer lost", pgtest.AfterCommit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, proxy := proxiedEnv(t)
			key, keyID := e.signup("job-cut@example.com")
			cut := proxy.CutCommit("$8, false)", tc.mode) // the job recorder's meter_settle
			fens := jobFENs(4)
			r := e.do("POST", "/v1/batch", key, map[string]any{"fens": fens, "depth": 6})
			if r.Status != 202 {
				t.Fatalf("batch: %d %s", r.Status, r.Raw)
			}
			id := r.Body["job_id"].(string)
			job := e.waitJob(key, id, finished)
			select { // after a commit the proxy cuts once the server has answered: others may see the commit first
			case <-cut:
			case <-time.After(10 * time.Second):
				t.Fatal("the connection was not cut")
			}
			if job["state"] != "succeeded" {
				t.Fatalf("job %s after a dropped connection: %v", job["state"], job["error"])
			}
			if n := e.charges(keyID, ""); n != len(fens) {
				t.Fatalf("%d charges for %d positions", n, len(fens))
			}
			e.checkJobBooks(t, key, id)
		})
	}
}

// sseToClose reads a job's event stream until the server closes it (a test deadline
// guards against one that never does) and returns the status and the event ids.
func sseToClose(t *testing.T, e *env, key, id, lastID string) (int, []string) {
	t.Helper()
	res := openSSE(t, e, key, id, lastID, 30*time.Second)
	defer res.Body.Close()
	var ids []string
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "id: "); ok {
			ids = append(ids, v)
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("events with Last-Event-ID %q: the stream did not end (%v); got %v", lastID, err, ids)
	}
	return res.StatusCode, ids
}

// A finished job's stream sends what remains and closes; a reconnect with nothing left
// to send (at or past the last event) answers 204, which stops an EventSource.
func TestFinishedJobStreamEnds(t *testing.T) {
	e := newEnv(t)
	key, _ := e.signup("sse-end@example.com")
	r := e.do("POST", "/v1/batch", key, map[string]any{"fens": jobFENs(2), "depth": 6})
	id := r.Body["job_id"].(string)
	e.waitJob(key, id, finished)
	status, all := sseToClose(t, e, key, id, "")
	if status != 200 || len(all) < 3 {
		t.Fatalf("whole stream: %d %v", status, all)
	}
	last, _ := strconv.Atoi(all[len(all)-1])
	for _, tc := range []struct {
		lastID     int
		wantStatus int
		wantIDs    int
	}{
		{last - 2, 200, 2},
		{last - 1, 200, 1},
		{last, 204, 0},
		{last + 100, 204, 0},
		{math.MaxInt32 + 1, 204, 0}, // past the stream's 32-bit sequence: a 500 before
		{math.MaxInt64, 204, 0},
	} {
		status, ids := sseToClose(t, e, key, id, strconv.Itoa(tc.lastID))
		if status != tc.wantStatus || len(ids) != tc.wantIDs {
			t.Fatalf("Last-Event-ID %d: %d with %v, want %d with %d events", tc.lastID, status, ids, tc.wantStatus, tc.wantIDs)
		}
	}
}
