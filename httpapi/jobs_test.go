package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"chessd/domain"
	"chessd/engine"
	"chessd/postgres/pgtest"
)

// jobFENs returns n legal positions, ten distinct ones repeated: the start position after each of a few
// opening sequences, and some endgames.
func jobFENs(n int) []string {
	base := []string{
		"rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1",
		"rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1",
		"rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2",
		"rnbqkbnr/pppp1ppp/8/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R b KQkq - 1 2",
		"r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
		"r1bqkbnr/pppp1ppp/2n5/1B2p3/4P3/5N2/PPPP1PPP/RNBQK2R b KQkq - 3 3",
		"rnbqkb1r/pppppppp/5n2/8/3P4/8/PPP1PPPP/RNBQKBNR w KQkq - 1 2",
		"rnbqkb1r/pppppppp/5n2/8/2PP4/8/PP2PPPP/RNBQKBNR b KQkq - 0 2",
		"8/8/8/4k3/8/8/4P3/4K3 w - - 0 1",
		"8/5k2/8/8/8/8/5PK1/8 w - - 0 1",
	}
	var out []string
	for i := 0; len(out) < n; i++ {
		f := strings.Fields(base[i%len(base)])
		// vary the move counter: another FEN text, the same position (cache hits); raised
		// from the base's own, so that it still fits the halfmove clock
		n, _ := strconv.Atoi(f[5])
		f[5] = strconv.Itoa(n + i/len(base))
		out = append(out, strings.Join(f, " "))
	}
	return out
}

