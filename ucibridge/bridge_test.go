package ucibridge

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"chessd/client"
	"chessd/domain"
	"chessd/domain/position"
)

// fakeAPI answers GET /engines, GET /me and the streamed POST /eval as the service
// does (the same problem documents, the plans' caps of domain/plans.go), with faults
// on demand. Its searches play the last legal move, so that a move from a search is
// told from the bridge's own (the first legal move).
type fakeAPI struct {
	t    *testing.T
	base string

	plan        domain.Plan // a key's plan
	meAnswers   bool        // GET /me answers (the key holds usage:read); else 403
	meDown      int         // the first meDown GET /me answer 503
	enginesDown int         // the first enginesDown GET /engines answer 503 (-1: all)
	allowance   bool        // the plan's daily allowance is used up: every keyed call is refused (402 plan-limit, no cap named)
	options     []client.EngineOption
	lookupGate  chan struct{} // when set, GET /engines and /me wait for it to close
	searchGate  chan struct{} // when set, a search waits for it to close before its first depth
	stallAfter  int           // with searchGate: the search waits after this depth instead
	started     chan struct{} // told when a search has come
	left        chan struct{} // told when a search's client left before its answer: the service stops it

	mu                  sync.Mutex
	evals               []client.EvalRequest
	meCalls, engineCall int
	answered            int // searches whose answer was produced (charged, with a key)
}

func newFakeAPI(t *testing.T, f *fakeAPI) *fakeAPI {
	t.Helper()
	f.t = t
	if f.plan == (domain.Plan{}) {
		f.plan = domain.PlanPro
	}
	f.started = make(chan struct{}, 100)
	f.left = make(chan struct{}, 100)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/engines", f.engines)
	mux.HandleFunc("GET /v1/me", f.me)
	mux.HandleFunc("POST /v1/eval", f.eval)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	f.base = srv.URL + "/v1"
	return f
}

func problem(w http.ResponseWriter, status int, slug, title, detail string, fields ...domain.FieldError) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	p := map[string]any{"type": "http://chessd.test/v1/problems/" + slug, "title": title,
		"status": status, "detail": detail, "next_action": "retry_after"}
	if len(fields) > 0 {
		p["errors"] = fields
	}
	json.NewEncoder(w).Encode(p) //nolint:errcheck
}

func wait(r *http.Request, gate chan struct{}) {
	if gate != nil {
		select {
		case <-gate:
		case <-r.Context().Done():
		}
	}
}

func (f *fakeAPI) engines(w http.ResponseWriter, r *http.Request) {
	wait(r, f.lookupGate)
	f.mu.Lock()
	f.engineCall++
	down := f.enginesDown < 0 || f.engineCall <= f.enginesDown
	f.mu.Unlock()
	if down {
		problem(w, 503, "engine-unavailable", "Engine unavailable", "restarting")
		return
	}
	e := client.Engines{Default: "sf-17.1", Options: &f.options}
	e.Limits.Depth = client.Range{Min: 1, Max: 30}
	e.Limits.Multipv = client.Range{Min: 1, Max: 10}
	e.Limits.MovetimeMs = client.Range{Min: 50, Max: 60000}
	e.Limits.Keyless.MaxDepth, e.Limits.Keyless.MaxMultipv = 12, 3
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(e) //nolint:errcheck
}

func (f *fakeAPI) me(w http.ResponseWriter, r *http.Request) {
	wait(r, f.lookupGate)
	f.mu.Lock()
	f.meCalls++
	down := f.meCalls <= f.meDown
	f.mu.Unlock()
	switch {
	case down:
		problem(w, 503, "service-unavailable", "Service unavailable", "the database is out of reach for a moment; retry")
	case !f.meAnswers:
		problem(w, 403, "missing-scope", "Scope missing", `this key lacks the scope "usage:read"`)
	default:
		c := f.plan.Limits()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"caps": map[string]int{ //nolint:errcheck
			"max_depth": c.MaxDepth, "max_multipv": c.MaxMultiPV, "max_movetime_ms": c.MaxMoveTimeMS}})
	}
}

