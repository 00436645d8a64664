package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/postgres/pgtest"
)

// server is a real chessd process.
type server struct {
	t    *testing.T
	cmd  *exec.Cmd
	base string
}

func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "chessd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func startServer(t *testing.T, bin, dbURL string, port int, env ...string) *server {
	t.Helper()
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, fmt.Sprintf("PORT=%d", port), "LOG_LEVEL=error",
		"CHESSD_KEY_PEPPER=crash-test-pepper-0123456789", "CHESSD_RATE_LIMITS=off", "CHESSD_ENGINE_POOL_SIZE=1",
		"CHESSD_DATA_DIR="+t.TempDir())
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, cmd: cmd, base: fmt.Sprintf("http://127.0.0.1:%d/v1", port)}
	checkTraffic(t, s.base)
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck // may be dead already
	s.waitReady(t)
	return s
}

// account signs up on the database at dbURL (with the servers' pepper) and moves the
// account to plan.
func account(t *testing.T, dbURL, email string, plan domain.Plan) (*pgxpool.Pool, commands.SignupResult) {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.NewDBAt(t, dbURL)
	h := commands.New(eventstore.NewStore(pool, nil), []byte("crash-test-pepper-0123456789"))
	su, err := h.Signup(ctx, domain.Signup{Email: email}, "req")
	if err != nil {
		t.Fatal(err)
	}
	if plan != domain.PlanFree {
		if err := h.ChangePlan(ctx, su.AccountID, plan, "test"); err != nil {
			t.Fatal(err)
		}
	}
	return pool, su
}

// call is one request of the load, identified by its Idempotency-Key.
type call struct {
	idem, body string
	ok         bool      // the client saw a 200
	at         time.Time // when
	server     int       // which server (of a sequence of restarts) answered it
}