func (e *env) waitJob(key, id string, done func(map[string]any) bool) map[string]any {
	e.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		r := e.do("GET", "/v1/jobs/"+id, key, nil)
		if r.Status != 200 {
			e.t.Fatalf("get job: %d %s", r.Status, r.Raw)
		}
		if done(r.Body) {
			return r.Body
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("job never got there: %s", r.Raw)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// executorsLetGo waits until no executor runs job id: whatever it was going to record
// has been recorded.
func (e *env) executorsLetGo(id string) {
	e.t.Helper()
	pgtest.WaitFor(e.t, "the executors to let go of the job", func() bool {
		for _, x := range e.execs {
			if slices.Contains(x.Running(), id) {
				return false
			}
		}
		return true
	})
}

func finished(b map[string]any) bool {
	s := b["state"]
	return s == "succeeded" || s == "failed" || s == "cancelled"
}

func TestBatchOf50InOrder(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("batch@example.com")
	fens := jobFENs(50)
	r := e.do("POST", "/v1/batch", key, map[string]any{"fens": fens, "depth": 6, "multipv": 2})
	if r.Status != 202 || r.Body["state"] != "queued" || r.Body["positions_total"] != float64(50) || !strings.HasPrefix(r.Header.Get("Location"), "http://chessd.test/v1/jobs/job_") {
		t.Fatalf("submit: %d %s", r.Status, r.Raw)
	}
	id := r.Body["job_id"].(string)
	job := e.waitJob(key, id, finished)
	if job["state"] != "succeeded" || job["positions_done"] != float64(50) {
		t.Fatalf("job: %v", job)
	}
	res := e.do("GET", "/v1/jobs/"+id+"/result", key, nil)
	positions := res.Body["positions"].([]any)
	if len(positions) != 50 || res.Body["complete"] != true {
		t.Fatalf("result: %s", res.Raw)
	}
	var units float64
	for i, p := range positions {
		p := p.(map[string]any)
		if p["index"] != float64(i) || p["status"] != "done" || p["bestmove"] == nil || p["bestmove_san"] == nil ||
			len(p["pvs"].([]any)) != 2 || p["depth"].(float64) < 6 || p["nodes"] == nil || p["eval"] == nil {
			t.Fatalf("position %d: %v", i, p)
		}
		if !strings.HasPrefix(fens[i], strings.Join(strings.Fields(p["fen"].(string))[:4], " ")) {
			t.Fatalf("position %d is %s, input was %s", i, p["fen"], fens[i])
		}
		units += p["cost_units"].(float64)
	}
	// 10 distinct positions: the 40 repeats come from the eval cache at the cached price
	if job["cost_units"] != units || units != 10*15+40*2 {
		t.Fatalf("cost %v, positions sum to %v, want %d", job["cost_units"], units, 10*15+40*2)
	}
	e.checkJobBooks(t, key, id)
}

// checkJobBooks checks that the hold, the per-position charges and the release add up
// exactly to what the job, /usage and the ledger say.
func (e *env) checkJobBooks(t *testing.T, key, id string) {
	t.Helper()
	e.caughtUp()
	job := e.do("GET", "/v1/jobs/"+id, key, nil).Body
	ctx := context.Background()
	var held, spent int64
	var charges int
	var charged int64
	if err := e.pool.QueryRow(ctx, `SELECT held_units, spent_units FROM key_balances WHERE key_id = (SELECT key_id FROM jobs WHERE job_id = $1)`, id).Scan(&held, &spent); err != nil {
		t.Fatal(err)
	}
	if err := e.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(units), 0) FROM charge_lines() WHERE params->>'job_id' = $1`, id).Scan(&charges, &charged); err != nil {
		t.Fatal(err)
	}
	if held != 0 {
		t.Fatalf("%d units still held after the job ended", held)
	}
	if float64(charges) != job["positions_done"] || float64(charged) != job["cost_units"] {
		t.Fatalf("ledger: %d charges for %d units; job: %v positions for %v units", charges, charged, job["positions_done"], job["cost_units"])
	}
	// /usage for the job's endpoint equals what the account's jobs of that kind cost
	var jobsCost float64
	if err := e.pool.QueryRow(ctx, `SELECT coalesce(sum(cost_units), 0) FROM jobs
		WHERE account_id = (SELECT account_id FROM jobs WHERE job_id = $1) AND kind = $2`, id, job["kind"]).Scan(&jobsCost); err != nil {
		t.Fatal(err)
	}
	usage := e.do("GET", "/v1/usage?group_by=endpoint", key, nil)
	for _, g := range usage.Body["groups"].([]any) {
		g := g.(map[string]any)
		if g["endpoint"] == job["kind"] && g["units"] != jobsCost {
			t.Fatalf("usage for %v: %v units, the jobs cost %v", job["kind"], g["units"], jobsCost)
		}
	}
}

func TestAnalyzePGN(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("pgn@example.com")
	pgn := `[Event "Casual"]
[SetUp "1"]
[FEN "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"]

3. Bb5 {the Ruy Lopez} a6 (3... Nf6 4. O-O) 4. Ba4 $1 Nf6 5. O-O!? Be7 *`
	r := e.do("POST", "/v1/analyze", key, map[string]any{"pgn": pgn, "depth": 5})
	if r.Status != 202 || r.Body["kind"] != "analyze" || r.Body["positions_total"] != float64(6) {
		t.Fatalf("submit: %d %s", r.Status, r.Raw)
	}
	id := r.Body["job_id"].(string)
	if job := e.waitJob(key, id, finished); job["state"] != "succeeded" {
		t.Fatalf("job %v", job)
	}
	res := e.do("GET", "/v1/jobs/"+id+"/result", key, nil)
	want := []struct {
		ply       float64
		move, san string
	}{{5, "f1b5", "Bb5"}, {6, "a7a6", "a6"}, {7, "b5a4", "Ba4"}, {8, "g8f6", "Nf6"}, {9, "e1g1", "O-O"}, {10, "f8e7", "Be7"}}
	for i, p := range res.Body["positions"].([]any) {
		p := p.(map[string]any)
		if p["ply"] != want[i].ply || p["move"] != want[i].move || p["move_san"] != want[i].san || p["bestmove_san"] == nil {
			t.Fatalf("position %d: %v, want %+v", i, p, want[i])
		}
	}
	t.Run("one fen", func(t *testing.T) {
		r := e.do("POST", "/v1/analyze", key, map[string]any{"fen": startFEN, "depth": 4})
		if r.Status != 202 || r.Body["positions_total"] != float64(1) {
			t.Fatalf("%d %s", r.Status, r.Raw)
		}
	})
}

func TestBadJobsAreRefusedAndCostNothing(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("badjobs@example.com")
	fens := jobFENs(3)
	cases := map[string]struct {
		path   string
		body   any
		field  string
		reason string // a substring of the answer; "" for none
	}{
		"no fens":         {"/v1/batch", map[string]any{"depth": 5}, "fens", ""},
		"empty fens":      {"/v1/batch", map[string]any{"fens": []string{}}, "fens", ""},
		"51 fens":         {"/v1/batch", map[string]any{"fens": jobFENs(51)}, "fens", ""},
		"one bad fen":     {"/v1/batch", map[string]any{"fens": []string{fens[0], fens[1], "4k3/8/8/8/8/8/4R3/4K3 w - - 0 1"}}, "fens[2]", ""},
		"depth 15":        {"/v1/batch", map[string]any{"fens": fens, "depth": 15}, "depth", ""},
		"depth 0":         {"/v1/batch", map[string]any{"fens": fens, "depth": 0}, "depth", ""},
		"multipv 4":       {"/v1/batch", map[string]any{"fens": fens, "multipv": 4}, "multipv", ""},
		"unknown field":   {"/v1/batch", map[string]any{"fens": fens, "priority": "high"}, "priority", ""},
		"both pgn, fen":   {"/v1/analyze", map[string]any{"pgn": "1. e4 e5", "fen": startFEN}, "pgn", ""},
		"neither":         {"/v1/analyze", map[string]any{"depth": 5}, "pgn", ""},
		"illegal move":    {"/v1/analyze", map[string]any{"pgn": "1. e4 e5 2. Nf3 Nc6 3. Bb5 Ke6"}, "pgn", "ply 6"},
		"no moves":        {"/v1/analyze", map[string]any{"pgn": "*"}, "pgn", ""},
		"bad analyze fen": {"/v1/analyze", map[string]any{"fen": "nonsense"}, "fen", ""},
		"unknown engine":  {"/v1/batch", map[string]any{"fens": fens, "engine": "sf-99"}, "engine", ""},
		"empty engine":    {"/v1/analyze", map[string]any{"pgn": "1. e4 e5", "engine": ""}, "engine", ""},
		// Counters that do not fit, wherever a FEN comes in; a FEN tag whose counters the
		// game would take past 100000, the most a FEN holds.
		"impossible counters in fens": {"/v1/batch", map[string]any{"fens": []string{fens[0], "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 1"}}, "fens[1]", "en passant square d6 is impossible at fullmove number 1"},
		"impossible counters in fen":  {"/v1/analyze", map[string]any{"fen": "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 5 3"}, "fen", "halfmove clock 5 is impossible with the en passant square d6"},
		"impossible counters in FEN tag": {"/v1/analyze", map[string]any{"pgn": "[SetUp \"1\"]\n[FEN \"rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 5 3\"]\n3. exd6 *"},
			"pgn", "FEN tag: halfmove clock 5 is impossible with the en passant square d6"},
		"FEN tag counters past 100000": {"/v1/analyze", map[string]any{"pgn": "[SetUp \"1\"]\n[FEN \"3k4/8/8/8/8/8/3K4/8 b - - 99999 100000\"]\n100000... Kd7 100001. Ke2 *"},
			"pgn", "FEN tag: its counters leave no room for the game: ply 1 (100000... Kd7) would take the fullmove number to 100001, past 100000"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := e.do("POST", tc.path, key, tc.body)
			wantProblem(t, r, 400, "fix_request")
			if !strings.Contains(r.Raw, `"field":"`+tc.field+`"`) {
				t.Fatalf("errors do not name %s: %s", tc.field, r.Raw)
			}
			if !strings.Contains(r.Raw, tc.reason) {
				t.Fatalf("the answer does not say %q: %s", tc.reason, r.Raw)
			}
		})
	}
	ctx := context.Background()
	var jobEvents, held int64
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE stream_type = 'job'`).Scan(&jobEvents); err != nil || jobEvents != 0 {
		t.Fatalf("%d job events after refused submissions (%v)", jobEvents, err)
	}
	if err := e.pool.QueryRow(ctx, `SELECT coalesce(sum(held_units + spent_units), 0) FROM key_balances`).Scan(&held); err != nil || held != 0 {
		t.Fatalf("refused submissions held or spent %d units (%v)", held, err)
	}
	var commands int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM watermill_job_commands`).Scan(&commands); err != nil || commands != 0 {
		t.Fatalf("%d commands queued (%v)", commands, err)
	}

	t.Run("budget too small for the whole job", func(t *testing.T) {
		small, _ := e.createKey(key, map[string]any{"budget_units": 20})
		wantProblem(t, e.do("POST", "/v1/batch", small, map[string]any{"fens": fens, "depth": 10}), 402, "raise_budget")
	})
	t.Run("another account's job is 404", func(t *testing.T) {
		r := e.do("POST", "/v1/batch", key, map[string]any{"fens": fens[:1], "depth": 3})
		other := e.signupPro("other-jobs@example.com")
		id := r.Body["job_id"].(string)
		for _, p := range []string{"", "/result", "/events"} {
			wantProblem(t, e.do("GET", "/v1/jobs/"+id+p, other, nil), 404, "fix_request")
		}
		wantProblem(t, e.do("DELETE", "/v1/jobs/"+id, other, nil), 404, "fix_request")
	})
}

// A job reserves its whole price, on the key's budgets and the day's allowance, when it
// is accepted: one that does not fit is refused before any engine runs and holds
// nothing; one that fits charges exactly what it analysed and gives the rest back.
func TestJobHoldsTheAllowanceWhenAccepted(t *testing.T) {
	e := newEnv(t)
	key, keyID := e.signup("allowance-job@example.com")
	fens := jobFENs(8) // eight distinct positions: each a fresh search at the same price
	price := e.do("GET", "/v1/price?endpoint=batch&depth=6&items=1", key, nil)
	if price.Status != 200 {
		t.Fatalf("price: %s", price.Raw)
	}
	per := int64(price.Body["units"].(float64))
	today := e.do("GET", "/v1/me", key, nil).Body["today"].(map[string]any)
	allowance := int64(today["allowance_units"].(float64))
	// room for three positions and not quite a fourth
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO account_days (account_id, env, day, units)
		SELECT account_id, 'live', (now() AT TIME ZONE 'UTC')::date, $2 FROM key_balances WHERE key_id = $1`,
		keyID, allowance-4*per+1); err != nil {
		t.Fatal(err)
	}
	held := func() (held, leases int64) {
		t.Helper()
		if err := e.pool.QueryRow(context.Background(), `SELECT held_units, (SELECT coalesce(sum(units), 0) FROM leases WHERE key_id = $1)
			FROM key_balances WHERE key_id = $1`, keyID).Scan(&held, &leases); err != nil {
			t.Fatal(err)
		}
		return held, leases
	}
	wantProblem(t, e.do("POST", "/v1/batch", key, map[string]any{"fens": fens, "depth": 6}), 402, "upgrade")
	if h, l := held(); h != 0 || l != 0 {
		t.Fatalf("a refused job holds %d units (%d in leases)", h, l)
	}
	var jobs int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM events WHERE event_type = 'JobSubmitted'`).Scan(&jobs); err != nil || jobs != 0 {
		t.Fatalf("%d jobs submitted (%v)", jobs, err)
	}
	r := e.do("POST", "/v1/batch", key, map[string]any{"fens": fens[:3], "depth": 6})
	if r.Status != 202 {
		t.Fatalf("submit: %d %s", r.Status, r.Raw)
	}
	id := r.Body["job_id"].(string)
	job := e.waitJob(key, id, finished)
	if job["state"] != "succeeded" || job["positions_done"] != float64(3) || job["cost_units"] != float64(3*per) {
		t.Fatalf("job: %v", job)
	}
	if h, l := held(); h != 0 || l != 0 {
		t.Fatalf("a finished job left %d units held (%d in leases)", h, l)
	}
	e.checkJobBooks(t, key, id)
}

// midJobFENs are twelve positions of a job at depth 14, long enough for a change to
// land mid-job (a cancel, a key's revocation).
var midJobFENs = []string{
	"r1bq1rk1/ppp2ppp/2np1n2/2b1p3/2B1P3/2NP1N2/PPP2PPP/R1BQ1RK1 w - - 0 7",
	"r2q1rk1/pp2bppp/2n1pn2/3p4/3P4/2NBPN2/PP3PPP/R2QK2R w KQ - 0 10",
	"2rq1rk1/pb1nbppp/1p2pn2/2pp4/3P4/1P2PNP1/PBPNQPBP/R4RK1 w - - 0 11",
	"r4rk1/1pp1qppp/p1np1n2/2b1p1B1/2B1P1b1/P1NP1N2/1PP1QPPP/R4RK1 w - - 0 10",
	"rnbq1rk1/ppp1ppbp/3p1np1/8/2PPP3/2N2N2/PP2BPPP/R1BQK2R b KQ - 3 6",
	"rnbqkb1r/pp3ppp/4pn2/2pp4/3P4/2P1PN2/PP3PPP/RNBQKB1R w KQkq - 0 5",
	// the first record comes a second (RecordEvery) after the first position: the
	// job must last well beyond it for a change to land mid-job
	"r2q1rk1/ppp2ppp/2np1n2/2b1p3/2B1P1b1/2NP1N2/PPP2PPP/R1BQ1RK1 w - - 0 8",
	"r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R w KQkq - 0 1",
	"r1bqkb1r/pppp1ppp/2n2n2/4p3/2B1P3/5N2/PPPP1PPP/RNBQK2R w KQkq - 4 4",
	"r1bqkbnr/pp1ppppp/2n5/2p5/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
	"8/2p5/3p4/KP5r/1R3p1k/8/4P1P1/8 w - - 0 1",
	"r1bqkbnr/pppp1ppp/2n5/1B2p3/4P3/5N2/PPPP1PPP/RNBQK2R b KQkq - 3 3",
}

func TestCancelMidJob(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("cancel@example.com")
	fens := midJobFENs
	r := e.do("POST", "/v1/batch", key, map[string]any{"fens": fens, "depth": 14, "multipv": 3})
	id := r.Body["job_id"].(string)
	e.waitJob(key, id, func(b map[string]any) bool { return b["positions_done"].(float64) >= 1 || finished(b) })
	c := e.do("DELETE", "/v1/jobs/"+id, key, nil)
	if c.Status != 200 || c.Body["state"] != "cancelled" {
		t.Fatalf("cancel: %d %s", c.Status, c.Raw)
	}
	doneAtCancel := c.Body["positions_done"].(float64)
	if doneAtCancel >= float64(len(fens)) {
		t.Fatalf("the job finished before the cancel: make it longer")
	}
	pool, err := e.svc.Catalog().Pool(context.Background(), "sf-17.1", engine.PathNative)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, "the engine to stop", func() bool { s := pool.Stats(); return s.Idle == s.Size })
	// once no executor runs the job, whatever it was going to record has been recorded
	e.executorsLetGo(id)
	job := e.do("GET", "/v1/jobs/"+id, key, nil).Body
	if job["state"] != "cancelled" || job["positions_done"] != doneAtCancel {
		t.Fatalf("after cancel: %v (done %v at cancel)", job, doneAtCancel)
	}
	wantProblem(t, e.do("DELETE", "/v1/jobs/"+id, key, nil), 409, "fix_request")
	res := e.do("GET", "/v1/jobs/"+id+"/result", key, nil)
	pending := 0
	for _, p := range res.Body["positions"].([]any) {
		if p.(map[string]any)["status"] == "pending" {
			pending++
		}
	}
	if float64(pending) != float64(len(fens))-doneAtCancel {
		t.Fatalf("%d pending positions, want %v", pending, float64(len(fens))-doneAtCancel)
	}
	e.checkJobBooks(t, key, id)
}

// openSSE opens a job's event stream (resuming after lastID when set); the request
// gives up after timeout, so that a stream that never ends fails its test.
func openSSE(t *testing.T, e *env, key, id, lastID string, timeout time.Duration) *http.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", e.srv.URL+"/v1/jobs/"+id+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// readSSE reads events until the stream ends, or until stopAfter events when > 0.
func readSSE(t *testing.T, e *env, key, id, lastID string, stopAfter int) (ids, kinds []string, ended bool) {
	t.Helper()
	res := openSSE(t, e, key, id, lastID, 90*time.Second)
	defer res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var id_, kind string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "id: "):
			id_ = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "event: "):
			kind = strings.TrimPrefix(line, "event: ")
		case line == "" && id_ != "":
			ids, kinds = append(ids, id_), append(kinds, kind)
			if kind == "end" {
				return ids, kinds, true
			}
			id_ = ""
			if stopAfter > 0 && len(ids) == stopAfter {
				return ids, kinds, false
			}
		}
	}
	return ids, kinds, false
}

// An SSE client sees every event of a job once and in order, across a reconnect, with
// one worker and with two workers producing the events.
func TestJobEventsWithReconnect(t *testing.T) {
	for _, workers := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d workers", workers), func(t *testing.T) {
			e := newEnv(t, withWorkers(workers))
			key := e.signupPro(fmt.Sprintf("sse%d@example.com", workers))
			// depth 12: searches long enough that the second worker, woken by the
			// submission's NOTIFY, takes its share before the first has searched the
			// four it took and comes back for the rest (at depth 8 it once had not,
			// under the CI's parallel tests)
			r := e.do("POST", "/v1/batch", key, map[string]any{"fens": jobFENs(8), "depth": 12})
			id := r.Body["job_id"].(string)
			first, firstKinds, ended := readSSE(t, e, key, id, "", 3)
			if ended || len(first) != 3 || firstKinds[0] != "state" {
				t.Fatalf("first connection: %v %v", first, firstKinds)
			}
			rest, restKinds, ended := readSSE(t, e, key, id, first[len(first)-1], 0)
			if !ended {
				t.Fatalf("the stream did not end: %v", restKinds)
			}
			all := append(first, rest...)
			kinds := append(firstKinds, restKinds...)
			for i, got := range all {
				if got != fmt.Sprint(i+1) {
					t.Fatalf("event ids %v: missed or repeated", all)
				}
			}
			count := map[string]int{}
			for _, k := range kinds {
				count[k]++
			}
			// submitted, started, 8 × (position, progress), succeeded, end
			if count["position"] != 8 || count["progress"] != 8 || count["state"] != 3 || count["end"] != 1 {
				t.Fatalf("kinds %v", count)
			}
			if got := analysedBy(t, e, id); len(got) != workers {
				t.Fatalf("positions analysed by %v, want %d workers", got, workers)
			}
			// after the end, a new client gets the whole history and the end
			again, _, ended := readSSE(t, e, key, id, "", 0)
			if !ended || len(again) != len(all) {
				t.Fatalf("late client got %d events (ended %v), want %d", len(again), ended, len(all))
			}
		})
	}
}

// analysedBy counts a job's recorded positions per worker.
func analysedBy(t *testing.T, e *env, jobID string) map[string]int {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT payload->>'worker', count(*) FROM events
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

// A cancel stops every worker that holds positions of the job: both engines go idle,
// both workers let go of the job, and nothing is recorded or charged after it. The
// workers' leases last an hour (renewed every 20 minutes): they hear of the cancel by
// its notification (or a record of theirs refused), not by a renewal.
func TestCancelStopsEveryWorker(t *testing.T) {
	e := newEnv(t, withWorkers(2), withLease(time.Hour))
	key := e.signupPro("cancel2@example.com")
	r := e.do("POST", "/v1/batch", key, map[string]any{"fens": jobFENs(10), "depth": 14, "multipv": 3})
	if r.Status != 202 {
		t.Fatal(r.Raw)
	}
	id := r.Body["job_id"].(string)
	pgtest.WaitFor(t, "both workers to hold positions of the job", func() bool {
		return slices.Contains(e.execs[0].Running(), id) && slices.Contains(e.execs[1].Running(), id)
	})
	c := e.do("DELETE", "/v1/jobs/"+id, key, nil)
	if c.Status != 200 || c.Body["state"] != "cancelled" {
		t.Fatalf("cancel: %d %s", c.Status, c.Raw)
	}
	doneAtCancel := c.Body["positions_done"].(float64)
	pool, err := e.svc.Catalog().Pool(context.Background(), "sf-17.1", engine.PathNative)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, "both workers to let go of the job", func() bool {
		return !slices.Contains(e.execs[0].Running(), id) && !slices.Contains(e.execs[1].Running(), id)
	})
	pgtest.WaitFor(t, "the engines to stop", func() bool { s := pool.Stats(); return s.Idle == s.Size })
	job := e.do("GET", "/v1/jobs/"+id, key, nil).Body
	if job["state"] != "cancelled" || job["positions_done"] != doneAtCancel || doneAtCancel >= 10 {
		t.Fatalf("after cancel: %v (done %v at cancel)", job, doneAtCancel)
	}
	var queued int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM job_queue WHERE job_id = $1`, id).Scan(&queued); err != nil || queued != 0 {
		t.Fatalf("%d positions left on the queue (%v)", queued, err)
	}
	e.checkJobBooks(t, key, id)
}