func (f *fakeAPI) eval(w http.ResponseWriter, r *http.Request) {
	var req client.EvalRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		problem(w, 400, "invalid-request", "Invalid request", err.Error())
		return
	}
	f.mu.Lock()
	f.evals = append(f.evals, req)
	f.mu.Unlock()
	f.started <- struct{}{}
	depth, multipv, movetime := 12, 1, 0 // the keyless default depth
	if req.Depth != nil {
		depth = *req.Depth
	}
	if req.Multipv != nil {
		multipv = *req.Multipv
	}
	if req.MovetimeMs != nil {
		movetime = *req.MovetimeMs
	}
	if r.Header.Get("Authorization") == "" {
		if depth > 12 || multipv > 3 { // httpapi/eval.go's keylessCaps: the fields above their caps
			var fields []domain.FieldError
			if depth > 12 {
				fields = append(fields, domain.AboveCap("depth", "capped at 12 without a key", 12))
			}
			if multipv > 3 {
				fields = append(fields, domain.AboveCap("multipv", "capped at 3 without a key", 3))
			}
			problem(w, 402, "keyless-allowance-exhausted", "Keyless allowance used up",
				"without a key, depth is capped at 12 and multipv at 3; sign up for a key (POST /v1/signup)", fields...)
			return
		}
	} else if f.allowance {
		problem(w, 402, "plan-limit", "Plan limit", "the plan's daily allowance of units is used up for today (UTC); upgrade for more")
		return
	} else if err := f.plan.Limits().CheckCaps(f.plan, depth, multipv, movetime); err != nil {
		problem(w, 402, "plan-limit", "Plan limit", err.Error(), err.(*domain.Error).Fields...)
		return
	}
	pos, err := position.Parse(string(req.Fen), false)
	if err != nil {
		problem(w, 400, "invalid-request", "Invalid request", err.Error())
		return
	}
	ms := pos.LegalMoves()
	best := ms[len(ms)-1].UCI
	after, _, _ := pos.Play(best)
	line := []string{best, after.LegalMoves()[0].UCI}
	// gone: the client left; the service stops the search, produces no answer and
	// charges nothing
	gone := func() bool {
		if r.Context().Err() != nil {
			f.left <- struct{}{}
			return true
		}
		return false
	}
	if f.stallAfter == 0 {
		if wait(r, f.searchGate); gone() {
			return
		}
	}
	w.Header().Set("Content-Type", client.MediaNDJSON)
	for d := 1; d <= depth; d++ {
		pv := client.PV{Rank: 1, Depth: d, Seldepth: d, Eval: client.Score{Type: client.ScoreTypeCp, Value: 20}, Moves: &line}
		data, _ := json.Marshal(client.DepthProgress{Depth: d, Seldepth: d, Nodes: 100 * d, Nps: 1000, Pvs: []client.PV{pv}})
		fmt.Fprintf(w, `{"event":"depth","data":%s}`+"\n", data)
		w.(http.Flusher).Flush()
		if d == f.stallAfter {
			if wait(r, f.searchGate); gone() {
				return
			}
		}
	}
	data, _ := json.Marshal(client.Evaluation{Bestmove: &line[0], Ponder: &line[1], Depth: depth, CostUsd: "0"})
	fmt.Fprintf(w, `{"event":"result","data":%s}`+"\n", data)
	f.mu.Lock()
	f.answered++
	f.mu.Unlock()
}

// answers is how many searches' answers were produced.
func (f *fakeAPI) answers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.answered
}

// asked is what the searches asked so far: "depth/multipv" each.
func (f *fakeAPI) asked() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, r := range f.evals {
		mpv := 1
		if r.Multipv != nil {
			mpv = *r.Multipv
		}
		out = append(out, fmt.Sprintf("%d/%d", *r.Depth, mpv))
	}
	return out
}

func (f *fakeAPI) last() client.EvalRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.evals) == 0 {
		f.t.Fatal("no search was asked")
	}
	return f.evals[len(f.evals)-1]
}

// session is a bridge on pipes, driven as a GUI drives it.
type session struct {
	t     *testing.T
	in    *io.PipeWriter
	lines chan string
}

func newSession(t *testing.T, cfg Config) *session {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	s := &session{t: t, in: inW, lines: make(chan string, 1000)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		New(cfg).Run(context.Background(), inR, outW) //nolint:errcheck // ends with its input
		// a bridge that ended reads no more: a send fails instead of waiting
		inR.Close()
		outW.Close()
	}()
	go func() {
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
		close(s.lines)
	}()
	t.Cleanup(func() { inW.Close(); <-done })
	return s
}

func (s *session) send(cmds ...string) {
	s.t.Helper()
	for _, c := range cmds {
		if _, err := io.WriteString(s.in, c+"\n"); err != nil {
			s.t.Fatal(err)
		}
	}
}

// until returns the lines up to and including the first that matches, failing the
// test if none comes within d.
func (s *session) until(d time.Duration, match func(string) bool) []string {
	s.t.Helper()
	var seen []string
	deadline := time.After(d)
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
			s.t.Fatalf("no such line within %s; the bridge said:\n%s", d, strings.Join(seen, "\n"))
		}
	}
}

func is(p string) func(string) bool { return func(l string) bool { return strings.HasPrefix(l, p) } }

