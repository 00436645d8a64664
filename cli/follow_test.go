package cli

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"chessd/client"
)

// followJob gives up after maxReconnects attempts in a row that brought no event (not
// one more), and a Retry-After of 0 does not make it ask back to back.
func TestFollowJobGivesUp(t *testing.T) {
	var asked atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
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
}