// Two workers share six jobs: each job starts once, each position is recorded once,
// and both workers analyse positions.
func TestTwoWorkersShareJobs(t *testing.T) {
	e := newEnv(t, withWorkers(2))
	key := e.signupPro("workers@example.com")
	var ids []string
	for i := range 6 {
		r := e.do("POST", "/v1/batch", key, map[string]any{"fens": jobFENs(5 + i), "depth": 5 + i%3})
		if r.Status != 202 {
			t.Fatal(r.Raw)
		}
		ids = append(ids, r.Body["job_id"].(string))
	}
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if job := e.waitJob(key, id, finished); job["state"] != "succeeded" {
				t.Errorf("job %s: %v", id, job)
			}
		}()
	}
	wg.Wait()
	ctx := context.Background()
	rows, err := e.pool.Query(ctx, `SELECT stream_id, event_type, count(*), count(DISTINCT payload->>'index')
		FROM events WHERE stream_type = 'job' AND event_type IN ('JobStarted', 'JobPositionAnalysed') GROUP BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var stream, typ string
		var n, distinct int
		if err := rows.Scan(&stream, &typ, &n, &distinct); err != nil {
			t.Fatal(err)
		}
		if typ == "JobStarted" && n != 1 {
			t.Fatalf("%s started %d times", stream, n)
		}
		if typ == "JobPositionAnalysed" && n != distinct {
			t.Fatalf("%s analysed %d positions, %d distinct", stream, n, distinct)
		}
	}
	workers := map[string]int{}
	for _, id := range ids {
		for w, n := range analysedBy(t, e, id) {
			workers[w] += n
		}
	}
	if len(workers) != 2 {
		t.Fatalf("positions analysed by %v, want both workers", workers)
	}
	for _, id := range ids {
		e.checkJobBooks(t, key, id)
	}
}

// Retried submissions with one Idempotency-Key, even racing, make one job and hold its
// price once; the same key with another body is refused.
func TestIdempotentJobSubmission(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("idem-jobs@example.com")
	body := `{"fens":["8/8/8/4k3/8/8/4P3/4K3 w - - 0 1","8/5k2/8/8/8/8/5PK1/8 w - - 0 1"],"depth":4}`
	ids := make(chan string, 7)
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := e.withIdem("/v1/batch", key, "submit-1", body)
			if r.Status == 409 && r.Body["next_action"] == "retry_after" {
				return // the first submission was still running
			}
			if r.Status != 202 {
				t.Errorf("submit: %d %s", r.Status, r.Raw)
				return
			}
			ids <- r.Body["job_id"].(string)
		}()
	}
	wg.Wait()
	if r := e.withIdem("/v1/batch", key, "submit-1", body); r.Status == 202 { // after: the first answer
		ids <- r.Body["job_id"].(string)
		if want := "http://chessd.test/v1/jobs/" + r.Body["job_id"].(string); r.Header.Get("Location") != want ||
			r.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("the replayed submission: Location %q, Idempotent-Replayed %q; want %q, true",
				r.Header.Get("Location"), r.Header.Get("Idempotent-Replayed"), want)
		}
	} else {
		t.Fatalf("retry after the submission: %d %s", r.Status, r.Raw)
	}
	close(ids)
	seen := map[string]int{}
	for id := range ids {
		seen[id]++
	}
	if len(seen) != 1 {
		t.Fatalf("job ids %v: one key must make one job", seen)
	}
	var jobs int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM events WHERE event_type = 'JobSubmitted'`).Scan(&jobs); err != nil || jobs != 1 {
		t.Fatalf("%d jobs submitted (%v)", jobs, err)
	}
	wantProblem(t, e.withIdem("/v1/batch", key, "submit-1", `{"fens":["8/8/8/4k3/8/8/4P3/4K3 w - - 0 1"]}`), 422, "fix_request")
	for id := range seen {
		e.waitJob(key, id, finished)
		e.checkJobBooks(t, key, id)
	}
}

