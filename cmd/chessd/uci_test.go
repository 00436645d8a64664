package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"chessd/client"
	"chessd/domain"
	"chessd/domain/position"
	"chessd/postgres/pgtest"
	"chessd/ucibridge"
)

// uciDriverOut is what testdata/uci_driver.js reports.
type uciDriverOut struct {
	ID       map[string]string `json:"id"`
	Options  map[string]any    `json:"options"`
	Analysis struct {
		Bestmove string `json:"bestmove"`
		Info     []struct {
			Depth   int    `json:"depth"`
			MultiPV int    `json:"multipv"`
			PV      string `json:"pv"`
			Score   *struct {
				Unit  string  `json:"unit"`
				Value float64 `json:"value"`
			} `json:"score"`
		} `json:"info"`
	} `json:"analysis"`
	Game []struct {
		Bestmove string `json:"bestmove"`
		Infos    int    `json:"infos"`
	} `json:"game"`
	Infinite struct {
		Moves    []string `json:"moves"`
		Depths   []int    `json:"depths"`
		Bestmove string   `json:"bestmove"`
	} `json:"infinite"`
}

// The UCI bridge driven by node-uci, a UCI client written by others (python-chess
// cannot be installed here): `chessd uci` against a real server with real engines
// analyses a position with MultiPV 2 to depth 12, plays a short game, and stops an
// infinite search, which is not charged.
func TestUCIBridgeDrivenByNodeUCI(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is needed to drive the bridge with node-uci:", err)
	}
	modules, _ := filepath.Abs("../../web/node_modules")
	if _, err := os.Stat(filepath.Join(modules, "node-uci")); err != nil {
		t.Fatal("node-uci is not installed: run `make web` (web/package.json pins it)")
	}
	bin := buildBinary(t)
	dbURL := pgtest.URL(t)
	_, su := account(t, dbURL, "uci@example.com", domain.PlanPro) // pro: an infinite search goes to depth 30
	srv := startServer(t, bin, dbURL, freePort(t))

	// node-uci starts the engine without arguments: a script that runs `chessd uci`.
	engine := filepath.Join(t.TempDir(), "chessd-uci")
	if err := os.WriteFile(engine, []byte("#!/bin/sh\nexec \""+bin+"\" uci\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "testdata/uci_driver.js", engine)
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules, "CHESSD_SERVER="+srv.base, "CHESSD_KEY="+su.Secret)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node-uci driver: %v\nstderr: %s\nstdout: %s", err, stderr.Bytes(), stdout.Bytes())
	}
	var out uciDriverOut
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("driver output: %v\n%s", err, stdout.Bytes())
	}

	if out.ID["name"] == "" {
		t.Errorf("no engine name: %+v", out.ID)
	}
	for _, name := range []string{"MultiPV", "Hash", "UCI_ShowWDL", "UCI_Elo", "Engine", "Key", "Server"} {
		if _, ok := out.Options[name]; !ok {
			t.Errorf("option %s not offered: %v", name, out.Options)
		}
	}

	// 1. MultiPV 2 to depth 12: both lines at depth 12, and a legal best move.
	analysed := "r1bqkbnr/pppp1ppp/2n5/1B2p3/4P3/5N2/PPPP1PPP/RNBQK2R b KQkq - 3 3"
	lines := map[int]bool{}
	for _, in := range out.Analysis.Info {
		if in.Depth == 12 && in.PV != "" && in.Score != nil {
			lines[in.MultiPV] = true
		}
	}
	if !lines[1] || !lines[2] {
		t.Errorf("depth 12 did not report both lines (got multipv %v): %+v", lines, out.Analysis.Info)
	}
	legal(t, analysed, nil, out.Analysis.Bestmove)

	// 2. The game: every move legal where it was played, each search reporting depths.
	if len(out.Game) != 6 {
		t.Fatalf("the game has %d plies, want 6", len(out.Game))
	}
	var played []string
	for i, ply := range out.Game {
		legal(t, "startpos", played, ply.Bestmove)
		if ply.Infos == 0 {
			t.Errorf("ply %d: no info line", i+1)
		}
		played = append(played, ply.Bestmove)
	}

	// 3. The infinite search: stopped with a legal move after increasing depths.
	inf := out.Infinite
	if len(inf.Depths) < 3 || inf.Depths[0] >= inf.Depths[2] {
		t.Errorf("infinite search depths %v", inf.Depths)
	}
	legal(t, "startpos", inf.Moves, inf.Bestmove)

	// The ledger: the analysis and the 6 plies are charged, the stopped search is not.
	// A last call after it is the marker: once usage shows it, an infinite search's
	// charge would show too.
	api, err := client.NewClientWithResponses(srv.base, client.WithKey(su.Secret))
	if err != nil {
		t.Fatal(err)
	}
	depth := 1
	res, err := api.EvalWithResponse(ctx, nil, client.EvalRequest{Fen: "8/8/8/4k3/8/8/4P3/4K3 w - - 0 1", Depth: &depth})
	if err != nil || client.Check(res.HTTPResponse, res.Body) != nil {
		t.Fatalf("marker call: %v %s", err, res.Body)
	}
	calls := usageCalls(t, api, 8)
	if calls != 8 {
		t.Errorf("usage shows %d calls, want 8 (1 analysis + 6 plies + the marker; the stopped infinite search is free)", calls)
	}
}