// searched is the bestmove of a search of the fake (its last legal move) in pos.
func searched(t *testing.T, fen string, moves ...string) string {
	t.Helper()
	pos, err := position.Parse(fen, false)
	for _, m := range moves {
		if err == nil {
			pos, _, err = pos.Play(m)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	ms := pos.LegalMoves()
	return ms[len(ms)-1].UCI
}

func bestOf(lines []string) string { return strings.Fields(lines[len(lines)-1])[1] }

func infoStrings(lines []string) string {
	var out []string
	for _, l := range lines {
		if s, ok := strings.CutPrefix(l, "info string "); ok {
			out = append(out, s)
		}
	}
	return strings.Join(out, " | ")
}

// Every `go` gets a bestmove from a search: a negative clock is time that is up (the
// shortest search), a parameter without a readable number is told and left out, and a
// go the bridge cannot read still stops the search before it.
func TestEveryGoIsAnswered(t *testing.T) {
	f := newFakeAPI(t, &fakeAPI{})
	startFEN := "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
	tests := []struct {
		name     string
		before   []string // sent first, each answered with a bestmove
		line     string
		told     string // in an info string ("" none)
		movetime int    // asked of the service (0: none)
		depth    int
	}{
		{"white's clock below zero", nil, "go wtime -35 btime 12000", "", 50, 12},
		{"black's clock below zero", []string{"position startpos moves e2e4"}, "go wtime 1000 btime -1 winc -5 binc 0", "", 50, 12},
		{"depth not a number", nil, "go depth abc", `go depth: "abc" is not a number`, 0, 12},
		{"negative depth", nil, "go depth -3 movetime 300", `go depth: "-3"`, 300, 12},
		{"movetime without a value", nil, "go movetime", "go movetime: no value", 0, 12},
		{"depth without a value before another", nil, "go depth movetime 300", "go depth: no value", 300, 12},
		{"after an infinite search", []string{"go infinite"}, "go depth x", `go depth: "x"`, 0, 12},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSession(t, Config{Server: f.base})
			var moves []string
			for _, l := range tt.before {
				s.send(l)
				if m, ok := strings.CutPrefix(l, "position startpos moves "); ok {
					moves = strings.Fields(m)
				}
				if l == "go infinite" { // a depth came: its move is the search's
					s.until(5*time.Second, is("info depth "))
				}
			}
			s.send(tt.line)
			if slices.Contains(tt.before, "go infinite") {
				// the infinite search's bestmove first (the new go stopped it), then this one's
				if first := s.until(5*time.Second, is("bestmove")); bestOf(first) != searched(t, startFEN) {
					t.Errorf("the infinite search: %q", first)
				}
			}
			lines := s.until(5*time.Second, is("bestmove"))
			if got := infoStrings(lines); (tt.told == "") != (got == "") || !strings.Contains(got, tt.told) {
				t.Errorf("told %q, want %q", got, tt.told)
			}
			if got, want := bestOf(lines), searched(t, startFEN, moves...); got != want {
				t.Errorf("bestmove %s, want the search's %s: %q", got, want, lines)
			}
			req := f.last()
			movetime := 0
			if req.MovetimeMs != nil {
				movetime = *req.MovetimeMs
			}
			if movetime != tt.movetime || *req.Depth != tt.depth {
				t.Errorf("asked depth %d movetime %d, want %d and %d", *req.Depth, movetime, tt.depth, tt.movetime)
			}
		})
	}
}