func (s *server) post(c *call, key string) (int, error) {
	req, _ := http.NewRequest("POST", s.base+"/eval", strings.NewReader(c.body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Idempotency-Key", c.idem)
	client := &http.Client{Timeout: 20 * time.Second}
	res, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	io.Copy(io.Discard, res.Body) //nolint:errcheck // draining
	return res.StatusCode, nil
}

// The server is killed with SIGKILL in the middle of a load of charged calls with
// idempotency keys, ten times; each time it is restarted and the clients retry what got
// no answer (waiting out 409 while the dead server's claims expire). Every call is
// charged at most once; every call answered after a restart exactly once; a call
// answered before a kill and not yet settled is forgiven, and only within the settle
// bound (CHESSD_MAX_SETTLE_BACKLOG, 100 ms, plus the commit in flight).
func TestCrashMidLoadChargesExactlyOnce(t *testing.T) {
	bin := buildBinary(t)
	dbURL := pgtest.URL(t)
	port := freePort(t)
	pool, su := account(t, dbURL, "crash@example.com", domain.PlanPro)
	env := []string{"CHESSD_LEASE_TTL=2s"}
	srv := startServer(t, bin, dbURL, port, env...)
	ctx := context.Background()
	fens := []string{
		"r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
		"rnbqkb1r/pp3ppp/4pn2/2pp4/3P4/2P1PN2/PP3PPP/RNBQKB1R w KQkq - 0 5",
		"rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1",
	}
	var calls []*call
	retried := map[string]bool{}
	var killedAt []time.Time
	for round := range 10 {
		load := make([]*call, 160)
		for i := range load {
			load[i] = &call{idem: fmt.Sprintf("r%d-load-%03d", round, i), body: fmt.Sprintf(`{"fen":%q,"depth":%d}`, fens[i%3], 6+(i+round)%4)}
		}
		calls = append(calls, load...)
		var mu sync.Mutex
		done, next := 0, 0
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					mu.Lock()
					if next >= len(load) {
						mu.Unlock()
						return
					}
					c := load[next]
					next++
					mu.Unlock()
					status, err := srv.post(c, su.Secret)
					mu.Lock()
					if err == nil && status == 200 {
						c.ok, c.at, c.server = true, time.Now(), round
					}
					done++
					if done == 60 {
						killedAt = append(killedAt, time.Now())
						srv.cmd.Process.Signal(syscall.SIGKILL) //nolint:errcheck // the point of the test
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		srv.cmd.Wait() //nolint:errcheck // killed
		answered := 0
		for _, c := range load {
			if c.ok {
				answered++
			}
		}
		if answered < 40 || answered == len(load) {
			t.Fatalf("round %d: %d of %d calls answered before the kill: the kill did not land mid-load", round, answered, len(load))
		}
		srv = startServer(t, bin, dbURL, port, env...)
		for _, c := range load {
			if c.ok {
				continue
			}
			// a call the killed server was running holds its Idempotency-Key until the
			// claim expires: 409 with Retry-After until then
			deadline := time.Now().Add(30 * time.Second)
			for {
				status, err := srv.post(c, su.Secret)
				if err == nil && status == 200 {
					break
				}
				if err != nil || status != 409 || time.Now().After(deadline) {
					t.Fatalf("round %d: retry of %s: %d %v", round, c.idem, status, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			c.ok, c.at, c.server = true, time.Now(), round+1
			retried[c.idem] = true
		}
	}
	srv.stop(t) // settles what it answered
	perKey := chargesPerIdempotencyKey(t, pool, su.KeyID)
	forgiven := 0
	var oldest time.Duration
	for _, c := range calls {
		switch n := perKey[c.idem]; {
		case n > 1:
			t.Fatalf("%s charged %d times", c.idem, n)
		case n == 0:
			// the server that answered it was killed before settling it, within the
			// settle bound
			forgiven++
			if c.server == len(killedAt) {
				t.Fatalf("%s was answered by the server that stopped cleanly and not charged", c.idem)
			}
			before := killedAt[c.server].Sub(c.at)
			oldest = max(oldest, before)
			if before > 500*time.Millisecond { // 100 ms of backlog plus the commit in flight, on a busy machine
				t.Fatalf("%s, answered %v before a kill, was forgiven: past the settle bound", c.idem, before)
			}
		}
	}
	t.Logf("10 kills: %d calls answered, %d retried after a restart, %d forgiven, answered at most %v before their kill",
		len(calls), len(retried), forgiven, oldest)
	var spent, sum int64
	if err := pool.QueryRow(ctx, `SELECT spent_units FROM key_balances WHERE key_id = $1`, su.KeyID).Scan(&spent); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum((payload->>'units')::bigint), 0) FROM events WHERE stream_id = $1`, "ledger-"+su.KeyID).Scan(&sum); err != nil {
		t.Fatal(err)
	}
	if spent != sum {
		t.Fatalf("balance says %d units spent, the charges %d", spent, sum)
	}
	if out, err := runCLI(t, dbURL, "verify"); err != nil {
		t.Fatalf("chain after the crashes: %v %s", err, out)
	}
}

// A job running when the server is killed (SIGKILL) is taken up again after restart:
// positions already analysed are neither analysed nor charged again, and it finishes.
func TestJobSurvivesSIGKILL(t *testing.T) {
	bin := buildBinary(t)
	dbURL := pgtest.URL(t)
	port := freePort(t)
	srv := startServer(t, bin, dbURL, port)
	ctx := context.Background()
	pool, su := account(t, dbURL, "job-crash@example.com", domain.PlanPro)
	jobID := submitGame(t, srv, su.Secret, 13)
	analysed := func() int {
		var n int
		pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE stream_id = $1 AND event_type = 'JobPositionAnalysed'`, "job-"+jobID).Scan(&n) //nolint:errcheck // polled
		return n
	}
	deadline := time.Now().Add(60 * time.Second)
	for analysed() < 3 {
		if time.Now().After(deadline) {
			t.Fatal("the job did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	srv.cmd.Process.Signal(syscall.SIGKILL) //nolint:errcheck // the point of the test
	srv.cmd.Wait()                          //nolint:errcheck // killed
	before := analysed()
	if before >= 30 {
		t.Fatal("the job finished before the kill: make it longer")
	}
	startServer(t, bin, dbURL, port)
	waitSucceeded(t, pool, jobID, func() string { return fmt.Sprintf("%d analysed", analysed()) })
	var resumed int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE stream_id = $1 AND event_type = 'JobResumed'`, "job-"+jobID).Scan(&resumed); err != nil {
		t.Fatal(err)
	}
	if b := booksOf(t, pool, jobID, su.KeyID); !b.whole(30) || resumed < 1 {
		t.Fatalf("%+v (%d analysed before the kill), resumed %d", b, before, resumed)
	}
}

// An API server that analyses no jobs, and a separate `chessd worker` process on the
// same database that does.
func TestWorkerProcessRunsJobs(t *testing.T) {
	bin := buildBinary(t)
	dbURL := pgtest.URL(t)
	srv := startServer(t, bin, dbURL, freePort(t), "CHESSD_WORKER_JOBS=0")
	ctx := context.Background()
	pool, su := account(t, dbURL, "worker@example.com", domain.PlanFree)
	req, _ := http.NewRequest("POST", srv.base+"/analyze", strings.NewReader(`{"pgn":"1. e4 e5 2. Nf3 Nc6 *","depth":6}`))
	req.Header.Set("Authorization", "Bearer "+su.Secret)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var job struct {
		ID string `json:"job_id"`
	}
	json.NewDecoder(res.Body).Decode(&job) //nolint:errcheck // checked below
	res.Body.Close()
	if res.StatusCode != 202 {
		t.Fatalf("submit: %d", res.StatusCode)
	}
	last := func() string {
		var e string
		pool.QueryRow(ctx, `SELECT event_type FROM events WHERE stream_id = $1 ORDER BY version DESC LIMIT 1`, "job-"+job.ID).Scan(&e) //nolint:errcheck // polled
		return e
	}
	// An executor subscribes to the command bus under its consumer group before it
	// reads a command, and the subscription leaves a row in the topic's offsets table.
	// Once the API server's own subscribers (its projections) have applied the job, an
	// executor of its would have subscribed too: there must be none, and the job must
	// still be waiting.
	executors := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM watermill_offsets_job_commands WHERE consumer_group = 'executor_v1'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE job_id = $1`, job.ID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the API server's projections never showed the job")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n, e := executors(), last(); n != 0 || e != "JobSubmitted" {
		t.Fatalf("the API server runs an executor (%d subscribed; last event of the job %s)", n, e)
	}
	startWorker(t, bin, dbURL, "worker-process")
	deadline = time.Now().Add(60 * time.Second)
	for last() != "JobSucceeded" {
		if time.Now().After(deadline) {
			t.Fatalf("the worker did not finish the job (last event %s)", last())
		}
		time.Sleep(50 * time.Millisecond)
	}
	var worker string
	if err := pool.QueryRow(ctx, `SELECT payload->>'worker' FROM events WHERE stream_id = $1 AND event_type = 'JobStarted'`, "job-"+job.ID).Scan(&worker); err != nil || worker != "worker-process" {
		t.Fatalf("started by %q (%v)", worker, err)
	}
	if n := executors(); n != 1 { // the check above sees an executor when there is one
		t.Fatalf("%d executor consumer groups after the worker ran, want 1", n)
	}
}

// Two `chessd worker` processes share a job; one is killed (SIGKILL) mid-job. The
// other takes up its positions when their leases run out and finishes the job: every
// position recorded and charged exactly once, nothing left held.
func TestWorkerKilledMidJob(t *testing.T) {
	bin := buildBinary(t)
	dbURL := pgtest.URL(t)
	srv := startServer(t, bin, dbURL, freePort(t), "CHESSD_WORKER_JOBS=0")
	ctx := context.Background()
	pool, su := account(t, dbURL, "worker-kill@example.com", domain.PlanPro)
	victim := startWorker(t, bin, dbURL, "victim", "CHESSD_JOB_LEASE=2s")
	startWorker(t, bin, dbURL, "survivor", "CHESSD_JOB_LEASE=2s")
	jobID := submitGame(t, srv, su.Secret, 12)
	byWorker := func() map[string]int {
		rows, err := pool.Query(ctx, `SELECT payload->>'worker', count(*) FROM events
			WHERE stream_id = $1 AND event_type = 'JobPositionAnalysed' GROUP BY 1`, "job-"+jobID)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		for rows.Next() {
			var w string
			var n int
			if err := rows.Scan(&w, &n); err != nil {
				t.Fatal(err)
			}
			out[w] = n
		}
		return out
	}
	heldByVictim := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM job_queue WHERE job_id = $1 AND worker = 'victim'`, jobID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// The kill comes while the victim holds positions. Not once both have recorded
	// some: a worker records its positions in batches, so a worker's first record may
	// come when nothing is left to take (the wait then outlived the job: a flake).
	deadline := time.Now().Add(60 * time.Second)
	held := 0
	for held = heldByVictim(); held == 0; held = heldByVictim() {
		if time.Now().After(deadline) {
			t.Fatalf("the victim never held a position of the job: %v", byWorker())
		}
		time.Sleep(5 * time.Millisecond)
	}
	sessions := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, workerApp("victim")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if sessions() == 0 {
		t.Fatal("the victim's database sessions are not named: the wait for their end below would see none")
	}
	victim.Process.Signal(syscall.SIGKILL) //nolint:errcheck // the point of the test
	victim.Wait()                          //nolint:errcheck // killed
	// A COMMIT the victim sent just before it died still commits: its records are all
	// in once its database sessions are gone, not before.
	for deadline := time.Now().Add(30 * time.Second); sessions() > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the killed worker's database sessions did not end")
		}
	}
	before := byWorker()
	if before["victim"]+before["survivor"] >= 30 {
		t.Fatalf("nothing left to take over (%v, %d held by the victim): make the job longer", before, held)
	}
	waitSucceeded(t, pool, jobID, func() string { return fmt.Sprint(byWorker()) })
	after := byWorker()
	var resumed int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE stream_id = $1 AND event_type = 'JobResumed'
		AND payload->>'worker' = 'survivor'`, "job-"+jobID).Scan(&resumed); err != nil {
		t.Fatal(err)
	}
	if b := booksOf(t, pool, jobID, su.KeyID); !b.whole(30) || resumed < 1 ||
		after["victim"] != before["victim"] || after["survivor"] != 30-before["victim"] {
		t.Fatalf("%+v; by worker %v (%v at the kill), resumed by the survivor %d", b, after, before, resumed)
	}
}

// sicilian is a 30-ply game: a job long enough to be interrupted.
const sicilian = "1. e4 c5 2. Nf3 d6 3. d4 cxd4 4. Nxd4 Nf6 5. Nc3 a6 6. Be3 e5 7. Nb3 Be6 8. f3 Be7 9. Qd2 O-O " +
	"10. O-O-O Nbd7 11. g4 b5 12. g5 b4 13. Ne2 Ne8 14. f4 a5 15. f5 a4 *"

// submitGame submits sicilian for analysis at depth and returns the job's id.
func submitGame(t *testing.T, srv *server, secret string, depth int) string {
	t.Helper()
	req, _ := http.NewRequest("POST", srv.base+"/analyze", strings.NewReader(fmt.Sprintf(`{"pgn":%q,"depth":%d,"multipv":2}`, sicilian, depth)))
	req.Header.Set("Authorization", "Bearer "+secret)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var job struct {
		ID    string `json:"job_id"`
		Total int    `json:"positions_total"`
	}
	json.NewDecoder(res.Body).Decode(&job) //nolint:errcheck // checked below
	res.Body.Close()
	if res.StatusCode != 202 || job.Total != 30 {
		t.Fatalf("submit: %d %+v", res.StatusCode, job)
	}
	return job.ID
}

// startWorker starts a `chessd worker` process named name, stopped at the test's end.
func startWorker(t *testing.T, bin, dbURL, name string, env ...string) *exec.Cmd {
	t.Helper()
	w := exec.Command(bin, "worker")
	w.Env = append(append(os.Environ(), "DATABASE_URL="+dbURL, "LOG_LEVEL=error", "CHESSD_KEY_PEPPER=crash-test-pepper-0123456789",
		"CHESSD_ENGINE_POOL_SIZE=1", "CHESSD_WORKER_NAME="+name, "CHESSD_DATA_DIR="+t.TempDir(), "PGAPPNAME="+workerApp(name)), env...)
	w.Stderr = os.Stderr
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Process.Signal(syscall.SIGTERM); w.Wait() }) //nolint:errcheck // stopping
	return w
}

// workerApp is the application_name of worker name's database sessions (pgx reads
// PGAPPNAME), by which a test finds them in pg_stat_activity.
func workerApp(name string) string { return "chessd-worker-" + name }

// waitSucceeded waits until the job's last event is JobSucceeded; what fails says
// where the job stood (state()).
func waitSucceeded(t *testing.T, pool *pgxpool.Pool, jobID string, state func() string) {
	t.Helper()
	deadline := time.Now().Add(120 * time.Second)
	for {
		var last string
		pool.QueryRow(context.Background(), `SELECT event_type FROM events WHERE stream_id = $1 ORDER BY version DESC LIMIT 1`, "job-"+jobID).Scan(&last) //nolint:errcheck // polled
		if last == "JobSucceeded" {
			return
		}
		if last == "JobFailed" || time.Now().After(deadline) {
			t.Fatalf("the job did not finish (last event %s, %s)", last, state())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// jobBooks is what a finished job left: positions recorded (and distinct), its charges
// and their units, and the key's holds and spend.
type jobBooks struct {
	analysed, distinct, charges int
	held, spent, charged        int64
}

func booksOf(t *testing.T, pool *pgxpool.Pool, jobID, keyID string) jobBooks {
	t.Helper()
	ctx := context.Background()
	var b jobBooks
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT payload->>'index') FROM events
		WHERE stream_id = $1 AND event_type = 'JobPositionAnalysed'`, "job-"+jobID).Scan(&b.analysed, &b.distinct); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(sum((payload->>'units')::bigint), 0) FROM events
		WHERE stream_id = $1 AND payload->'params'->>'job_id' = $2`, "ledger-"+keyID, jobID).Scan(&b.charges, &b.charged); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT held_units, spent_units FROM key_balances WHERE key_id = $1`, keyID).Scan(&b.held, &b.spent); err != nil {
		t.Fatal(err)
	}
	return b
}

// whole says whether every one of n positions was recorded and charged exactly once,
// and nothing is left held.
func (b jobBooks) whole(n int) bool {
	return b.analysed == n && b.distinct == n && b.charges == n && b.held == 0 && b.spent == b.charged
}
