package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/postgres"
	"chessd/projections"
)

// faultLoad is a few clients calling a real server while its database goes away and
// comes back, and everything they were answered.
type faultLoad struct {
	base, key string
	client    *http.Client

	mu         sync.Mutex
	answers    int               // every answer
	unavail    int               // 503s among them
	ok         int               // 2xx among them
	violations []string          // answers the service must never give
	evals      map[string]int    // Idempotency-Key of each charged eval -> status
	jobs       map[string]string // jobs accepted -> the request that made them
}

// do sends one request and checks the answer's shape: 2xx, a 4xx problem, or a 503
// problem with Retry-After. Never a 500, never a dropped connection.
func (l *faultLoad) do(method, path, key, idem string, body any) (int, map[string]any) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = strings.NewReader(string(b))
	}
	req, _ := http.NewRequest(method, l.base+path, rd)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if idem != "" {
		req.Header.Set("Idempotency-Key", idem)
	}
	res, err := l.client.Do(req)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.violations = append(l.violations, fmt.Sprintf("%s %s: %v", method, path, err))
		return 0, nil
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var out map[string]any
	json.Unmarshal(raw, &out) //nolint:errcheck // checked by status below
	l.answers++
	bad := ""
	switch s := res.StatusCode; {
	case s < 300:
		l.ok++
	case s == 503:
		l.unavail++
		if ra, err := strconv.Atoi(res.Header.Get("Retry-After")); err != nil || ra < 1 || out["next_action"] != "retry_after" {
			bad = "503 without Retry-After or retry_after"
		}
	case s >= 500:
		bad = "server error"
	}
	if res.StatusCode >= 400 && res.Header.Get("Content-Type") != "application/problem+json" {
		bad = "error that is not problem+json"
	}
	if bad != "" {
		l.violations = append(l.violations, fmt.Sprintf("%s %s: %s: %d %s", method, path, bad, res.StatusCode, raw))
	}
	return res.StatusCode, out
}

// someViolations lists the first few violations and how many there are ("" for none).
func (l *faultLoad) someViolations() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.violations) == 0 {
		return ""
	}
	return fmt.Sprintf("%d, e.g.:\n%s", len(l.violations), strings.Join(l.violations[:min(10, len(l.violations))], "\n"))
}

func (l *faultLoad) count() (answers, unavail, ok int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.answers, l.unavail, l.ok
}

// run is one client: charged evals of cached positions, key and account reads, job
// submissions and signups, in turn, until stop (and at most limit calls).
func (l *faultLoad) run(client int, fens []string, stop <-chan struct{}, limit int) {
	for i := 0; i < limit; i++ {
		select {
		case <-stop:
			return
		default:
		}
		switch i % 6 {
		case 0, 3:
			idem := fmt.Sprintf("fault-%d-%d", client, i)
			status, _ := l.do("POST", "/eval", l.key, idem, map[string]any{"fen": fens[i%len(fens)], "depth": 8})
			l.mu.Lock()
			l.evals[idem] = status
			l.mu.Unlock()
		case 1:
			l.do("GET", "/keys", l.key, "", nil)
		case 2:
			l.do("GET", "/me", l.key, "", nil)
		case 4:
			status, out := l.do("POST", "/batch", l.key, "", map[string]any{"fens": []string{fens[i%len(fens)]}, "depth": 6})
			if status == 202 {
				l.mu.Lock()
				l.jobs[out["job_id"].(string)] = fmt.Sprintf("client %d call %d", client, i)
				l.mu.Unlock()
			}
		case 5:
			l.do("POST", "/signup", "", "", map[string]string{"email": fmt.Sprintf("load-%d-%d@example.com", client, i)})
		}
	}
}

// loadFENs are the positions a load's evals ask for (cached by newLoad).
var loadFENs = []string{
	"r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
	"rnbqkb1r/pp3ppp/4pn2/2pp4/3P4/2P1PN2/PP3PPP/RNBQKB1R w KQkq - 0 5",
	"rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1",
}