// A search refused for a cap is asked again within it, and later searches ask within
// it at once: an eval-only key (GET /me refused) does not leave a plan below pro with
// bestmove (none), nor does keyless use whose GET /engines failed.
func TestCapsLearnedFromRefusals(t *testing.T) {
	tests := []struct {
		name    string
		api     *fakeAPI
		key     string
		multipv string   // the MultiPV option ("" not set)
		first   []string // depth/multipv of each search asked by the first go
		then    []string // by the second
		told    string
		refused bool // no search answers: bestmove (none)
	}{
		{"free plan", &fakeAPI{plan: domain.PlanFree}, "ce_k", "", []string{"30/1", "20/1"}, []string{"20/1"}, "the free plan's cap of 20", false},
		{"hobby plan", &fakeAPI{plan: domain.PlanHobby}, "ce_k", "", []string{"30/1", "26/1"}, []string{"26/1"}, "the hobby plan's cap of 26", false},
		{"free plan, depth and multipv", &fakeAPI{plan: domain.PlanFree}, "ce_k", "5",
			[]string{"30/5", "20/3"}, []string{"20/3"}, "depth 30 is above the free plan's cap of 20 (and 1 more)", false}, // one refusal names both caps
		{"the daily allowance used up: nothing lower is asked", &fakeAPI{plan: domain.PlanHobby, allowance: true}, "ce_k", "",
			[]string{"30/1"}, []string{"30/1"}, "daily allowance", true},
		{"keyless, GET /engines down: the keyless caps", &fakeAPI{enginesDown: -1}, "", "5", []string{"12/3"}, []string{"12/3"}, "multipv 5 above the caps without a key", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeAPI(t, tt.api)
			s := newSession(t, Config{Server: f.base, Key: tt.key})
			if tt.multipv != "" {
				s.send("setoption name MultiPV value " + tt.multipv)
			}
			s.send("position startpos", "go")
			lines := s.until(10*time.Second, is("bestmove"))
			if got := infoStrings(lines); !strings.Contains(got, tt.told) || (tt.told == "") != (got == "") {
				t.Errorf("told %q, want %q", got, tt.told)
			}
			want := "(none)"
			if !tt.refused {
				want = searched(t, "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1")
			}
			if bestOf(lines) != want {
				t.Errorf("bestmove is not the search's %s: %q", want, lines)
			}
			if got := f.asked(); !slices.Equal(got, tt.first) {
				t.Errorf("the first go asked %v, want %v", got, tt.first)
			}
			s.send("go")
			if lines := s.until(10*time.Second, is("bestmove")); bestOf(lines) != want {
				t.Errorf("the second go: %q", lines)
			}
			if got := f.asked()[min(len(tt.first), len(f.asked())):]; !slices.Equal(got, tt.then) {
				t.Errorf("the second go asked %v, want %v (what the refusals taught)", got, tt.then)
			}
		})
	}
}

