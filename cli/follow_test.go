package cli

import (
	"context"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"chessd/client"
)

// followJob gives up after maxReconnects attempts in a row that brought no event (not
// one more), and a Retry-After of 0 does not make it ask back to back.
func TestFollowJobGivesUp(t *testing.T) {
	var asked atomic.Int64
	var mu sync.Mutex
	var at []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
		w.Header().Set("Content-Type", "application/problem+json")
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"title":"Service Unavailable","status":503,"detail":"stopping"}`) //nolint:errcheck // the test's server
	}))
	defer srv.Close()
	api, err := client.NewClientWithResponses(srv.URL + "/v1")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{io: IO{Err: io.Discard}, api: api}
	err = followJob(context.Background(), e, "job_x", newProgress(e), func(client.StreamEvent) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "no events in 10 attempts in a row") || asked.Load() != maxReconnects {
		t.Fatalf("gave up with %v after %d requests, want after %d", err, asked.Load(), maxReconnects)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < reconnectFirst {
			t.Fatalf("request %d came %v after the one before: Retry-After: 0 made it ask at once", i+1, gap)
		}
	}
}

// A stream that stays open but brings nothing, not even a keep-alive, counts as cut
// after streamIdle: the watch reconnects after the last event it saw and follows the
// job to its end.
func TestFollowJobReconnectsAnIdleStream(t *testing.T) {
	defer func(d time.Duration) { streamIdle = d }(streamIdle)
	streamIdle = 300 * time.Millisecond
	var mu sync.Mutex
	var lastIDs []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		lastIDs = append(lastIDs, r.Header.Get("Last-Event-ID"))
		first := len(lastIDs) == 1
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		if first {
			io.WriteString(w, "retry: 1000\n\nid: 1\nevent: state\ndata: {}\n\n") //nolint:errcheck // the test's server
			w.(http.Flusher).Flush()
			<-r.Context().Done() // held open, silent, as a wedged proxy would
			return
		}
		io.WriteString(w, "id: 2\nevent: end\ndata: {}\n\n") //nolint:errcheck // as above
	}))
	defer srv.Close()
	api, err := client.NewClientWithResponses(srv.URL + "/v1")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{io: IO{Err: io.Discard}, api: api}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var events []string
	err = followJob(ctx, e, "job_x", newProgress(e), func(ev client.StreamEvent) error {
		events = append(events, ev.Event+"/"+ev.ID)
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if err != nil || strings.Join(events, " ") != "state/1 end/2" || strings.Join(lastIDs, ",") != ",1" {
		t.Fatalf("followJob: %v; events %v; Last-Event-IDs sent %q", err, events, lastIDs)
	}
}

// A watch stopped (Ctrl-C) while the job runs says that the job goes on, charged, and
// how to follow it again, rather than "context canceled".
func TestStoppedWatchSaysTheJobGoesOn(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "id: 1\nevent: state\ndata: {\"job_id\":\"job_x\",\"state\":\"running\"}\n\n") //nolint:errcheck // the test's server
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the job runs on
	}))
	defer srv.Close()
	api, err := client.NewClientWithResponses(srv.URL + "/v1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Ctrl-C once the state event is shown: the watch is under way
	e := &env{io: IO{Out: io.Discard, Err: cancelOn{"running", cancel}}, api: api}
	err = watch(ctx, e, "job_x", false)
	for _, want := range []string{"stopped watching job job_x", "goes on running", "charged", "chessd jobs watch job_x"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("a stopped watch: %v, want it to say %q", err, want)
		}
	}
}

// cancelOn is a progress output that calls cancel once a line says word.
type cancelOn struct {
	word   string
	cancel context.CancelFunc
}

func (c cancelOn) Write(p []byte) (int, error) {
	if strings.Contains(string(p), c.word) {
		c.cancel()
	}
	return len(p), nil
}

// analyze stopped while its job is submitted says the job may have been accepted, and
// how to find it, rather than "context canceled".
func TestStoppedSubmitSaysTheJobMayRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	answered := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cancel() // Ctrl-C while the server takes the job
		<-answered
	}))
	defer srv.Close()
	defer close(answered) // before Close, which waits for the handler
	api, err := client.NewClientWithResponses(srv.URL + "/v1")
	if err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("analyze", flag.ContinueOnError)
	run := analyzeCommand(fs)
	if err := fs.Parse([]string{"--fen", "8/8/8/8/8/8/8/K6k w - - 0 1"}); err != nil {
		t.Fatal(err)
	}
	err = run(ctx, &env{io: IO{Out: io.Discard, Err: io.Discard}, api: api})
	if err == nil || !strings.Contains(err.Error(), "may have been accepted") || !strings.Contains(err.Error(), "GET /v1/jobs") {
		t.Fatalf("a stopped submit: %v", err)
	}
}

// An `error` event (the stream's key was revoked, or lost the jobs scope, while it was
// open) ends the watch with its problem at once: no reconnect, which the same key would
// only have refused.
func TestFollowJobEndsAtAnErrorEvent(t *testing.T) {
	var asked atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if asked.Add(1) > 1 { // as the service answers the key now
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"title":"Unauthorized","status":401,"detail":"this API key was revoked"}`) //nolint:errcheck // the test's server
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "retry: 1000\n\nid: 1\nevent: state\ndata: {\"job_id\":\"job_x\",\"state\":\"queued\"}\n\n"+ //nolint:errcheck // the test's server
			"event: error\ndata: {\"title\":\"Unauthorized\",\"status\":401,\"detail\":\"this API key was revoked\"}\n\n")
	}))
	defer srv.Close()
	api, err := client.NewClientWithResponses(srv.URL + "/v1")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{io: IO{Err: io.Discard}, api: api}
	var kinds []string
	err = followJob(context.Background(), e, "job_x", newProgress(e), func(ev client.StreamEvent) error {
		kinds = append(kinds, ev.Event)
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "401 Unauthorized: this API key was revoked") || asked.Load() != 1 ||
		strings.Join(kinds, ",") != "state" {
		t.Fatalf("ended with %v after %d requests, events %q; want the problem after one request and its state event", err, asked.Load(), kinds)
	}
}
