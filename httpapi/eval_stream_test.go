package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"chessd/engine"
	"chessd/postgres/pgtest"
)

const (
	sse    = "text/event-stream"
	ndjson = "application/x-ndjson"
)

// streamEvent is one event of a streamed /eval or /bestmove answer.
type streamEvent struct {
	Name string          `json:"event"`
	Data json.RawMessage `json:"data"`
}

// openStream posts body to path with Accept: media and returns the answer, whose
// events next reads one at a time (false at the end of the stream).
func (e *env) openStream(ctx context.Context, path, key, media, body string, header http.Header) (*http.Response, func() (streamEvent, bool)) {
	e.t.Helper()
	req, err := http.NewRequestWithContext(ctx, "POST", e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Accept", media)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { res.Body.Close() })
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	next := func() (streamEvent, bool) {
		var ev streamEvent
		for sc.Scan() {
			line := sc.Text()
			if media == ndjson {
				if err := json.Unmarshal([]byte(line), &ev); err != nil {
					e.t.Fatalf("NDJSON line %q: %v", line, err)
				}
				return ev, true
			}
			switch {
			case line == "":
				if ev.Name != "" {
					return ev, true
				}
			case strings.HasPrefix(line, ":"): // a comment (keep-alive)
			case strings.HasPrefix(line, "event: "):
				ev.Name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.Data = json.RawMessage(strings.TrimPrefix(line, "data: "))
			default:
				e.t.Fatalf("unexpected SSE line %q", line)
			}
		}
		return streamEvent{}, false
	}
	return res, next
}

// stream runs a streamed call to its end and returns its events.
func (e *env) stream(path, key, media, body string, header http.Header) (*http.Response, []streamEvent) {
	e.t.Helper()
	res, next := e.openStream(context.Background(), path, key, media, body, header)
	var evs []streamEvent
	for ev, ok := next(); ok; ev, ok = next() {
		evs = append(evs, ev)
	}
	return res, evs
}

// decodeObject unmarshals a JSON object.
func decodeObject(t *testing.T, raw []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("not a JSON object: %q", raw)
	}
	return m
}

// comparable drops what legitimately differs between two searches of one request: the
// time they took.
func comparable(m map[string]any) map[string]any {
	delete(m, "time_ms")
	return m
}

const streamFEN = "r1bqkb1r/pppp1ppp/2n2n2/4p3/2B1P3/5N2/PPPP1PPP/RNBQK2R w KQkq - 4 4"

// A streamed /eval sends each depth, deepening, with its lines in UCI and SAN, then a
// result equal to the plain answer of the same request; both are charged like one call.
func TestEvalStream(t *testing.T) {
	for _, media := range []string{sse, ndjson} {
		t.Run(media, func(t *testing.T) {
			e := newEnv(t)
			key, keyID := e.signupProID("stream@example.com")
			// Both calls search afresh, so they do the same deterministic search.
			e.svc.DisableCache()
			body := evalBody(streamFEN, `"depth":12,"multipv":2,"options":{"show_wdl":true}`)
			res, evs := e.stream("/v1/eval", key, media, body, nil)
			if res.StatusCode != 200 || res.Header.Get("Content-Type") != media {
				t.Fatalf("status %d, content type %q", res.StatusCode, res.Header.Get("Content-Type"))
			}
			if res.Header.Get("Cache-Control") != "no-store" || res.Header.Get("X-Accel-Buffering") != "no" {
				t.Fatalf("headers %v", res.Header)
			}
			if len(evs) < 2 {
				t.Fatalf("%d events, want depths and a result", len(evs))
			}
			last := 0
			for _, ev := range evs[:len(evs)-1] {
				if ev.Name != "depth" {
					t.Fatalf("event %q before the result", ev.Name)
				}
				d := decodeObject(t, ev.Data)
				depth := int(d["depth"].(float64))
				if depth <= last {
					t.Fatalf("depth %d after %d", depth, last)
				}
				last = depth
				checkDepthEvent(t, d)
			}
			if last != 12 {
				t.Fatalf("last depth event %d, want 12", last)
			}
			final := evs[len(evs)-1]
			if final.Name != "result" {
				t.Fatalf("last event %q, want result", final.Name)
			}
			got := decodeObject(t, final.Data)
			lastDepth := decodeObject(t, evs[len(evs)-2].Data)
			if !reflect.DeepEqual(lastDepth["pvs"], got["pvs"]) {
				t.Fatalf("the last depth's lines %v are not the result's %v", lastDepth["pvs"], got["pvs"])
			}

			plain := e.do("POST", "/v1/eval", key, body)
			if plain.Status != 200 {
				t.Fatalf("plain: %d %s", plain.Status, plain.Raw)
			}
			if !reflect.DeepEqual(comparable(got), comparable(plain.Body)) {
				t.Fatalf("streamed result\n%s\nplain answer\n%s", final.Data, plain.Raw)
			}
			events, rows, spent := e.charged(keyID)
			if events != 2 || rows != 2 || spent != 2*int64(plain.Body["cost_units"].(float64)) {
				t.Fatalf("charged %d events, %d rows, %d units; want two calls of %v", events, rows, spent, plain.Body["cost_units"])
			}
		})
	}
}