// The limits are cached only once GET /engines and GET /me answered: a failed read is
// tried again at the next go.
func TestLimitsReadAgainAfterAFailure(t *testing.T) {
	f := newFakeAPI(t, &fakeAPI{plan: domain.PlanHobby, meAnswers: true, meDown: 1, enginesDown: 1})
	s := newSession(t, Config{Server: f.base, Key: "ce_k"})
	for range 3 {
		s.send("go depth 26")
		s.until(10*time.Second, is("bestmove"))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.meCalls != 2 || f.engineCall != 2 {
		t.Errorf("GET /me read %d times, GET /engines %d, want 2 each (once failed, once answered, then cached)", f.meCalls, f.engineCall)
	}
}

// isready is answered while a search is still starting: while its limits are read,
// and while it waits for its first depth. A go that stops it gets the stopped search's
// bestmove at once (a legal move: no depth came), then its own after its own info
// lines.
func TestIsReadyWhileASearchStarts(t *testing.T) {
	startFEN := "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
	for _, slow := range []string{"lookup", "search"} { // what waits until the second go
		t.Run("the first go's "+slow, func(t *testing.T) {
			gate := make(chan struct{})
			api := &fakeAPI{meAnswers: true}
			if slow == "lookup" {
				api.lookupGate = gate
			} else {
				api.searchGate = gate
			}
			f := newFakeAPI(t, api)
			s := newSession(t, Config{Server: f.base, Key: "ce_k"})
			s.send("position startpos", "go depth 3")
			if slow == "search" {
				<-f.started
			}
			s.send("isready")
			lines := s.until(4*time.Second, func(l string) bool { return l == "readyok" || is("bestmove")(l) })
			if lines[len(lines)-1] != "readyok" {
				t.Fatalf("bestmove before readyok: %q", lines)
			}
			s.send("go depth 2")
			lines = s.until(promptly, is("bestmove")) // before the gate opens
			if want := []string{"info string " + stoppedEarly, "bestmove " + firstLegal(t, startFEN)}; !slices.Equal(lines, want) {
				t.Errorf("the stopped search: %q, want %q", lines, want)
			}
			close(gate)
			lines = s.until(10*time.Second, is("bestmove"))
			want := searched(t, startFEN)
			if bestOf(lines) != want {
				t.Errorf("bestmove is not its search's %s: %q", want, lines)
			}
			for _, l := range lines[:len(lines)-1] {
				if !strings.HasPrefix(l, "info depth ") || !strings.Contains(l, " pv "+want+" ") {
					t.Errorf("a line not of its search before its bestmove: %q", lines)
				}
			}
			if !strings.HasPrefix(lines[0], "info depth 1 ") {
				t.Errorf("no info line before its bestmove: %q", lines)
			}
		})
	}
}

// promptly is how soon a stop's bestmove comes: at once, far sooner than any wait for
// the service.
const promptly = time.Second

// firstLegal is the bridge's own move in fen (a search's is its last legal move).
func firstLegal(t *testing.T, fen string, moves ...string) string {
	t.Helper()
	pos, err := position.Parse(fen, false)
	for _, m := range moves {
		if err == nil {
			pos, _, err = pos.Play(m)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	return pos.LegalMoves()[0].UCI
}

// stop, or a command that stops the search (position, ucinewgame, go), is answered at
// once (UCI: bestmove as soon as possible), also before the service reported a depth:
// then with a legal move, said in an info string. The search's request is left at
// once: the service stops it and produces no answer, so nothing is charged. The
// session goes on with the position the GUI gave.
func TestStopAnsweredAtOnce(t *testing.T) {
	startFEN := "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
	tests := []struct {
		name       string
		goLine     string
		stallAfter int // the depth the service stalls after (0: before the first)
		stopBy     string
		next       []string // the moves of the position the next go searches
	}{
		{"stop before the first depth", "go infinite", 0, "stop", nil},
		{"stop a ponder search before the first depth", "go ponder wtime 60000 btime 60000", 0, "stop", nil},
		{"stop a depth search before the first depth", "go depth 10", 0, "stop", nil},
		{"stop after the first depth: its move", "go infinite", 1, "stop", nil},
		{"position before the first depth", "go depth 10", 0, "position startpos moves e2e4", []string{"e2e4"}},
		{"ucinewgame before the first depth", "go infinite", 0, "ucinewgame", nil},
		{"go before the first depth", "go depth 10", 0, "go depth 2", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gate := make(chan struct{})
			f := newFakeAPI(t, &fakeAPI{searchGate: gate, stallAfter: tt.stallAfter})
			s := newSession(t, Config{Server: f.base})
			s.send("position startpos", tt.goLine)
			<-f.started
			if tt.stallAfter > 0 {
				s.until(5*time.Second, is("info depth 1 "))
			}
			s.send(tt.stopBy)
			lines := s.until(promptly, is("bestmove"))
			want, told := firstLegal(t, startFEN), stoppedEarly
			if tt.stallAfter > 0 {
				want, told = searched(t, startFEN), ""
			}
			if bestOf(lines) != want || infoStrings(lines) != told {
				t.Errorf("bestmove %s told %q, want %s told %q: %q", bestOf(lines), infoStrings(lines), want, told, lines)
			}
			select {
			case <-f.left:
			case <-time.After(5 * time.Second):
				t.Fatal("the stopped search's request is still running on the service")
			}
			close(gate)
			if !strings.HasPrefix(tt.stopBy, "go") {
				s.send("go depth 2")
			}
			lines = s.until(5*time.Second, is("bestmove"))
			if want := searched(t, startFEN, tt.next...); bestOf(lines) != want {
				t.Errorf("the next search: bestmove is not %s: %q", want, lines)
			}
			if n := f.answers(); n != 1 {
				t.Errorf("%d answers produced, want 1 (the next search's; the stopped one's none)", n)
			}
		})
	}
}

// A position line that cannot be read or played leaves no position: the next go
// answers bestmove (none) and says why, without a search; an infinite one waits for
// stop like any infinite search.
func TestUnreadablePositionIsNone(t *testing.T) {
	f := newFakeAPI(t, &fakeAPI{})
	tests := []struct{ line, why string }{
		{"position fen", "no FEN"},
		{"position startpos xyz", `expected moves, not "xyz"`},
		{"position e2e4", "expected startpos or fen"},
		{"position fen 8/8/8/8/8/8/8/8 w - - 0 1", "position:"},
		{"position startpos moves e2e5", "e2e5"},
	}
	for _, tt := range tests {
		t.Run(tt.line, func(t *testing.T) {
			s := newSession(t, Config{Server: f.base})
			s.send("position startpos moves e2e4", tt.line, "go depth 3")
			lines := s.until(5*time.Second, is("bestmove"))
			if lines[len(lines)-1] != "bestmove (none)" {
				t.Errorf("a search of the position before: %q", lines)
			}
			if got := lines[len(lines)-2]; !strings.HasPrefix(got, "info string no position to search") || !strings.Contains(got, tt.why) {
				t.Errorf("not told why: %q", lines)
			}
		})
	}
	if len(f.asked()) != 0 {
		t.Errorf("searched %v", f.asked())
	}
}

// An infinite or ponder search with nothing to search still answers only after stop
// (ponderhit for ponder), as UCI says.
func TestInfiniteWithNothingToSearchWaits(t *testing.T) {
	mated := "position fen 6k1/5ppp/8/8/8/8/5PPP/3R2K1 w - - 0 1 moves d1d8"
	tests := []struct{ position, first, goLine, release string }{
		{mated, "info depth 0 score mate 0", "go infinite", "stop"},
		{mated, "info depth 0 score mate 0", "go ponder", "ponderhit"},
		{"position startpos moves e2e5", "info string no position to search", "go infinite", "stop"},
	}
	for _, tt := range tests {
		t.Run(tt.goLine+" "+tt.release+" "+tt.first, func(t *testing.T) {
			s := newSession(t, Config{Server: "http://127.0.0.1:1/v1"}) // nothing to ask
			s.send(tt.position, tt.goLine)
			s.until(5*time.Second, is(tt.first))
			s.send("isready")
			if lines := s.until(5*time.Second, func(l string) bool { return l == "readyok" || is("bestmove")(l) }); lines[len(lines)-1] != "readyok" {
				t.Fatalf("bestmove before %s: %q", tt.release, lines)
			}
			s.send(tt.release)
			if lines := s.until(5*time.Second, is("bestmove")); lines[len(lines)-1] != "bestmove (none)" {
				t.Errorf("after %s: %q", tt.release, lines)
			}
		})
	}
}

// setoption Server offers the new server's engine options.
func TestServerOptionOffersTheNewServersOptions(t *testing.T) {
	zero, twenty := 0, 20
	a := newFakeAPI(t, &fakeAPI{})
	b := newFakeAPI(t, &fakeAPI{options: []client.EngineOption{
		{Name: client.EngineOptionNameSkillLevel, Type: client.EngineOptionTypeInteger, UciOption: "Skill Level", Default: 20, Min: &zero, Max: &twenty}}})
	s := newSession(t, Config{Server: a.base})
	s.send("uci")
	s.until(5*time.Second, is("uciok"))
	s.send("setoption name Server value "+b.base, "setoption name Skill Level value 5", "isready")
	if lines := s.until(5*time.Second, is("readyok")); len(lines) != 1 {
		t.Errorf("setoption: %q", lines)
	}
	s.send("go depth 3")
	s.until(5*time.Second, is("bestmove"))
	if o := b.last().Options; o == nil || o.SkillLevel == nil || *o.SkillLevel != 5 {
		t.Errorf("the new server was not sent Skill Level 5: %+v", o)
	}
}

// A timed go is answered when its time (plus a margin) is up, also when the service's
// stream stalls: with the deepest depth heard, or a legal move before any. A ponder
// search's time counts from ponderhit.
func TestTimedSearchAnswersWhenTheStreamStalls(t *testing.T) {
	sicilian := []string{"e2e4", "c7c5"}
	startFEN := "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
	tests := []struct {
		name       string
		goLine     string
		stallAfter int // the depth after which the stream stalls (0: before the first)
		ponderhit  bool
		within     string // the limit told
		searched   bool   // bestmove is the search's (a depth was heard), not the first legal move
	}{
		{"movetime, before the first depth", "go movetime 200", 0, false, "1200 ms", false},
		{"the clocks, after depth 2", "go wtime 30000 btime 30000 winc 0 binc 0", 2, false, "1950 ms", true},
		{"a clock nearly up: at half of it", "go wtime 600 btime 600", 0, false, "300 ms", false},
		{"a clock at 0: a margin still", "go wtime 0 btime 0", 0, false, "300 ms", false},
		{"ponder, from ponderhit", "go ponder wtime 3000 btime 3000", 1, true, "1050 ms", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			gate := make(chan struct{})
			t.Cleanup(func() { close(gate) })
			f := newFakeAPI(t, &fakeAPI{searchGate: gate, stallAfter: tt.stallAfter})
			s := newSession(t, Config{Server: f.base})
			s.send("position startpos moves "+strings.Join(sicilian, " "), tt.goLine)
			if tt.ponderhit {
				<-f.started
				s.send("ponderhit")
			}
			lines := s.until(8*time.Second, is("bestmove"))
			if got := infoStrings(lines); !strings.Contains(got, "did not answer within "+tt.within) {
				t.Errorf("told %q, want the limit of %s", got, tt.within)
			}
			want := searched(t, startFEN, sicilian...)
			if !tt.searched {
				pos, _ := position.Parse(startFEN, false)
				pos, _, _ = pos.Play(sicilian[0])
				pos, _, _ = pos.Play(sicilian[1])
				want = pos.LegalMoves()[0].UCI
			}
			if bestOf(lines) != want {
				t.Errorf("bestmove is not %s: %q", want, lines)
			}
		})
	}
}

// A ponder search is not cut short while pondering (UCI: it waits for ponderhit or
// stop): its limit is armed at ponderhit, not at go.
func TestPonderIsNotCutShort(t *testing.T) {
	gate := make(chan struct{})
	f := newFakeAPI(t, &fakeAPI{searchGate: gate})
	ponder := newSession(t, Config{Server: f.base})
	ponder.send("go ponder movetime 50") // timed from go, its limit would be 1050 ms
	<-f.started
	// the clock: a timed search of the same stalled service, answered at its 2000 ms
	clock := newSession(t, Config{Server: f.base})
	clock.send("go movetime 1000")
	clock.until(8*time.Second, is("bestmove"))
	close(gate)
	ponder.send("isready")
	ponder.until(5*time.Second, is("readyok"))
	ponder.send("ponderhit")
	lines := ponder.until(5*time.Second, is("bestmove"))
	if want := searched(t, "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"); bestOf(lines) != want {
		t.Errorf("bestmove is not the search's %s: %q", want, lines)
	}
}

// The Key option's announced default (<empty>, or no value) is the configured key, as
// for Server; a depth or MultiPV above the caps the search is held to is told.
func TestKeyDefaultIsTheConfiguredKey(t *testing.T) {
	tests := []struct {
		name   string
		key    string      // configured
		plan   domain.Plan // the key's (zero: pro)
		set    []string    // setoption lines
		goLine string
		asked  string // depth/multipv
		told   string // "" nothing
	}{
		{"Key set to <empty>", "ce_k", domain.Plan{}, []string{"setoption name Key value <empty>"}, "go depth 20", "20/1", ""},
		{"Key set without a value", "ce_k", domain.Plan{}, []string{"setoption name Key"}, "go depth 20", "20/1", ""},
		{"Key set to an empty value after another", "ce_k", domain.Plan{}, []string{"setoption name Key value ce_other", "setoption name Key value"}, "go depth 20", "20/1", ""},
		{"keyless: depth above its cap", "", domain.Plan{}, nil, "go depth 20", "12/1", "depth 20 above the caps without a key (set the Key option): searching depth 12"},
		{"keyless: MultiPV above its cap", "", domain.Plan{}, []string{"setoption name MultiPV value 5"}, "go depth 4", "4/3", "multipv 5 above the caps without a key (set the Key option): searching multipv 3"},
		{"a key: above its plan's caps", "ce_k", domain.PlanFree, []string{"setoption name MultiPV value 8"}, "go depth 25", "20/3",
			"depth 25 and multipv 8 above this key's caps: searching depth 20 and multipv 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeAPI(t, &fakeAPI{plan: tt.plan, meAnswers: true})
			s := newSession(t, Config{Server: f.base, Key: tt.key})
			s.send("uci")
			s.until(5*time.Second, is("uciok"))
			s.send(tt.set...)
			s.send("position startpos", tt.goLine)
			lines := s.until(5*time.Second, is("bestmove"))
			if got := infoStrings(lines); got != tt.told {
				t.Errorf("told %q, want %q", got, tt.told)
			}
			if got := f.asked(); !slices.Equal(got, []string{tt.asked}) {
				t.Errorf("asked %v, want %s", got, tt.asked)
			}
		})
	}
}