// A refusal is not kept for an Idempotency-Key: after raising the budget, a retry with
// the same key runs afresh (for a job and for an eval).
func TestRefusalIsNotKeptForAnIdempotencyKey(t *testing.T) {
	e := newEnv(t)
	owner := e.signupPro("idem-refused@example.com")
	key, keyID := e.createKey(owner, map[string]any{"scopes": []string{"eval", "jobs"}, "budget_units": 1})
	batch := `{"fens":["8/8/8/4k3/8/8/4P3/4K3 w - - 0 1"],"depth":4}`
	eval := evalBody(startFEN, `"depth":5`)
	wantProblem(t, e.withIdem("/v1/batch", key, "retry-after-raise", batch), 402, "raise_budget")
	wantProblem(t, e.withIdem("/v1/eval", key, "eval-after-raise", eval), 402, "raise_budget")
	if r := e.do("PATCH", "/v1/keys/"+keyID, owner, map[string]any{"budget_units": 1000}); r.Status != 200 {
		t.Fatalf("raise: %d %s", r.Status, r.Raw)
	}
	if r := e.withIdem("/v1/batch", key, "retry-after-raise", batch); r.Status != 202 {
		t.Fatalf("job retried after raising the budget: %d %s", r.Status, r.Raw)
	}
	if r := e.withIdem("/v1/eval", key, "eval-after-raise", eval); r.Status != 200 {
		t.Fatalf("eval retried after raising the budget: %d %s", r.Status, r.Raw)
	}
}