// newLoad is a load on srv with key, loadFENs cached by an eval each (charged).
func newLoad(t *testing.T, srv *server, key string) *faultLoad {
	t.Helper()
	load := &faultLoad{base: srv.base, key: key, client: &http.Client{Timeout: 2 * eventstore.SettleWait},
		evals: map[string]int{}, jobs: map[string]string{}}
	for i, fen := range loadFENs {
		idem := fmt.Sprintf("warm-%d", i)
		if status, out := load.do("POST", "/eval", key, idem, map[string]any{"fen": fen, "depth": 8}); status != 200 {
			t.Fatalf("warm-up eval: %d %v", status, out)
		}
		load.evals[idem] = 200
	}
	return load
}

// start runs clients clients of at most limit calls each until the returned function
// (also called when the test ends) stops them and waits for them.
func (l *faultLoad) start(t *testing.T, clients, limit int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() { l.run(c, loadFENs, done, limit) })
	}
	var once sync.Once
	stop = func() { once.Do(func() { close(done); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// waitFor polls cond until it holds, failing the test at the deadline.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// PostgreSQL is stopped and started again under load (charged evals, key and account
// reads, job submissions, signups): every answer is a 2xx, a 4xx or a 503 with
// Retry-After, never a 500; once it is back the same server process recovers fully
// (signup, /me, a charged eval, the projections, a job), every eval answered 200 was
// charged exactly once and every other eval not at all, and the ledger balances.
func TestDatabaseRestartUnderLoad(t *testing.T) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "chessd-fault-")
	if err != nil {
		t.Fatal(err)
	}
	cluster, err := postgres.NewCluster(dir, 5433, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	cluster.Fast = true
	if _, err := cluster.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cluster.Watchdog(dir) // never outlives the test binary
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cluster.Stop(stopCtx) //nolint:errcheck // best effort
		os.RemoveAll(dir)
	})
	if err := postgres.CreateDatabase(ctx, cluster.URL("postgres"), "chessd"); err != nil {
		t.Fatal(err)
	}
	dbURL := cluster.URL("chessd")
	srv := startServer(t, buildBinary(t), dbURL, freePort(t))
	pool, su := account(t, dbURL, "fault@example.com", domain.PlanPro)

	load := newLoad(t, srv, su.Secret)
	fens := loadFENs

	// A longer job, started first (the executor takes jobs as they come, so queued
	// behind the load's it could wait long), running when the database stops: fifteen
	// positions, so that it outlasts the load's first 40 answers on a machine busy with
	// other tests (nine once finished first in CI).
	longFENs := append([]string{
		"rnbqkb1r/pppppppp/5n2/8/3P4/8/PPP1PPPP/RNBQKBNR w KQkq - 1 2",
		"r1bqkbnr/pppp1ppp/2n5/1B2p3/4P3/5N2/PPPP1PPP/RNBQK2R b KQkq - 3 3",
		"rnbqkb1r/pppppppp/5n2/8/2PP4/8/PP2PPPP/RNBQKBNR b KQkq - 0 2",
		"rnbqkbnr/pppp1ppp/8/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R b KQkq - 1 2",
		"8/5k2/8/8/8/8/5PK1/8 w - - 0 1",
		"8/8/8/4k3/8/8/4P3/4K3 w - - 0 1",
		"rnbqkbnr/pp1ppppp/8/2p5/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2",
		"rnbqkbnr/ppp1pppp/8/3p4/2PP4/8/PP2PPPP/RNBQKBNR b KQkq - 0 2",
		"rnbqkbnr/pppp1ppp/4p3/8/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2",
		"rnbqkbnr/ppp1pppp/8/3p4/8/5N2/PPPPPPPP/RNBQKB1R w KQkq - 0 2",
		"rnbqkbnr/pp1ppppp/2p5/8/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2",
		"rnbqkbnr/pppp1ppp/8/4p3/2P5/8/PP1PPPPP/RNBQKBNR w KQkq - 0 2",
	}, fens...)
	status, out := load.do("POST", "/batch", su.Secret, "", map[string]any{"fens": longFENs, "depth": 14, "multipv": 2})
	if status != 202 {
		t.Fatalf("long batch: %d %v", status, out)
	}
	longJob := out["job_id"].(string)
	load.jobs[longJob] = "running across the outage"
	jobDone := func() int {
		var n int
		pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE stream_id = $1 AND event_type = 'JobPositionAnalysed'`, "job-"+longJob).Scan(&n) //nolint:errcheck // polled
		return n
	}
	waitFor(t, "the long job to record a position", time.Minute, func() bool { return jobDone() > 0 })

	stopLoad := load.start(t, 4, 5000)

	waitFor(t, "answers with the database up", time.Minute, func() bool { n, _, _ := load.count(); return n >= 40 })
	if done := jobDone(); done >= len(longFENs) {
		t.Fatalf("the long job finished (%d positions) before the database stopped: make it longer", done)
	}
	if err := cluster.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	before, unavailBefore, _ := load.count()
	waitFor(t, "answers with the database stopped", time.Minute, func() bool { n, _, _ := load.count(); return n >= before+40 })
	if _, u, _ := load.count(); u == unavailBefore {
		t.Fatalf("no 503 while the database was stopped:\n%s", load.someViolations())
	}
	if _, err := cluster.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "/readyz after the restart", time.Minute, func() bool {
		res, err := http.Get(srv.base + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == 200
	})
	_, _, okBefore := load.count()
	waitFor(t, "successes after the restart", time.Minute, func() bool { _, _, ok := load.count(); return ok >= okBefore+40 })
	stopLoad()
	if v := load.someViolations(); v != "" {
		t.Fatalf("answers the service must never give:\n%s", v)
	}

	// Full recovery, in the same process. The read models may lag a few seconds behind
	// an outage (a projection whose transaction died with the database starts over
	// after its ack deadline), so what reads them is waited for.
	status, out = load.do("POST", "/signup", "", "", map[string]string{"email": "after-restart@example.com"})
	if status != 201 {
		t.Fatalf("signup after the restart: %d %v", status, out)
	}
	newKey, newKeyID := out["api_key"].(string), out["key_id"].(string)
	waitFor(t, "/me and /keys to show the account signed up after the restart", time.Minute, func() bool {
		status, _ := load.do("GET", "/me", newKey, "", nil)
		keys, out := load.do("GET", "/keys", newKey, "", nil)
		return status == 200 && keys == 200 && strings.Contains(fmt.Sprint(out), newKeyID)
	})
	if status, out := load.do("POST", "/eval", newKey, "", map[string]any{"fen": fens[0], "depth": 8}); status != 200 || out["cost_units"] == float64(0) {
		t.Fatalf("charged eval after the restart: %d %v", status, out)
	}
	status, out = load.do("POST", "/batch", su.Secret, "", map[string]any{"fens": fens, "depth": 6})
	if status != 202 {
		t.Fatalf("batch after the restart: %d %v", status, out)
	}
	load.mu.Lock()
	load.jobs[out["job_id"].(string)] = "after the restart"
	load.mu.Unlock()
	load.jobsSucceeded(t) // those accepted mid-outage included: none failed
	waitFor(t, "the projections to catch up", time.Minute, func() bool { return projectionsCaughtUp(t, pool) })
	var longCharges, longDistinct int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT payload->>'index') FROM events
		WHERE stream_id = $1 AND event_type = 'JobPositionAnalysed'`, "job-"+longJob).Scan(&longCharges, &longDistinct); err != nil {
		t.Fatal(err)
	}
	if longCharges != len(longFENs) || longDistinct != len(longFENs) {
		t.Fatalf("the job across the outage recorded %d positions (%d distinct) of %d", longCharges, longDistinct, len(longFENs))
	}
	var jobCharges int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE stream_id = $1 AND payload->'params'->>'job_id' = $2`,
		"ledger-"+su.KeyID, longJob).Scan(&jobCharges); err != nil || jobCharges != len(longFENs) {
		t.Fatalf("the job across the outage was charged %d times for %d positions (%v)", jobCharges, len(longFENs), err)
	}

	load.chargedOnce(t, pool, su.KeyID)
	waitFor(t, "the projections to catch up with the charges", time.Minute, func() bool { return projectionsCaughtUp(t, pool) })
	balanced(t, pool)
	srv.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck // stopping it to replay
	srv.cmd.Wait()                          //nolint:errcheck // stopped
	if out, err := runCLI(t, dbURL, "replay"); err != nil {
		t.Fatalf("replay after the restart: %v\n%s", err, out)
	}
	if out, err := runCLI(t, dbURL, "verify"); err != nil {
		t.Fatalf("chain after the restart: %v\n%s", err, out)
	}
	_, unavail, _ := load.count()
	t.Logf("%d answers, %d of them 503; %d evals, %d jobs", load.answers, unavail, len(load.evals), len(load.jobs))
}

// jobsSucceeded waits for every job the load submitted to end, and checks that it
// succeeded.
func (l *faultLoad) jobsSucceeded(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	jobs := maps.Clone(l.jobs)
	l.mu.Unlock()
	for id, made := range jobs {
		var state string
		waitFor(t, "job "+id+" ("+made+") to finish", 2*time.Minute, func() bool {
			_, out := l.do("GET", "/jobs/"+id, l.key, "", nil)
			state, _ = out["state"].(string)
			return state == "succeeded" || state == "failed" || state == "cancelled"
		})
		if state != "succeeded" {
			t.Fatalf("job %s (%s) %s", id, made, state)
		}
	}
}

// chargedOnce checks that every eval of the load answered 200 is charged once on keyID's
// ledger stream (charges may be settled after the answer: they are waited for), and
// every other one not at all.
func (l *faultLoad) chargedOnce(t *testing.T, pool *pgxpool.Pool, keyID string) {
	t.Helper()
	charged := func() map[string]int { return chargesPerIdempotencyKey(t, pool, keyID) }
	l.mu.Lock()
	evals := maps.Clone(l.evals)
	l.mu.Unlock()
	answered := 0
	for _, status := range evals {
		if status == 200 {
			answered++
		}
	}
	waitFor(t, "the answered evals' charges", time.Minute, func() bool { return len(charged()) >= answered })
	perIdem := charged()
	for idem, status := range evals {
		want := 0
		if status == 200 {
			want = 1
		}
		if perIdem[idem] != want {
			t.Fatalf("eval %s answered %d was charged %d times", idem, status, perIdem[idem])
		}
	}
	if len(perIdem) != answered {
		t.Fatalf("%d evals charged, %d answered 200", len(perIdem), answered)
	}
}

// balanced checks that the postings of the ledger's read model sum to zero per currency.
func balanced(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var entries int
	var unbalanced []string
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM ledger_entries`).Scan(&entries); err != nil || entries == 0 {
		t.Fatalf("%d ledger entries (%v)", entries, err)
	}
	rows, err := pool.Query(context.Background(), `SELECT currency || ' ' || (sum(debit) - sum(credit))::text FROM ledger_entries
		GROUP BY currency HAVING sum(debit) <> sum(credit)`)
	if err != nil {
		t.Fatal(err)
	}
	unbalanced, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(unbalanced) > 0 {
		t.Fatalf("postings do not sum to zero: %v (%v)", unbalanced, err)
	}
}