// The lowering of a depth or MultiPV to the caps is told once, and again when what it
// says changes (another depth or MultiPV asked, another key): not at every go of a game.
func TestLoweringToldOnce(t *testing.T) {
	f := newFakeAPI(t, &fakeAPI{})
	s := newSession(t, Config{Server: f.base})
	const keyless = " above the caps without a key (set the Key option): searching "
	steps := []struct {
		lines []string
		told  string
	}{
		{[]string{"go depth 20"}, "depth 20" + keyless + "depth 12"},
		{[]string{"go depth 20"}, ""},
		{[]string{"go depth 8"}, ""},
		{[]string{"go depth 20"}, ""},
		{[]string{"go depth 25"}, "depth 25" + keyless + "depth 12"},
		{[]string{"setoption name MultiPV value 5", "go depth 25"}, "depth 25 and multipv 5" + keyless + "depth 12 and multipv 3"},
		{[]string{"go depth 25"}, ""},
		{[]string{"setoption name Key value <empty>", "go depth 25"}, "depth 25 and multipv 5" + keyless + "depth 12 and multipv 3"},
	}
	for i, st := range steps {
		s.send(st.lines...)
		lines := s.until(5*time.Second, is("bestmove"))
		if got := infoStrings(lines); got != st.told {
			t.Errorf("step %d (%q): told %q, want %q", i+1, st.lines, got, st.told)
		}
	}
}