// GET /jobs lists the caller's account's jobs of its env, newest first, page by page,
// filtered by state; another account's jobs and the other env's never show; bad
// parameters are 400 naming them.
func TestListJobs(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("lister@example.com")
	other := e.signupPro("other-lister@example.com")
	testKey, _ := e.createKey(key, map[string]any{"env": "test", "scopes": []string{"jobs"}})
	submit := func(k string) string {
		t.Helper()
		r := e.do("POST", "/v1/batch", k, map[string]any{"fens": []string{startFEN}, "depth": 4})
		if r.Status != 202 {
			t.Fatalf("batch: %d %s", r.Status, r.Raw)
		}
		return r.Body["job_id"].(string)
	}
	var mine []string // oldest first
	for range 5 {
		mine = append(mine, submit(key))
	}
	theirs, testJob := submit(other), submit(testKey)
	for _, id := range mine {
		e.waitJob(key, id, finished)
	}
	cancelled := submit(key)
	if r := e.do("DELETE", "/v1/jobs/"+cancelled, key, nil); r.Status != 200 && r.Status != 409 {
		t.Fatalf("cancel: %d %s", r.Status, r.Raw)
	}
	final := e.waitJob(key, cancelled, finished)["state"]
	mine = append(mine, cancelled)
	e.caughtUp()

	list := func(k, query string) response {
		t.Helper()
		r := e.do("GET", "/v1/jobs?"+query, k, nil)
		if r.Status != 200 {
			t.Fatalf("GET /jobs?%s: %d %s", query, r.Status, r.Raw)
		}
		return r
	}
	ids := func(r response) []string {
		var out []string
		for _, j := range r.Body["jobs"].([]any) {
			out = append(out, j.(map[string]any)["job_id"].(string))
		}
		return out
	}
	// pages of 4: the six newest first, then nothing more
	first := list(key, "limit=4")
	next, _ := first.Body["next_cursor"].(string)
	if next == "" || !strings.Contains(first.Header.Get("Link"), "cursor="+next) {
		t.Fatalf("first page: next_cursor %v, Link %q", first.Body["next_cursor"], first.Header.Get("Link"))
	}
	second := list(key, "limit=4&cursor="+next)
	if second.Body["next_cursor"] != nil || second.Header.Get("Link") != "" {
		t.Fatalf("last page: next_cursor %v, Link %q", second.Body["next_cursor"], second.Header.Get("Link"))
	}
	got := append(ids(first), ids(second)...)
	want := slices.Clone(mine)
	slices.Reverse(want)
	if !slices.Equal(got, want) {
		t.Fatalf("listed %v, want newest first %v", got, want)
	}
	j := first.Body["jobs"].([]any)[1].(map[string]any)
	if j["state"] != "succeeded" || j["positions_done"] != float64(1) || j["kind"] != "batch" ||
		!strings.HasSuffix(j["links"].(map[string]any)["self"].(string), "/jobs/"+j["job_id"].(string)) {
		t.Fatalf("a listed job: %v", j)
	}
	if got := ids(list(key, "state="+final.(string))); !slices.Contains(got, cancelled) || len(got) != 1 && final == "cancelled" {
		t.Fatalf("state=%s: %v", final, got)
	}
	if got := ids(list(key, "state=succeeded")); len(got) < 5 || slices.Contains(got, cancelled) && final == "cancelled" {
		t.Fatalf("state=succeeded: %v", got)
	}
	if got := ids(list(other, "")); !slices.Equal(got, []string{theirs}) {
		t.Fatalf("the other account lists %v, want only %s", got, theirs)
	}
	if got := ids(list(testKey, "")); !slices.Equal(got, []string{testJob}) {
		t.Fatalf("the test env lists %v, want only %s", got, testJob)
	}
	for _, tc := range []struct{ query, field string }{
		{"limit=0", "limit"}, {"limit=101", "limit"}, {"limit=x", "limit"}, {"state=done", "state"},
		{"cursor=nope", "cursor"}, {"cursor=" + next + "%21", "cursor"}, {"color=red", "color"}, {"limit=1&limit=2", "limit"},
	} {
		r := e.do("GET", "/v1/jobs?"+tc.query, key, nil)
		if r.Status != 400 || !strings.Contains(r.Raw, `"`+tc.field+`"`) {
			t.Errorf("GET /jobs?%s: %d %s, want 400 naming %s", tc.query, r.Status, r.Raw, tc.field)
		}
	}
}