// checkDepthEvent checks one depth event of a depth-12, multipv-2, show_wdl request.
func checkDepthEvent(t *testing.T, d map[string]any) {
	t.Helper()
	for _, f := range []string{"depth", "seldepth", "nodes", "nps", "time_ms"} {
		if _, ok := d[f].(float64); !ok {
			t.Fatalf("depth event without %s: %v", f, d)
		}
	}
	eval, _ := d["eval"].(map[string]any)
	if typ := eval["type"]; typ != "cp" && typ != "mate" {
		t.Fatalf("eval %v", d["eval"])
	}
	if _, ok := d["wdl"].(map[string]any); !ok {
		t.Fatalf("no wdl: %v", d)
	}
	pvs, _ := d["pvs"].([]any)
	if len(pvs) != 2 {
		t.Fatalf("%d lines, want 2: %v", len(pvs), d)
	}
	for _, p := range pvs {
		pv := p.(map[string]any)
		uci, _ := pv["moves"].([]any)
		san, _ := pv["moves_san"].([]any)
		if len(uci) == 0 || len(uci) != len(san) || pv["wdl"] == nil {
			t.Fatalf("line %v", pv)
		}
	}
}

// /bestmove streams the same depths and ends with its own short answer; a cached answer
// is one result event.
func TestBestMoveStreamAndCache(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("stream-best@example.com")
	body := evalBody(streamFEN, `"depth":10`)
	_, evs := e.stream("/v1/bestmove", key, sse, body, nil)
	if len(evs) != 11 || evs[10].Name != "result" {
		t.Fatalf("%d events (%v), want 10 depths and the result", len(evs), evs)
	}
	plain := e.do("POST", "/v1/bestmove", key, body) // now cached
	got := decodeObject(t, evs[10].Data)
	if got["bestmove"] == nil || got["bestmove"] != plain.Body["bestmove"] || got["pvs"] != nil {
		t.Fatalf("streamed %s, plain %s", evs[10].Data, plain.Raw)
	}

	res, evs := e.stream("/v1/eval", key, ndjson, body, nil)
	if res.StatusCode != 200 || len(evs) != 1 || evs[0].Name != "result" {
		t.Fatalf("cached: %d, %v", res.StatusCode, evs)
	}
	if d := decodeObject(t, evs[0].Data); d["cached"] != true {
		t.Fatalf("cached result %s", evs[0].Data)
	}
}

// What fails before the first event is an ordinary problem+json.
func TestEvalStreamRefusals(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name, key, body string
		status          int
		next            string
	}{
		{"invalid", "", evalBody(streamFEN, `"depth":99`), 400, "fix_request"},
		{"keyless over the cap", "", evalBody(streamFEN, `"depth":20`), 402, "sign_up"},
		{"bad key", "sk_live_nope", evalBody(streamFEN, ""), 401, "fix_request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, media := range []string{sse, ndjson} {
				req, _ := http.NewRequest("POST", e.srv.URL+"/v1/eval", strings.NewReader(tc.body))
				req.Header.Set("Accept", media)
				if tc.key != "" {
					req.Header.Set("Authorization", "Bearer "+tc.key)
				}
				wantProblem(t, e.send(req), tc.status, tc.next)
			}
		})
	}
}