// A line is read whole up to 1 MiB, without its "\n" or "\r\n"; of a longer one the
// first 1 MiB is kept and the rest skipped, and the next line read.
func TestReadLine(t *testing.T) {
	long := strings.Repeat("x", maxLine)
	tests := []struct {
		name string
		in   string
		want []input
	}{
		{"lines", "uci\r\nisready\n\ngo", []input{{text: "uci"}, {text: "isready"}, {text: ""}, {text: "go"}}},
		{"1 MiB", long + "\nquit\n", []input{{text: long}, {text: "quit"}}},
		{"1 MiB and a byte", long + "y\nquit\n", []input{{text: long, cut: true}, {text: "quit"}}},
		{"5 MiB, the last line", strings.Repeat("y", 5*maxLine), []input{{text: strings.Repeat("y", maxLine), cut: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := bufio.NewReaderSize(strings.NewReader(tt.in), 64<<10)
			var got []input
			for {
				l, err := readLine(r)
				if err != nil {
					break
				}
				got = append(got, l)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("read %s, want %s", brief(got), brief(tt.want))
			}
		})
	}
}

func brief(ls []input) string {
	var out []string
	for _, l := range ls {
		out = append(out, fmt.Sprintf("%.10q (%d bytes, cut %t)", l.text, len(l.text), l.cut))
	}
	return strings.Join(out, ", ")
}

// A line over 1 MiB is told and skipped, and the session goes on: a position line (or
// one with no command read) leaves no position, a go is still searched, another
// command is ignored.
func TestOverlongLineIsSkipped(t *testing.T) {
	startFEN := "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
	padding := strings.Repeat("e2e4 e7e5 ", maxLine/10+1)
	tests := []struct {
		name  string
		line  string
		then  string // sent after (not when the line is a go)
		best  string // "" the search's in the position after e2e4
		asked []string
	}{
		{"a position", "position startpos moves " + padding, "go depth 3", "(none)", nil},
		{"no command read", padding, "go depth 3", "(none)", nil},
		{"a go", "go depth 3 " + padding, "", "", []string{"3/1"}},
		{"a setoption", "setoption name Key value " + padding, "go depth 3", "", []string{"3/1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeAPI(t, &fakeAPI{})
			s := newSession(t, Config{Server: f.base})
			s.send("position startpos moves e2e4", tt.line)
			if tt.then != "" {
				s.send(tt.then)
			}
			lines := s.until(5*time.Second, is("bestmove"))
			if told := infoStrings(lines); !strings.Contains(told, "longer than 1 MiB") {
				t.Errorf("not told: %q", told)
			}
			want := tt.best
			if want == "" {
				want = searched(t, startFEN, "e2e4")
			}
			if bestOf(lines) != want {
				t.Errorf("bestmove is not %s: %.300q", want, lines)
			}
			if got := f.asked(); !slices.Equal(got, tt.asked) {
				t.Errorf("asked %v, want %v", got, tt.asked)
			}
		})
	}
}

// uci is answered within a GUI's short wait when GET /engines does not answer (the
// bridge's own options only: no engine option it cannot vouch for), and quit acts at
// once while a lookup is awaited (the lookup times out after 10 s).
func TestUCIAnsweredWhileEnginesStall(t *testing.T) {
	gate := make(chan struct{})
	t.Cleanup(func() { close(gate) })
	f := newFakeAPI(t, &fakeAPI{lookupGate: gate})

	t.Run("uci", func(t *testing.T) {
		s := newSession(t, Config{Server: f.base})
		s.send("uci", "isready")
		lines := s.until(5*time.Second, is("readyok"))
		var offered []string
		for _, l := range lines {
			if o, ok := strings.CutPrefix(l, "option name "); ok {
				offered = append(offered, strings.Fields(o)[0])
			}
		}
		if want := []string{"MultiPV", "Server", "Key"}; !slices.Equal(offered, want) {
			t.Errorf("offered %v, want %v", offered, want)
		}
		if got := lines[len(lines)-2:]; !slices.Equal(got, []string{"uciok", "readyok"}) {
			t.Errorf("uciok, then readyok: %q", lines)
		}
		if !strings.Contains(infoStrings(lines), "cannot read the engines of "+f.base+": no answer within 2s") {
			t.Errorf("not told: %q", lines)
		}
	})
	t.Run("quit while the Server option's engines are read", func(t *testing.T) {
		s := newSession(t, Config{Server: f.base})
		s.send("uci")
		for range 4 { // a GUI sending its settings: each Server read would wait
			s.send("setoption name Server value " + f.base)
		}
		s.send("quit")
		deadline := time.After(5 * time.Second)
		for {
			select {
			case _, ok := <-s.lines:
				if !ok {
					return
				}
			case <-deadline:
				t.Fatal("the bridge did not quit")
			}
		}
	})
}

// A bridge without a client of its own talks through the client package's HTTPClient,
// whose keep-alive probes end a search's stream within seconds of a dead server or
// network (client's TestDeadConnectionIsNoticed).
func TestBridgeProbesItsConnections(t *testing.T) {
	if hc := New(Config{Server: "localhost:8080"}).cfg.HTTP; hc != client.HTTPClient() {
		t.Errorf("the bridge's HTTP client is %#v, want client.HTTPClient()", hc)
	}
}