// A job's event stream whose key is revoked, or loses the jobs scope, after it opened
// gets nothing more: the next batch of events (the job runs after the change) is an
// `error` event with the problem the key now meets, and the stream ends. The job, of
// another key of the account, runs on.
func TestJobStreamEndsWithItsKeysRights(t *testing.T) {
	e := newEnv(t, withWorkers(0)) // the jobs wait in the queue until the worker below
	root := e.signupPro("stream-rights@example.com")
	type open struct {
		name   string
		status float64
		sc     *bufio.Scanner
		jobID  string
	}
	var streams []open
	for _, c := range []struct {
		name   string
		change func(keyID string) response
		status float64
	}{
		{"revoked", func(id string) response { return e.do("DELETE", "/v1/keys/"+id, root, nil) }, 401},
		{"jobs scope removed", func(id string) response {
			return e.do("PATCH", "/v1/keys/"+id, root, map[string]any{"scopes": []string{"eval"}})
		}, 403},
	} {
		_, readerID, id, sc := e.readersStream(t, root, []string{"jobs", "eval"}, 3)
		if ch := c.change(readerID); ch.Status >= 300 {
			t.Fatalf("%s: the key's change: %d %s", c.name, ch.Status, ch.Raw)
		}
		streams = append(streams, open{c.name, c.status, sc, id})
	}
	e.addWorker("late") // the jobs run now, after the changes
	for _, o := range streams {
		var kinds []string
		var problem map[string]any
		for o.sc.Scan() {
			line := o.sc.Text()
			if k, ok := strings.CutPrefix(line, "event: "); ok {
				kinds = append(kinds, k)
			}
			if d, ok := strings.CutPrefix(line, "data: "); ok && len(kinds) > 0 && kinds[len(kinds)-1] == "error" {
				if err := json.Unmarshal([]byte(d), &problem); err != nil {
					t.Fatalf("%s: the error event's data: %v: %s", o.name, err, d)
				}
			}
		}
		if !slices.Equal(kinds, []string{"error"}) || problem["status"] != o.status {
			t.Errorf("%s: after the change the stream sent %q (problem %v), want only an error event of status %v, then its end",
				o.name, kinds, problem, o.status)
		}
		e.waitJob(root, o.jobID, func(j map[string]any) bool { return j["state"] == "succeeded" })
	}
}

// readersStream queues a depth-5 batch of n positions with owner's key and opens its
// event stream with a new key of the account holding scopes (the reader), read up to
// the queued job's first record.
func (e *env) readersStream(t *testing.T, owner string, scopes []string, n int) (reader, readerID, jobID string, sc *bufio.Scanner) {
	t.Helper()
	reader, readerID = e.createKey(owner, map[string]any{"label": "reader", "scopes": scopes})
	r := e.do("POST", "/v1/batch", owner, map[string]any{"fens": jobFENs(n), "depth": 5})
	if r.Status != 202 {
		t.Fatal(r.Raw)
	}
	jobID = r.Body["job_id"].(string)
	res := openSSE(t, e, reader, jobID, "", time.Minute)
	t.Cleanup(func() { res.Body.Close() })
	if res.StatusCode != 200 {
		t.Fatalf("events: %d", res.StatusCode)
	}
	sc = bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "event: state") {
	}
	return reader, readerID, jobID, sc
}