// projectionsCaughtUp says whether every projection has applied the last event of its
// topic.
func projectionsCaughtUp(t *testing.T, pool *pgxpool.Pool) bool {
	t.Helper()
	ctx := context.Background()
	last := map[string]int64{}
	rows, err := pool.Query(ctx, `SELECT stream_type, max(position) FROM events GROUP BY 1`)
	if err != nil {
		return false
	}
	for rows.Next() {
		var st string
		var pos int64
		if err := rows.Scan(&st, &pos); err != nil {
			return false
		}
		topic := eventstore.TopicOf(st)
		last[topic] = max(last[topic], pos)
	}
	for _, p := range allProjections() {
		if projections.Inline(p) {
			continue // written with its events
		}
		var at int64
		if err := pool.QueryRow(ctx, `SELECT coalesce(max(position), 0) FROM projection_checkpoints WHERE name = $1`, p.Name()).Scan(&at); err != nil || at < last[p.Topic()] {
			return false
		}
	}
	return true
}

// chargesPerIdempotencyKey counts keyID's charges in the log per Idempotency-Key: the
// lines of its ChargesSettled events that carry one (a job's UnitsCharged never do).
func chargesPerIdempotencyKey(t *testing.T, pool *pgxpool.Pool, keyID string) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT l->>'idempotency_key', count(*)
		FROM events e CROSS JOIN LATERAL json_array_elements(e.payload->'lines') l
		WHERE e.stream_id = $1 AND e.event_type = 'ChargesSettled' AND l->>'idempotency_key' IS NOT NULL GROUP BY 1`, "ledger-"+keyID)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	var key string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&key, &n}, func() error { out[key] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}
