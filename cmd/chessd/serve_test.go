package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"chessd/auth"
	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/ledger"
	"chessd/postgres/pgtest"
	"chessd/syncbuf"
)

// stopRig is a server as serve stops it (stopServing): a stream that ends when the
// server ends its streams (as httpapi.Server.EndStreams ends the job event streams,
// TestEndStreamsEndsJobEventStreams), a meter on a fresh database, and an account's
// key to charge.
type stopRig struct {
	t          *testing.T
	srv        *http.Server
	base       string
	client     *http.Client
	endStreams func()
	meter      *ledger.Meter
	count      func() int // the key's charges
	running    *inFlight
	log        syncbuf.Buffer // stopServing's log
}

// newStopRig serves GET /stream (an event stream open until the streams end) and POST /search (a costed call: reserved, answered when answer is closed,
// settled; 503 when the meter refuses the settle).
func newStopRig(t *testing.T, searching chan<- struct{}, answer <-chan struct{}) *stopRig {
	t.Helper()
	pool := pgtest.NewDB(t)
	ctx := context.Background()
	store := eventstore.NewStore(pool, nil)
	pepper := []byte("pepper-for-the-stop-test")
	su, err := commands.New(store, pepper).Signup(ctx, domain.Signup{Email: "stop@example.com"}, "req")
	if err != nil {
		t.Fatal(err)
	}
	key, acct, err := auth.NewAuthenticator(pool, pepper).Authenticate(ctx, su.Secret)
	if err != nil {
		t.Fatal(err)
	}
	meterCtx, stopMeter := context.WithCancel(ctx)
	meter := ledger.NewMeter(meterCtx, store, nil, ledger.MeterConfig{})
	t.Cleanup(func() { stopMeter(); <-meter.Done() })
	streams, endStreams := context.WithCancel(ctx)
	t.Cleanup(endStreams)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /stream", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, "retry: 1000\n\n")
		http.NewResponseController(w).Flush() //nolint:errcheck // the test reads it
		select {
		case <-r.Context().Done():
		case <-streams.Done():
		}
	})
	mux.HandleFunc("POST /search", func(w http.ResponseWriter, r *http.Request) {
		res, err := meter.Reserve(r.Context(), ledger.Call{RequestID: "req-search", Key: key, Account: acct,
			Price: domain.Call{Endpoint: domain.EndpointEval, Depth: 8, MultiPV: 1, Positions: 1}})
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		searching <- struct{}{}
		<-answer
		if err := res.Settle(ledger.Answered{Endpoint: domain.EndpointEval, Engine: "sf-17.1", Path: "native",
			Params: ledger.Params{Depth: 8, MultiPV: 1, Positions: 1}}); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "answer")
	})
	running := &inFlight{h: mux}
	srv := &http.Server{Handler: running}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown
	t.Cleanup(func() { srv.Close() })
	// not http.DefaultTransport: TestMain checks its traffic against chessd's OpenAPI
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	return &stopRig{t: t, srv: srv, running: running, base: "http://" + ln.Addr().String(), client: client, endStreams: endStreams, meter: meter,
		count: func() int {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM charge_lines() WHERE key_id = $1`, key.ID()).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}}
}

type reply struct {
	status int
	body   string
	err    error
}

// search posts /search and returns where its reply will come.
func (s *stopRig) search() <-chan reply {
	replied := make(chan reply, 1)
	go func() {
		resp, err := s.client.Post(s.base+"/search", "text/plain", nil)
		if err != nil {
			replied <- reply{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		replied <- reply{resp.StatusCode, string(b), err}
	}()
	return replied
}

// stop runs stopServing with grace and returns a channel closed once it has returned.
func (s *stopRig) stop(grace time.Duration) <-chan struct{} {
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		stopServing(s.srv, s.running, s.endStreams, s.meter, grace, slog.New(slog.NewTextHandler(&s.log, nil)))
	}()
	return stopped
}

// A stopping server ends its open event streams at once (they held its stop for 15 s),
// waits for a search still running, and stops the meter only once that search has been
// answered: its charge is committed before stopServing returns.
func TestStopServingEndsStreamsAndChargesRunningCalls(t *testing.T) {
	searching, answer := make(chan struct{}, 1), make(chan struct{})
	s := newStopRig(t, searching, answer)
	resp, err := s.client.Get(s.base + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || line != "retry: 1000\n" {
		t.Fatalf("stream: %q %v", line, err)
	}
	replied := s.search()
	pgtest.Within(t, "the search to be reserved", searching)
	stopped := s.stop(time.Minute)
	ended := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, resp.Body); ended <- err }()
	if err := pgtest.Within(t, "the event stream to end", ended); err != nil {
		t.Fatalf("the event stream ended with %v, want its end", err)
	}
	select {
	case <-stopped:
		t.Fatal("stopServing returned while a search was running")
	case <-s.meter.Done():
		t.Fatal("the meter stopped while a search was running")
	default:
	}
	close(answer)
	if r := pgtest.Within(t, "the search's reply", replied); r.err != nil || r.status != http.StatusOK || r.body != "answer" {
		t.Fatalf("the search answered %d %q %v, want 200", r.status, r.body, r.err)
	}
	pgtest.Within(t, "stopServing to return", stopped)
	if n := s.count(); n != 1 {
		t.Fatalf("%d charges once stopped, want the search answered while stopping charged", n)
	}
}

// A search still running when the grace is over is not answered free: the meter has
// stopped, its Settle is refused and its client told to retry (503), nothing charged.
func TestStopServingAfterTheGraceChargesNothingAnsweredLate(t *testing.T) {
	searching, answer := make(chan struct{}, 1), make(chan struct{})
	s := newStopRig(t, searching, answer)
	replied := s.search()
	pgtest.Within(t, "the search to be reserved", searching)
	pgtest.Within(t, "stopServing to give up waiting", s.stop(100*time.Millisecond))
	close(answer) // answered after the meter's final drain
	r := pgtest.Within(t, "the search's reply", replied)
	if r.err != nil || r.status != http.StatusServiceUnavailable {
		t.Fatalf("the late search answered %d %q %v, want 503", r.status, r.body, r.err)
	}
	if n := s.count(); n != 0 {
		t.Fatalf("%d charges for a call whose answer was withheld, want 0", n)
	}
	if log := s.log.String(); !strings.Contains(log, "requests still running after the grace") || !strings.Contains(log, "running=1") {
		t.Fatalf("stopping past the grace logged %q, want the one request still running named", log)
	}
}

// SIGTERM during startup stops serve and worker quietly, exit status 0: the engines'
// handshakes it cut short are not reported as broken engines ("no working engine … run
// make engines"). The engine here answers nothing and says when it was started, so the
// signal comes while its handshake is awaited.
func TestStopDuringStartup(t *testing.T) {
	bin := buildBinary(t)
	dbURL := pgtest.URL(t)
	for _, command := range []string{"serve", "worker"} {
		t.Run(command, func(t *testing.T) {
			engines := t.TempDir()
			started := filepath.Join(engines, "started")
			if err := os.Mkdir(filepath.Join(engines, "sf-99.0"), 0o755); err != nil {
				t.Fatal(err)
			}
			script := fmt.Sprintf("#!/bin/sh\ntouch %q\nexec sleep 30\n", started)
			if err := os.WriteFile(filepath.Join(engines, "sf-99.0", "stockfish"), []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(bin, command)
			cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, fmt.Sprintf("PORT=%d", freePort(t)), "LOG_LEVEL=info",
				"CHESSD_ENGINES_DIR="+engines, "CHESSD_ENGINE_POOL_SIZE=1", "CHESSD_DATA_DIR="+t.TempDir(),
				"CHESSD_KEY_PEPPER=stop-test-pepper-0123456789") // one for both: the database keeps the first
			var logs syncbuf.Buffer
			cmd.Stderr = &logs
			exited := startProcess(t, cmd)
			waitFor(t, "the engine's handshake", time.Minute, func() bool {
				select {
				case err := <-exited:
					t.Fatalf("%s exited (%v) before it started the engine:\n%s", command, err, logs.String())
				default:
				}
				_, err := os.Stat(started)
				return err == nil
			})
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			var err error
			select {
			case err = <-exited:
			case <-time.After(time.Minute):
				t.Fatalf("%s did not stop:\n%s", command, logs.String())
			}
			out := logs.String()
			if err != nil || !strings.Contains(out, "stopped during startup") || strings.Contains(out, "does not answer") ||
				strings.Contains(out, "make engines") {
				t.Fatalf("%s stopped during startup: %v, want exit 0 and no blame on the engines; logged:\n%s", command, err, out)
			}
		})
	}
}

// serve binds its port before it says "serving": a port in use is an error, with no
// "serving" logged first.
func TestServeOnABusyPort(t *testing.T) {
	bin := buildBinary(t)
	busy, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "serve")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+pgtest.URL(t), fmt.Sprintf("PORT=%d", busy.Addr().(*net.TCPAddr).Port),
		"LOG_LEVEL=info", "CHESSD_ENGINE_POOL_SIZE=1", "CHESSD_KEY_PEPPER=busy-test-pepper-0123456789", "CHESSD_DATA_DIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "address already in use") || strings.Contains(string(out), `"msg":"serving"`) {
		t.Fatalf("serve on a port in use: %v, want an error and no \"serving\" logged:\n%s", err, out)
	}
}

// A worker without CHESSD_WORKER_NAME logs the name it runs under, host:pid, as the
// jobs record it.
func TestWorkerLogsItsName(t *testing.T) {
	bin := buildBinary(t)
	w := exec.Command(bin, "worker")
	w.Env = append(os.Environ(), "DATABASE_URL="+pgtest.URL(t), "LOG_LEVEL=info", "CHESSD_KEY_PEPPER=name-test-pepper-0123456789",
		"CHESSD_ENGINE_POOL_SIZE=1", "CHESSD_WORKER_NAME=", "CHESSD_DATA_DIR="+t.TempDir())
	stderr, err := w.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Process.Signal(syscall.SIGTERM); w.Wait() }) //nolint:errcheck // stopping
	var logged []string
	for sc := bufio.NewScanner(stderr); sc.Scan(); {
		logged = append(logged, sc.Text())
		var line struct{ Msg, Worker string }
		if json.Unmarshal(sc.Bytes(), &line) != nil || line.Msg != "worker running" {
			continue
		}
		host, _ := os.Hostname()
		if want := fmt.Sprintf("%s:%d", host, w.Process.Pid); line.Worker != want {
			t.Fatalf("worker running as %q, want %q", line.Worker, want)
		}
		return
	}
	t.Fatalf("no \"worker running\" logged:\n%s", strings.Join(logged, "\n"))
}

// startProcess starts cmd and returns its exit status, once it ends (a receiver may put it
// back for another); the test's cleanup kills it if it still runs then.
func startProcess(t *testing.T, cmd *exec.Cmd) chan error {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill() //nolint:errcheck // the test failed with it running
			<-exited
		}
	})
	return exited
}