// A job stream whose key cannot be checked again (the database refuses the lookup)
// ends without an `error` event, as a failed read of its events does: the client
// reconnects with Last-Event-ID and is answered once the database is back. Only a
// refused key or scope is told as an error event, which clients take as final.
func TestJobStreamEndsQuietlyWhenItsKeyCannotBeChecked(t *testing.T) {
	e := newEnv(t, withWorkers(0))
	root := e.signupPro("stream-db-away@example.com")
	reader, readerID, id, sc := e.readersStream(t, root, []string{"jobs"}, 2)
	// a change of the key (its label) makes the next check read the database, which
	// cannot answer it
	if ch := e.do("PATCH", "/v1/keys/"+readerID, root, map[string]any{"label": "renamed"}); ch.Status != 200 {
		t.Fatalf("the key's change: %d %s", ch.Status, ch.Raw)
	}
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `ALTER TABLE key_secrets RENAME TO key_secrets_away`); err != nil {
		t.Fatal(err)
	}
	back := func() {
		if _, err := e.pool.Exec(ctx, `ALTER TABLE IF EXISTS key_secrets_away RENAME TO key_secrets`); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(back)
	e.addWorker("late") // the job runs: its events wake the stream, which checks its key
	var kinds []string
	for sc.Scan() {
		if k, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			kinds = append(kinds, k)
		}
	}
	if slices.Contains(kinds, "error") {
		t.Fatalf("a check the database could not answer was told as the key's refusal: %q", kinds)
	}
	back()
	if _, kinds, ended := readSSE(t, e, reader, id, "1", 0); !ended || kinds[len(kinds)-1] != "end" {
		t.Fatalf("the reconnect once the database is back: %q", kinds)
	}
}

// A stopping server ends its open job event streams at once (EndStreams), and any
// opened after: they would hold its stop for as long as their jobs run.
func TestEndStreamsEndsJobEventStreams(t *testing.T) {
	e := newEnv(t, withWorkers(0)) // no worker: the job stays queued, its stream open
	key := e.signupPro("end-streams@example.com")
	r := e.do("POST", "/v1/batch", key, map[string]any{"fens": jobFENs(2), "depth": 5})
	if r.Status != 202 {
		t.Fatal(r.Raw)
	}
	id := r.Body["job_id"].(string)
	e.waitJob(key, id, func(map[string]any) bool { return true })
	res := openSSE(t, e, key, id, "", time.Minute)
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "retry: 1000\n" {
		t.Fatalf("stream: %q %v", line, err)
	}
	ended := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, br); ended <- err }()
	select {
	case err := <-ended:
		t.Fatalf("the stream ended before EndStreams: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	e.api.EndStreams()
	select {
	case err := <-ended:
		if err != nil {
			t.Fatalf("the stream ended with %v, want its end", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream is still open after EndStreams")
	}
	later := openSSE(t, e, key, id, "", time.Minute)
	later.Body.Close()
	if later.StatusCode != http.StatusServiceUnavailable || later.Header.Get("Retry-After") == "" {
		t.Fatalf("a stream opened after EndStreams: %d, Retry-After %q; want 503 and when to come back", later.StatusCode, later.Header.Get("Retry-After"))
	}
}

// A job's key revoked, or its budget or its account's lowered below what it holds,
// while the job waits for a worker: the job fails as it starts and charges nothing (the worker read the
// key after the change and took that copy as the unchanged key; the job ran in full,
// charged, past the lowered budget).
func TestKeyChangeWhileQueuedStopsItsJob(t *testing.T) {
	e := newEnv(t, withWorkers(0)) // the jobs stay queued until the worker below
	owner := e.signupPro("key-change-queued@example.com")
	type queued struct {
		id, keyID string
		code      domain.Code
	}
	var jobs []queued
	for _, c := range []struct {
		change func(keyID string) response
		code   domain.Code
	}{
		{func(id string) response { return e.do("DELETE", "/v1/keys/"+id, owner, nil) }, domain.CodeBadCredential},
		{func(id string) response {
			return e.do("PATCH", "/v1/keys/"+id, owner, map[string]any{"budget_units": 1})
		}, domain.CodeBudget},
		// last: the account's budget is every key's
		{func(string) response { return e.do("PATCH", "/v1/me", owner, map[string]any{"budget_units": 1}) }, domain.CodeBudget},
	} {
		key, keyID := e.createKey(owner, map[string]any{"scopes": []string{"jobs"}, "budget_units": 1_000_000})
		r := e.do("POST", "/v1/batch", key, map[string]any{"fens": jobFENs(4), "depth": 3})
		if r.Status != 202 {
			t.Fatal(r.Raw)
		}
		if ch := c.change(keyID); ch.Status >= 300 {
			t.Fatalf("the key's change: %d %s", ch.Status, ch.Raw)
		}
		jobs = append(jobs, queued{r.Body["job_id"].(string), keyID, c.code})
	}
	e.addWorker("late-worker")
	for _, j := range jobs {
		job := e.waitJob(owner, j.id, finished)
		if jerr, _ := job["error"].(map[string]any); job["state"] != "failed" || jerr["code"] != string(j.code) {
			t.Errorf("a job whose key changed while it was queued: %v", job)
		}
		e.executorsLetGo(j.id)
		if _, rows, spent := e.charged(j.keyID); rows != 0 {
			t.Errorf("%d charges (%d units) for a job whose key changed while it was queued", rows, spent)
		}
	}
}

// A job's key revoked, or its budget or its account's lowered below what it holds,
// while the job runs: the job fails at its next record and charges nothing more; what it recorded stays
// charged, and the rest of its hold goes back.
func TestKeyChangeStopsItsJobs(t *testing.T) {
	e := newEnv(t)
	e.svc.DisableCache() // both cases search their positions: neither is answered from the other's
	owner := e.signupPro("key-change-jobs@example.com")
	fens := midJobFENs
	for _, c := range []struct {
		name   string
		change func(keyID string) response
		code   domain.Code
	}{
		{"revoked", func(id string) response { return e.do("DELETE", "/v1/keys/"+id, owner, nil) }, domain.CodeBadCredential},
		{"budget lowered", func(id string) response {
			return e.do("PATCH", "/v1/keys/"+id, owner, map[string]any{"budget_units": 1})
		}, domain.CodeBudget},
		// last: the account's budget is every key's
		{"account budget lowered", func(string) response {
			return e.do("PATCH", "/v1/me", owner, map[string]any{"budget_units": 1})
		}, domain.CodeBudget},
	} {
		t.Run(c.name, func(t *testing.T) {
			key, keyID := e.createKey(owner, map[string]any{"label": c.name, "scopes": []string{"jobs"}, "budget_units": 1_000_000})
			r := e.do("POST", "/v1/batch", key, map[string]any{"fens": fens, "depth": 14, "multipv": 3})
			if r.Status != 202 {
				t.Fatal(r.Raw)
			}
			id := r.Body["job_id"].(string)
			e.waitJob(owner, id, func(b map[string]any) bool { return b["positions_done"].(float64) >= 1 || finished(b) })
			if ch := c.change(keyID); ch.Status >= 300 {
				t.Fatalf("the key's change: %d %s", ch.Status, ch.Raw)
			}
			job := e.waitJob(owner, id, finished)
			done := job["positions_done"].(float64)
			if done >= float64(len(fens)) {
				t.Fatal("the job finished before the key changed: make it longer")
			}
			if jerr, _ := job["error"].(map[string]any); job["state"] != "failed" || jerr["code"] != string(c.code) {
				t.Fatalf("the job after its key's change: %v", job)
			}
			e.executorsLetGo(id)
			if _, rows, _ := e.charged(keyID); rows != int(done) {
				t.Fatalf("%d charges for %v positions recorded", rows, done)
			}
			var held int64
			if err := e.pool.QueryRow(context.Background(), `SELECT held_units FROM key_balances WHERE key_id = $1`, keyID).Scan(&held); err != nil || held != 0 {
				t.Fatalf("the key still holds %d units (%v)", held, err)
			}
		})
	}
}

// jobEventData reads a job's whole event stream (it has ended) and returns each event's
// kind and data, in order.
func jobEventData(t *testing.T, e *env, key, id string) (kinds []string, data []map[string]any) {
	t.Helper()
	res := openSSE(t, e, key, id, "", 90*time.Second)
	defer res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("events: %d", res.StatusCode)
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	kind := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			kind = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var d map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &d); err != nil {
				t.Fatalf("%s event's data: %v: %s", kind, err, line)
			}
			kinds, data = append(kinds, kind), append(data, d)
			if kind == "end" {
				return kinds, data
			}
		}
	}
	t.Fatalf("the stream ended without end: %v", kinds)
	return nil, nil
}

