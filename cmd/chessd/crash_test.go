package main

import (
	"context"
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

func startServer(t *testing.T, bin, dbURL string, port int) *server {
	t.Helper()
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, fmt.Sprintf("PORT=%d", port), "LOG_LEVEL=error",
		"CHESSD_KEY_PEPPER=crash-test-pepper-0123456789", "CHESSD_RATE_LIMITS=off", "CHESSD_ENGINE_POOL_SIZE=1",
		"CHESSD_DATA_DIR="+t.TempDir())
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, cmd: cmd, base: fmt.Sprintf("http://127.0.0.1:%d/v1", port)}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck // may be dead already
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := http.Get(s.base + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("server did not become ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// call is one request of the load, identified by its Idempotency-Key.
type call struct {
	idem, body string
	ok         bool // the client saw a 200
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
// idempotency keys, restarted, and the client retries what got no answer: every call
// the client saw succeed is charged exactly once, and nothing else is charged.
func TestCrashMidLoadChargesExactlyOnce(t *testing.T) {
	bin := buildBinary(t)
	dbURL := pgtest.URL(t)
	port := freePort(t)
	srv := startServer(t, bin, dbURL, port)
	ctx := context.Background()

	pool := pgtest.NewDBAt(t, dbURL)
	h := commands.New(eventstore.NewStore(pool, nil), []byte("crash-test-pepper-0123456789"))
	su, err := h.Signup(ctx, domain.Signup{Email: "crash@example.com"}, "req")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.ChangePlan(ctx, su.AccountID, domain.PlanPro, "crash test"); err != nil {
		t.Fatal(err)
	}
	fens := []string{
		"r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
		"rnbqkb1r/pp3ppp/4pn2/2pp4/3P4/2P1PN2/PP3PPP/RNBQKB1R w KQkq - 0 5",
		"rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1",
	}
	calls := make([]*call, 400)
	for i := range calls {
		calls[i] = &call{idem: fmt.Sprintf("load-%03d", i), body: fmt.Sprintf(`{"fen":%q,"depth":%d}`, fens[i%3], 6+i%3)}
	}
	var mu sync.Mutex
	done := 0
	next := 0
	killed := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if next >= len(calls) {
					mu.Unlock()
					return
				}
				c := calls[next]
				next++
				mu.Unlock()
				status, err := srv.post(c, su.Secret)
				mu.Lock()
				if err == nil && status == 200 {
					c.ok = true
				}
				done++
				if done == 150 {
					srv.cmd.Process.Signal(syscall.SIGKILL) //nolint:errcheck // the point of the test
					close(killed)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	<-killed
	srv.cmd.Wait() //nolint:errcheck // killed
	answered := 0
	for _, c := range calls {
		if c.ok {
			answered++
		}
	}
	if answered < 100 || answered == len(calls) {
		t.Fatalf("%d of %d calls answered before the kill: the kill did not land mid-load", answered, len(calls))
	}

	srv = startServer(t, bin, dbURL, port)
	for _, c := range calls {
		if c.ok {
			continue
		}
		status, err := srv.post(c, su.Secret)
		if err != nil || status != 200 {
			t.Fatalf("retry of %s: %d %v", c.idem, status, err)
		}
		c.ok = true
	}
	// every call was seen to succeed exactly once by now: one charge each, no others
	rows, err := pool.Query(ctx, `SELECT metadata->>'idempotency_key', count(*) FROM events
		WHERE stream_id = $1 GROUP BY 1`, "ledger-"+su.KeyID)
	if err != nil {
		t.Fatal(err)
	}
	perKey := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		perKey[k] = n
	}
	if len(perKey) != len(calls) {
		t.Fatalf("%d idempotency keys charged, want %d", len(perKey), len(calls))
	}
	for _, c := range calls {
		if perKey[c.idem] != 1 {
			t.Fatalf("%s charged %d times", c.idem, perKey[c.idem])
		}
	}
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
		t.Fatalf("chain after the crash: %v %s", err, out)
	}
}
