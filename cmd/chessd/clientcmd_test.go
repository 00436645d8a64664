package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"chessd/domain"
	"chessd/httpapi"
	"chessd/postgres/pgtest"
	"chessd/syncbuf"
)

// clientCmd runs `chessd ARGS...` (a client command) with env and stdin, and returns
// its stdout and stderr.
func clientCmd(t *testing.T, bin string, env []string, stdin string, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// The client commands against a real server: eval and bestmove (streamed, a progress
// line per depth), analyze and jobs watch, usage as a table; --json gives the API's
// answer; the server and key come from flags, the environment or the config file.
func TestClientCommands(t *testing.T) {
	bin := buildBinary(t)
	dbURL := pgtest.URL(t)
	_, su := account(t, dbURL, "cli@example.com", domain.PlanFree)
	srv := startServer(t, bin, dbURL, freePort(t))
	env := []string{"CHESSD_SERVER=" + srv.base, "CHESSD_KEY=" + su.Secret, "CHESSD_CONFIG=", "HOME=" + t.TempDir()}
	const fen = "r1bqkbnr/pppp1ppp/2n5/1B2p3/4P3/5N2/PPPP1PPP/RNBQK2R b KQkq - 3 3"

	t.Run("eval --json", func(t *testing.T) {
		out, stderr, err := clientCmd(t, bin, env, "", "eval", "--json", "--depth", "10", "--multipv", "2", fen)
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		var ev struct {
			Depth    int    `json:"depth"`
			Bestmove string `json:"bestmove"`
			Pvs      []any  `json:"pvs"`
			Cost     int    `json:"cost_units"`
		}
		if err := json.Unmarshal([]byte(out), &ev); err != nil {
			t.Fatalf("not JSON: %v\n%s", err, out)
		}
		if ev.Depth != 10 || len(ev.Pvs) != 2 || ev.Cost == 0 {
			t.Errorf("answer %+v", ev)
		}
		legal(t, fen, nil, ev.Bestmove)
		// stderr is no terminal here: one progress line per depth, in order
		for _, d := range []string{"depth 1 ", "depth 5 ", "depth 10 "} {
			if !strings.Contains(stderr, d) {
				t.Errorf("progress lacks %q:\n%s", d, stderr)
			}
		}
	})

	t.Run("eval as text", func(t *testing.T) {
		out, stderr, err := clientCmd(t, bin, env, "", "eval", "--depth", "9", "--wdl", fen)
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		// the board (rank 8 with Black's pieces), the score, a numbered SAN line, the cost
		for _, re := range []string{`(?m)^8♜ - ♝ ♛ ♚ ♝ ♞ ♜`, `(?m)^Eval  [+-]\d+\.\d\d \(White's view\), depth \d+`,
			`(?m)^ 1\. [+-]\d+\.\d\d +3\.\.\. [A-Za-z]`, `\[W \d+ D \d+ L \d+\]`, `(?m)^Best  \S+ \([a-h][1-8][a-h][1-8]\)`, `(?m)^Cost  \d+ units`} {
			if !regexp.MustCompile(re).MatchString(out) {
				t.Errorf("output lacks %s:\n%s", re, out)
			}
		}
	})

	t.Run("bestmove --json", func(t *testing.T) {
		out, stderr, err := clientCmd(t, bin, env, "", "bestmove", "--json", "--depth", "8", fen)
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		var bm struct {
			Bestmove    string `json:"bestmove"`
			BestmoveSAN string `json:"bestmove_san"`
		}
		if err := json.Unmarshal([]byte(out), &bm); err != nil || bm.BestmoveSAN == "" {
			t.Fatalf("answer %q: %v", out, err)
		}
		legal(t, fen, nil, bm.Bestmove)
	})

	var jobID string
	t.Run("analyze", func(t *testing.T) {
		pgn := "1. e4 e5 2. Nf3 Nc6 3. Bb5 *"
		out, stderr, err := clientCmd(t, bin, env, pgn, "analyze", "--pgn", "-", "--depth", "6")
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		m := regexp.MustCompile(`(?m)^(job_\S+): succeeded, 5/5 positions`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no summary line:\n%s", out)
		}
		jobID = m[1]
		for _, row := range []string{`(?m)^PLY +PLAYED +EVAL +BEST +DEPTH +LINE`, `(?m)^1 +e4 +[+-]\d+\.\d\d +\S+ +6 +1\. `, `(?m)^5 +Bb5 +`} {
			if !regexp.MustCompile(row).MatchString(out) {
				t.Errorf("table lacks %s:\n%s", row, out)
			}
		}
		if !strings.Contains(stderr, "5/5 positions") {
			t.Errorf("no progress to 5/5 on stderr:\n%s", stderr)
		}
	})

	t.Run("jobs watch --json", func(t *testing.T) {
		if jobID == "" {
			t.Skip("analyze failed")
		}
		out, stderr, err := clientCmd(t, bin, env, "", "jobs", "watch", "--json", jobID)
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		var r struct {
			JobID     string `json:"job_id"`
			Complete  bool   `json:"complete"`
			Positions []any  `json:"positions"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil || r.JobID != jobID || !r.Complete || len(r.Positions) != 5 {
			t.Fatalf("result %+v (%v):\n%s", r, err, out)
		}
	})

	t.Run("usage", func(t *testing.T) {
		// the read model follows the charges: wait for the analysis's 5 positions
		var u struct {
			Totals struct {
				Calls int `json:"calls"`
			} `json:"totals"`
		}
		waitFor(t, "usage to count every charge", 30e9, func() bool {
			out, _, err := clientCmd(t, bin, env, "", "usage", "--json", "--group-by", "endpoint")
			return err == nil && json.Unmarshal([]byte(out), &u) == nil && u.Totals.Calls >= 8
		})
		if u.Totals.Calls != 8 { // eval ×2, bestmove, 5 positions
			t.Errorf("usage counts %d calls, want 8", u.Totals.Calls)
		}
		out, stderr, err := clientCmd(t, bin, env, "", "usage", "--group-by", "endpoint")
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		for _, row := range []string{`(?m)^ *ENDPOINT +CALLS +UNITS +USD`, `(?m)^ *eval +2 +\d+ +\d+\.\d{6}`,
			`(?m)^ *bestmove +1 +\d+`, `(?m)^ *analyze +5 +\d+`, `(?m)^ *TOTAL +8 +\d+`} {
			if !regexp.MustCompile(row).MatchString(out) {
				t.Errorf("table lacks %s:\n%s", row, out)
			}
		}
		usageAligned(t, out)
	})

	t.Run("usage without groups", func(t *testing.T) {
		out, stderr, err := clientCmd(t, bin, env, "", "usage", "--group-by", "")
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		if !regexp.MustCompile(`(?m)^ *TOTAL +8 +\d+ +\d+\.\d{6}`).MatchString(out) {
			t.Errorf("no total row:\n%s", out)
		}
		usageAligned(t, out)
	})

	t.Run("usage of the test book", func(t *testing.T) {
		// the calls above were the live key's: its test book is empty, and asked for
		out, stderr, err := clientCmd(t, bin, env, "", "usage", "--env", "test", "--json")
		var u struct {
			Totals struct {
				Calls int `json:"calls"`
			} `json:"totals"`
		}
		if err != nil || json.Unmarshal([]byte(out), &u) != nil || u.Totals.Calls != 0 {
			t.Fatalf("usage --env test: %v %+v\n%s%s", err, u, out, stderr)
		}
		if _, stderr, err := clientCmd(t, bin, env, "", "usage", "--env", "both"); err == nil || !strings.Contains(stderr, "env") {
			t.Fatalf("usage --env both: %v\n%s", err, stderr)
		}
	})

	t.Run("server and key from the config file, flags first", func(t *testing.T) {
		cfg := filepath.Join(t.TempDir(), "client.json")
		body, _ := json.Marshal(map[string]string{"server": srv.base, "key": su.Secret})
		if err := os.WriteFile(cfg, body, 0o600); err != nil {
			t.Fatal(err)
		}
		noEnv := []string{"CHESSD_SERVER=", "CHESSD_KEY=", "CHESSD_CONFIG=" + cfg}
		out, stderr, err := clientCmd(t, bin, noEnv, "", "usage", "--json")
		if err != nil || !strings.Contains(out, `"totals"`) {
			t.Fatalf("with the config file: %v\n%s%s", err, out, stderr)
		}
		// a flag beats the file: a wrong key is refused by the server
		_, stderr, err = clientCmd(t, bin, noEnv, "", "usage", "--key", "ce_test_wrong", "--json")
		if err == nil || !strings.Contains(stderr, "401") {
			t.Fatalf("--key did not replace the file's key: %v\n%s", err, stderr)
		}
	})
}

// usageAligned fails t unless each number of the usage table's TOTAL row ends where
// its column's header does (the columns are aligned right).
func usageAligned(t *testing.T, table string) {
	t.Helper()
	header := regexp.MustCompile(`(?m)^.*CALLS.*$`).FindString(table)
	total := regexp.MustCompile(`(?m)^ *TOTAL .*$`).FindString(table)
	heads := regexp.MustCompile(`CALLS|UNITS|NET USD|USD|CREDITED`).FindAllStringIndex(header, -1)
	cells := regexp.MustCompile(`\S+`).FindAllStringIndex(total, -1)
	if len(heads) != 5 || len(cells) < 6 {
		t.Fatalf("no header or total row:\n%s", table)
	}
	cells = cells[len(cells)-5:] // the label (and the blank group cells) before them
	for i, h := range heads {
		if h[1] != cells[i][1] {
			t.Errorf("%s ends at %d, its total at %d:\n%s", header[h[0]:h[1]], h[1], cells[i][1], table)
		}
	}
}

// `jobs watch` follows a job to its end across what cuts its event stream: a 429 for
// an account holding its maximum of streams is waited out for its Retry-After, and a
// server's restart (which ends its streams) is outlasted, the stream resumed with
// Last-Event-ID (no event shown twice). The job runs on a worker started only after the
// restart, so it cannot end before the cuts.
func TestJobsWatchFollowsAcrossCuts(t *testing.T) {
	bin := buildBinary(t)
	dbURL := pgtest.URL(t)
	pool, su := account(t, dbURL, "watch-cuts@example.com", domain.PlanPro)
	port := freePort(t)
	srv := startServer(t, bin, dbURL, port, "CHESSD_WORKER_JOBS=0")
	jobID := submitGame(t, srv, su.Secret, 6)

	// Every stream slot of the account held, on the queued job.
	ctx, release := context.WithCancel(context.Background())
	var held sync.WaitGroup
	defer func() { release(); held.Wait() }()
	for range httpapi.StreamsPerAccount {
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.base+"/jobs/"+jobID+"/events", nil)
		req.Header.Set("Authorization", "Bearer "+su.Secret)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != http.StatusOK {
			res.Body.Close()
			t.Fatalf("holding a stream: %d", res.StatusCode)
		}
		held.Add(1)
		go func() {
			defer held.Done()
			io.Copy(io.Discard, res.Body) //nolint:errcheck // ends with release
			res.Body.Close()
		}()
	}

	cmd := exec.Command(bin, "jobs", "watch", jobID)
	cmd.Env = append(os.Environ(), "CHESSD_SERVER="+srv.base, "CHESSD_KEY="+su.Secret, "CHESSD_CONFIG=", "HOME="+t.TempDir())
	var stdout, stderr syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	exited := startProcess(t, cmd)
	says := func(what, re string) {
		t.Helper()
		waitFor(t, what, time.Minute, func() bool {
			select {
			case err := <-exited:
				exited <- err
				t.Fatalf("the watch ended (%v) before %s:\n%s\n%s", err, what, stderr.String(), stdout.String())
			default:
			}
			return regexp.MustCompile(re).MatchString(stderr.String())
		})
	}
	says("the watch to wait out the 429", `429 Too many requests.*; reconnecting in 5s`)
	release()
	held.Wait()
	queued := `(?m)^` + jobID + ` queued  0/30 positions`
	says("the watch to show the queued job", queued)

	srv.stop(t) // ends the watch's stream
	says("the watch to reconnect", `(?s)`+queued+`.*reconnecting in`)
	srv = startServer(t, bin, dbURL, port, "CHESSD_WORKER_JOBS=0")
	var state string
	if err := pool.QueryRow(context.Background(), `SELECT state FROM jobs WHERE job_id = $1`, jobID).Scan(&state); err != nil || state != "queued" {
		t.Fatalf("the job is %q (%v) after the restart: it must still be queued", state, err)
	}
	startWorker(t, bin, dbURL, "watch-cuts")

	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the watch failed: %v\n%s\n%s", err, stderr.String(), stdout.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("the watch did not end:\n%s", stderr.String())
	}
	out := stdout.String()
	if !regexp.MustCompile(`(?m)^` + jobID + `: succeeded, 30/30 positions`).MatchString(out) {
		t.Errorf("no summary of the finished job:\n%s", out)
	}
	if rows := regexp.MustCompile(`(?m)^\d+ +\S+ +\S+ +\S+ +6 +\d+\.`).FindAllString(out, -1); len(rows) != 30 {
		t.Errorf("%d analysed rows, want 30:\n%s", len(rows), out)
	}
	if n := len(regexp.MustCompile(queued).FindAllString(stderr.String(), -1)); n != 1 {
		t.Errorf("the queued state shown %d times, want once (the reconnect resumes after it):\n%s", n, stderr.String())
	}
}

// `jobs watch` of a job that failed shows its error as the problem it is (decisions.md:
// a job's error is a problem): status, title, detail, code and what to do next. The
// job's key is revoked while it waits for a worker, started only after.
func TestJobsWatchShowsAFailedJobsProblem(t *testing.T) {
	bin := buildBinary(t)
	dbURL := pgtest.URL(t)
	_, su := account(t, dbURL, "watch-failed@example.com", domain.PlanPro)
	srv := startServer(t, bin, dbURL, freePort(t), "CHESSD_WORKER_JOBS=0")
	call := func(method, path, key, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var out map[string]any
		json.NewDecoder(res.Body).Decode(&out) //nolint:errcheck // a 204 has none
		return res.StatusCode, out
	}
	status, k := call("POST", "/keys", su.Secret, `{"scopes":["jobs"]}`)
	if status != 201 {
		t.Fatalf("POST /keys: %d %v", status, k)
	}
	jobID := submitGame(t, srv, k["api_key"].(string), 6)
	if status, body := call("DELETE", "/keys/"+k["key_id"].(string), su.Secret, ""); status != 204 {
		t.Fatalf("revoking the job's key: %d %v", status, body)
	}
	startWorker(t, bin, dbURL, "watch-failed")
	env := []string{"CHESSD_SERVER=" + srv.base, "CHESSD_KEY=" + su.Secret, "CHESSD_CONFIG=", "HOME=" + t.TempDir()}
	out, stderr, err := clientCmd(t, bin, env, "", "jobs", "watch", jobID)
	if err == nil || !strings.Contains(stderr, "job failed") {
		t.Errorf("watching a failed job: %v\n%s", err, stderr)
	}
	_, job := call("GET", "/jobs/"+jobID, su.Secret, "")
	p, _ := job["error"].(map[string]any)
	if job["state"] != "failed" || p == nil {
		t.Fatalf("the job: %v", job)
	}
	want := "error: 401 Invalid API key: " + p["detail"].(string) + " (bad_credential; next: fix_request)\n"
	if !strings.Contains(out, want) {
		t.Errorf("jobs watch of the failed job printed\n%s\nwant the line %q", out, want)
	}
}