// A failed job's error is an RFC 9457 problem (decisions.md, Jobs: "error (problem,
// when failed)"), made from the same table as the answers' problems: the type, title,
// status and next_action a request meeting the same condition gets, the job's message
// as detail, the code beside it. GET /jobs/{id}, GET /jobs and the job's state and end
// events show the same one, and its type resolves.
func TestFailedJobErrorIsAProblem(t *testing.T) {
	e := newEnv(t, withWorkers(0)) // the jobs stay queued until their keys have changed
	owner := e.signupPro("job-problem@example.com")
	type failing struct {
		id, code string
		direct   response // what a request meeting the job's condition is answered
	}
	var jobs []failing
	for _, c := range []struct {
		code   domain.Code
		change func(key, keyID string) response
	}{
		{domain.CodeBadCredential, func(key, keyID string) response {
			if r := e.do("DELETE", "/v1/keys/"+keyID, owner, nil); r.Status != 204 {
				t.Fatalf("revoke: %d %s", r.Status, r.Raw)
			}
			return e.do("GET", "/v1/jobs", key, nil) // the revoked key
		}},
		{domain.CodeBudget, func(key, keyID string) response {
			if r := e.do("PATCH", "/v1/keys/"+keyID, owner, map[string]any{"budget_units": 1}); r.Status != 200 {
				t.Fatalf("lower the budget: %d %s", r.Status, r.Raw)
			}
			return e.do("POST", "/v1/batch", key, map[string]any{"fens": jobFENs(4), "depth": 3}) // past the budget
		}},
	} {
		key, keyID := e.createKey(owner, map[string]any{"scopes": []string{"jobs"}, "budget_units": 1_000_000})
		r := e.do("POST", "/v1/batch", key, map[string]any{"fens": jobFENs(4), "depth": 3})
		if r.Status != 202 {
			t.Fatal(r.Raw)
		}
		jobs = append(jobs, failing{r.Body["job_id"].(string), string(c.code), c.change(key, keyID)})
	}
	e.addWorker("late-worker")
	for _, j := range jobs {
		e.waitJob(owner, j.id, finished)
	}
	// the list reads the read model: both failed jobs show once the projection has them
	listed := map[string]any{}
	pgtest.WaitFor(t, "GET /jobs to list both failed jobs", func() bool {
		clear(listed)
		for _, x := range e.do("GET", "/v1/jobs?state=failed", owner, nil).Body["jobs"].([]any) {
			listed[x.(map[string]any)["job_id"].(string)] = x.(map[string]any)["error"]
		}
		return len(listed) == len(jobs)
	})
	for _, j := range jobs {
		t.Run(j.code, func(t *testing.T) {
			job := e.do("GET", "/v1/jobs/"+j.id, owner, nil)
			p, _ := job.Body["error"].(map[string]any)
			if job.Body["state"] != "failed" || p == nil {
				t.Fatalf("the job: %s", job.Raw)
			}
			if j.direct.Status < 400 || j.direct.Header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("the direct request: %d %s", j.direct.Status, j.direct.Raw)
			}
			for _, f := range []string{"type", "title", "status", "next_action"} {
				if p[f] == nil || p[f] != j.direct.Body[f] {
					t.Errorf("the job's error has %s %v; a request meeting its condition gets %v", f, p[f], j.direct.Body[f])
				}
			}
			detail, _ := p["detail"].(string)
			if p["code"] != j.code || detail == "" || p["message"] != detail {
				t.Errorf("the job's error: code %v, detail %q, message %v; want code %s, the message as detail", p["code"], detail, p["message"], j.code)
			}
			if p["instance"] != nil || p["request_id"] != nil {
				t.Errorf("the job's error names a request: %v", p)
			}
			// its type resolves to the same row of the table
			typ, _ := p["type"].(string)
			if !strings.HasPrefix(typ, "http://chessd.test/v1/problems/") {
				t.Fatalf("the job's error has the type %q, not a problem type of this API", typ)
			}
			slug := typ[strings.LastIndex(typ, "/")+1:]
			if page := e.do("GET", "/v1/problems/"+slug, "", nil); page.Status != 200 || page.Body["type"] != p["type"] ||
				page.Body["title"] != p["title"] || page.Body["status"] != p["status"] || page.Body["next_action"] != p["next_action"] {
				t.Errorf("the error's type page: %d %s", page.Status, page.Raw)
			}
			if got := listed[j.id]; !reflect.DeepEqual(got, job.Body["error"]) {
				t.Errorf("GET /jobs lists the error %v, GET /jobs/{id} shows %v", got, p)
			}
			kinds, data := jobEventData(t, e, owner, j.id)
			n := len(kinds)
			if n < 2 || kinds[n-2] != "state" || kinds[n-1] != "end" {
				t.Fatalf("events %v", kinds)
			}
			for i := n - 2; i < n; i++ {
				if data[i]["state"] != "failed" || !reflect.DeepEqual(data[i]["error"], job.Body["error"]) {
					t.Errorf("the %s event's record has the error %v, GET /jobs/{id} %v", kinds[i], data[i]["error"], p)
				}
			}
			if data[0]["error"] != nil {
				t.Errorf("the first state event has an error: %v", data[0])
			}
		})
	}
}