// A client that leaves after the first depth stops its search (the engine process is
// idle again, long before the search's 60 s) and is charged nothing.
func TestEvalStreamDisconnect(t *testing.T) {
	for _, media := range []string{sse, ndjson} {
		t.Run(media, func(t *testing.T) {
			e := newEnv(t)
			key, keyID := e.signupProID("leaver@example.com")
			pool, err := e.svc.Catalog().Pool(context.Background(), "sf-17.1", engine.PathNative)
			if err != nil {
				t.Fatal(err)
			}
			idle := func() bool { s := pool.Stats(); return s.Idle == s.Size && s.Live == s.Size }
			pgtest.WaitFor(t, "an idle pool", idle)
			before := pool.Stats().Searches

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			body := evalBody("r2q1rk1/ppp2ppp/2np1n2/2b1p3/2B1P1b1/2NP1N2/PPP2PPP/R1BQ1RK1 w - - 0 8", `"depth":30,"movetime_ms":60000`)
			res, next := e.openStream(ctx, "/v1/eval", key, media, body, nil)
			if res.StatusCode != 200 {
				raw, _ := io.ReadAll(res.Body)
				t.Fatalf("%d %s", res.StatusCode, raw)
			}
			if ev, ok := next(); !ok || ev.Name != "depth" {
				t.Fatalf("first event %v %v, want a depth", ev, ok)
			}
			cancel()
			res.Body.Close()
			// waitFor gives up after 20 s: only a stopped search frees the process so soon
			pgtest.WaitFor(t, "the search to stop", idle)
			if s := pool.Stats(); s.Searches != before+1 {
				t.Fatalf("%d searches, want 1", s.Searches-before)
			}
			if events, rows, spent := e.charged(keyID); events != 0 || rows != 0 || spent != 0 {
				t.Fatalf("charged %d events, %d rows, %d units; want nothing", events, rows, spent)
			}
			// the process went back clean: the next call is answered
			if r := e.do("POST", "/v1/eval", key, evalBody(startFEN, `"depth":8`)); r.Status != 200 {
				t.Fatalf("next call: %d %s", r.Status, r.Raw)
			}
		})
	}
}

// A client that leaves a plain call before its answer stops the search, is charged
// nothing and is recorded as 499 (client closed), not as a server error.
func TestClientGoneIsNotAServerError(t *testing.T) {
	var mu sync.Mutex
	var statuses []int
	e := newEnv(t, observing(func(route, _ string, status int, _ time.Duration) {
		if route == "/v1/eval" {
			mu.Lock()
			statuses = append(statuses, status)
			mu.Unlock()
		}
	}))
	key, keyID := e.signupProID("gone@example.com")
	pool, err := e.svc.Catalog().Pool(context.Background(), "sf-17.1", engine.PathNative)
	if err != nil {
		t.Fatal(err)
	}
	idle := func() bool { s := pool.Stats(); return s.Idle == s.Size && s.Live == s.Size }
	pgtest.WaitFor(t, "an idle pool", idle)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := evalBody("r2q1rk1/ppp2ppp/2np1n2/2b1p3/2B1P1b1/2NP1N2/PPP2PPP/R1BQ1RK1 w - - 0 8", `"depth":30,"movetime_ms":60000`)
	req, err := http.NewRequestWithContext(ctx, "POST", e.srv.URL+"/v1/eval", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	gone := make(chan error, 1)
	go func() {
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
		}
		gone <- err
	}()
	pgtest.WaitFor(t, "the search to start", func() bool { return !idle() })
	cancel()
	if err := <-gone; err == nil {
		t.Fatal("the call was answered before its client left")
	}
	pgtest.WaitFor(t, "the call to be recorded", func() bool { mu.Lock(); defer mu.Unlock(); return len(statuses) > 0 })
	pgtest.WaitFor(t, "the search to stop", idle)
	mu.Lock()
	got := statuses[0]
	mu.Unlock()
	if got != 499 {
		t.Fatalf("recorded status %d, want 499", got)
	}
	if events, rows, spent := e.charged(keyID); events != 0 || rows != 0 || spent != 0 {
		t.Fatalf("charged %d events, %d rows, %d units; want nothing", events, rows, spent)
	}
}

// A streamed call with an Idempotency-Key is charged once; a retry gets the stored
// answer as its only event, and a plain retry the same body.
func TestEvalStreamIdempotency(t *testing.T) {
	e := newEnv(t)
	key, keyID := e.signupProID("stream-idem@example.com")
	body := evalBody(streamFEN, `"depth":9`)
	hdr := http.Header{"Idempotency-Key": {"stream-1"}}
	_, first := e.stream("/v1/eval", key, sse, body, hdr)
	if len(first) < 2 || first[len(first)-1].Name != "result" {
		t.Fatalf("first call: %v", first)
	}
	result := first[len(first)-1].Data
	if err := e.meter.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	res, again := e.stream("/v1/eval", key, ndjson, body, hdr)
	if res.Header.Get("Idempotent-Replayed") != "true" || len(again) != 1 || again[0].Name != "result" ||
		string(again[0].Data) != string(result) {
		t.Fatalf("replay: %v %v, want the stored result %s", res.Header, again, result)
	}
	plain := e.withIdem("/v1/eval", key, "stream-1", body)
	if plain.Status != 200 || plain.Raw != string(result) {
		t.Fatalf("plain replay %d %s, want %s", plain.Status, plain.Raw, result)
	}
	if events, rows, _ := e.charged(keyID); events != 1 || rows != 1 {
		t.Fatalf("charged %d events, %d rows; want one", events, rows)
	}
}