// legal fails t unless move is legal after moves from fen ("startpos" for the start).
func legal(t *testing.T, fen string, moves []string, move string) {
	t.Helper()
	if fen == "startpos" {
		fen = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
	}
	pos, err := position.Parse(fen, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range moves {
		if pos, _, err = pos.Play(m); err != nil {
			t.Fatalf("replaying %v: %v", moves, err)
		}
	}
	if _, _, err := pos.Play(move); err != nil {
		t.Errorf("bestmove %q after %v is not legal: %v", move, moves, err)
	}
}

// usageCalls waits until GET /usage counts at least want calls today (the usage read
// model follows the charges within moments) and returns the count.
func usageCalls(t *testing.T, api *client.ClientWithResponses, want int) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := api.GetUsageWithResponse(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := client.Check(res.HTTPResponse, res.Body); err != nil {
			t.Fatal(err)
		}
		if n := res.JSON200.Totals.Calls; n >= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// uciSession is an in-process bridge on pipes, for the cases node-uci does not reach.
type uciSession struct {
	t     *testing.T
	in    *io.PipeWriter
	lines chan string
	done  chan error
}

func newUCISession(t *testing.T, cfg ucibridge.Config) *uciSession {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	s := &uciSession{t: t, in: inW, lines: make(chan string, 1000), done: make(chan error, 1)}
	go func() {
		s.done <- ucibridge.New(cfg).Run(context.Background(), inR, outW)
		outW.Close()
	}()
	go func() {
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
		close(s.lines)
	}()
	t.Cleanup(func() { inW.Close() })
	return s
}

func (s *uciSession) send(cmd string) {
	s.t.Helper()
	if _, err := io.WriteString(s.in, cmd+"\n"); err != nil {
		s.t.Fatal(err)
	}
}

// until returns the lines up to and including the first that match wants, failing the
// test after a deadline.
func (s *uciSession) until(match func(string) bool) []string {
	s.t.Helper()
	var seen []string
	deadline := time.After(time.Minute)
	for {
		select {
		case l, ok := <-s.lines:
			if !ok {
				s.t.Fatalf("the bridge ended; it said:\n%s", strings.Join(seen, "\n"))
			}
			seen = append(seen, l)
			if match(l) {
				return seen
			}
		case <-deadline:
			s.t.Fatalf("no such line; the bridge said:\n%s", strings.Join(seen, "\n"))
		}
	}
}

func prefix(p string) func(string) bool {
	return func(l string) bool { return strings.HasPrefix(l, p) }
}

// The bridge in process against a real server: the keyless caps, a finished game
// answered without a call, refusals told as info string, isready during a search, and
// quit in the middle of one, or quit or stop before its first depth.
func TestUCIBridgeCases(t *testing.T) {
	bin := buildBinary(t)
	dbURL := pgtest.URL(t)
	_, su := account(t, dbURL, "uci-cases@example.com", domain.PlanPro) // before the server: its read models have it
	_, free := account(t, dbURL, "uci-free@example.com", domain.PlanFree)
	_, quitter := account(t, dbURL, "uci-quit@example.com", domain.PlanPro)
	_, busy := account(t, dbURL, "uci-busy@example.com", domain.PlanPro)
	port := freePort(t)
	const metricsToken = "uci-cases-metrics-token"
	// One engine (startServer's pool), for which a search may queue long enough for a
	// quit to come before its first depth.
	srv := startServer(t, bin, dbURL, port, "CHESSD_ENGINE_QUEUE_WAIT=60s", "CHESSD_METRICS_TOKEN="+metricsToken)

	t.Run("an eval-only key of the free plan: a search over its cap is searched within it", func(t *testing.T) {
		// GET /me needs usage:read, so the bridge cannot read the plan's caps: it learns
		// depth 20 from the server's refusal of 25 and asks again.
		req, _ := http.NewRequest("POST", srv.base+"/keys", strings.NewReader(`{"label":"bridge","scopes":["eval"]}`))
		req.Header.Set("Authorization", "Bearer "+free.Secret)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var created struct {
			APIKey string `json:"api_key"`
		}
		err = json.NewDecoder(res.Body).Decode(&created)
		res.Body.Close()
		if err != nil || res.StatusCode != http.StatusCreated || created.APIKey == "" {
			t.Fatalf("an eval-only key: %d %v", res.StatusCode, err)
		}
		s := newUCISession(t, ucibridge.Config{Server: srv.base, Key: created.APIKey})
		s.send("uci")
		s.until(prefix("uciok"))
		s.send("position startpos")
		s.send("go depth 25")
		lines := s.until(prefix("bestmove"))
		if last := lines[len(lines)-2]; !strings.HasPrefix(last, "info depth 20 ") {
			t.Errorf("the last info is not depth 20 (the free plan's cap): %q", last)
		}
		legal(t, "startpos", nil, strings.Fields(lines[len(lines)-1])[1])
	})

	t.Run("keyless: depth within the keyless cap, scores for the side to move", func(t *testing.T) {
		s := newUCISession(t, ucibridge.Config{Server: srv.base})
		s.send("uci")
		s.until(prefix("uciok"))
		s.send("position startpos moves e2e4")
		s.send("go depth 25")
		lines := s.until(prefix("bestmove"))
		last := lines[len(lines)-2]
		if !strings.HasPrefix(last, "info depth 12 ") {
			t.Errorf("the last info is not depth 12 (the keyless cap): %q", last)
		}
		// Black to move after 1.e4: White's small edge is a negative score for Black.
		if !regexp.MustCompile(`score cp -\d+`).MatchString(last) {
			t.Errorf("score is not Black's view: %q", last)
		}
		legal(t, "startpos", []string{"e2e4"}, strings.Fields(lines[len(lines)-1])[1])
	})

	t.Run("every go gets a bestmove: an overrun clock, a value it cannot read, a position it cannot read", func(t *testing.T) {
		s := newUCISession(t, ucibridge.Config{Server: srv.base, Key: su.Secret})
		s.send("uci")
		s.until(prefix("uciok"))
		s.send("position startpos moves e2e4")
		s.send("go wtime -35 btime 12000") // a GUI's clock once the engine overran its time
		lines := s.until(prefix("bestmove"))
		legal(t, "startpos", []string{"e2e4"}, strings.Fields(lines[len(lines)-1])[1])
		s.send("go depth abc movetime 200")
		lines = s.until(prefix("bestmove"))
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "info string") && strings.Contains(l, "abc") }) {
			t.Errorf("the unreadable depth is not told: %q", lines)
		}
		legal(t, "startpos", []string{"e2e4"}, strings.Fields(lines[len(lines)-1])[1])
		s.send("position startpos xyz")
		s.send("go depth 5")
		if lines = s.until(prefix("bestmove")); lines[len(lines)-1] != "bestmove (none)" {
			t.Errorf("a search of the position before an unreadable one: %q", lines)
		}
	})

	t.Run("a finished game needs no call", func(t *testing.T) {
		s := newUCISession(t, ucibridge.Config{Server: "http://127.0.0.1:1/v1"}) // nothing listens there
		s.send("position fen 6k1/5ppp/8/8/8/8/5PPP/3R2K1 w - - 0 1 moves d1d8")
		s.send("go depth 5")
		lines := s.until(prefix("bestmove"))
		if got := strings.Join(lines, "|"); got != "info depth 0 score mate 0|bestmove (none)" {
			t.Errorf("checkmate: %q", got)
		}
	})

	t.Run("refusals are told", func(t *testing.T) {
		s := newUCISession(t, ucibridge.Config{Server: srv.base, Key: "ce_test_not_a_key"})
		s.send("uci")
		s.until(prefix("uciok"))
		s.send("setoption name MultiPV value 99")
		if l := s.until(prefix("info string")); !strings.Contains(l[len(l)-1], "MultiPV") {
			t.Errorf("out of range option: %q", l)
		}
		s.send("position startpos moves e2e5")
		if l := s.until(prefix("info string")); !strings.Contains(l[len(l)-1], "e2e5") {
			t.Errorf("illegal move: %q", l)
		}
		s.send("position startpos")
		s.send("go depth 5")
		lines := s.until(prefix("bestmove"))
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "info string 401") }) || lines[len(lines)-1] != "bestmove (none)" {
			t.Errorf("a refused search: %q", lines)
		}
	})

	t.Run("isready mid-search, quit stops it", func(t *testing.T) {
		s := newUCISession(t, ucibridge.Config{Server: srv.base, Key: su.Secret})
		s.send("uci")
		s.until(prefix("uciok"))
		s.send("position startpos")
		s.send("go infinite")
		s.until(prefix("info depth 3 "))
		s.send("isready")
		if lines := s.until(func(l string) bool { return l == "readyok" || strings.HasPrefix(l, "bestmove") }); lines[len(lines)-1] != "readyok" {
			t.Fatalf("isready mid-search: %q", lines)
		}
		s.send("quit")
		s.quits(t)
	})

	t.Run("quit, the end of stdin or stop before the first depth: at once, nothing charged", func(t *testing.T) {
		// Another account's search (long: 10 lines to depth 30) holds the one engine,
		// so the bridge's waits in the server's queue with no depth to show.
		ctx, release := context.WithCancel(context.Background())
		defer release()
		body := `{"fen":"r1bqkbnr/pppp1ppp/2n5/1B2p3/4P3/5N2/PPPP1PPP/RNBQK2R b KQkq - 3 3","depth":30,"multipv":10}`
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.base+"/eval", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+busy.Secret)
		req.Header.Set("Accept", client.MediaNDJSON)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		r := bufio.NewReader(res.Body)
		if line, err := r.ReadString('\n'); err != nil || !strings.Contains(line, `"depth"`) {
			t.Fatalf("the engine holder's search: %d %q %v", res.StatusCode, line, err)
		}
		held := make(chan struct{})
		go func() {
			defer close(held)
			io.Copy(io.Discard, r) //nolint:errcheck // read on (a stream nobody reads is cut); ends with release
		}()
		metrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
		queued := func() float64 { return sample(scrape(t, metrics, metricsToken), "chessd_engine_queue_length", nil) }
		for _, end := range []string{"quit", "the end of stdin", "stop"} {
			s := newUCISession(t, ucibridge.Config{Server: srv.base, Key: quitter.Secret})
			s.send("position startpos moves e2e4 e7e5")
			s.send("go depth 12")
			waitFor(t, "the bridge's search to queue on the server", 30*time.Second, func() bool { return queued() == 1 })
			switch end {
			case "quit":
				s.send("quit")
			case "the end of stdin":
				s.in.Close()
			case "stop": // UCI: bestmove as soon as possible; no depth yet, so a legal move
				start := time.Now()
				s.send("stop")
				lines := s.until(prefix("bestmove"))
				if took := time.Since(start); took > time.Second {
					t.Errorf("stop took %s to answer", took)
				}
				if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "info string stopped before the first depth") }) {
					t.Errorf("the move played is not told: %q", lines)
				}
				legal(t, "startpos", []string{"e2e4", "e7e5"}, strings.Fields(lines[len(lines)-1])[1])
				s.send("quit")
			}
			s.quits(t)
			waitFor(t, "the server to drop the search the bridge left", 10*time.Second, func() bool { return queued() == 0 })
		}
		select {
		case <-held:
			t.Fatal("the engine holder's search ended before the bridges quit: make it longer")
		default:
		}
		release()
		// Nothing of the quitter's is charged: a marker call after is all /usage counts.
		api, err := client.NewClientWithResponses(srv.base, client.WithKey(quitter.Secret))
		if err != nil {
			t.Fatal(err)
		}
		depth := 1
		marker, err := api.EvalWithResponse(context.Background(), nil, client.EvalRequest{Fen: "8/8/8/4k3/8/8/4P3/4K3 w - - 0 1", Depth: &depth})
		if err != nil || client.Check(marker.HTTPResponse, marker.Body) != nil {
			t.Fatalf("marker call: %v %s", err, marker.Body)
		}
		if calls := usageCalls(t, api, 1); calls != 1 {
			t.Errorf("usage shows %d calls, want 1 (the marker; the searches left by quit and stop are free)", calls)
		}
	})
}

// quits fails t unless the bridge ends (nil) at once, and says no bestmove on its way
// out: UCI's quit is an exit, not a stop.
func (s *uciSession) quits(t *testing.T) {
	t.Helper()
	start := time.Now()
	select {
	case err := <-s.done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("quit did not end the bridge")
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the bridge took %s to end", took)
	}
	for l := range s.lines { // closed once the bridge has ended
		if strings.HasPrefix(l, "bestmove") {
			t.Errorf("a %q after quit", l)
		}
	}
}
