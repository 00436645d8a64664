package httpapi_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/postgres/pgtest"
)

// streamReads counts the job stream reads (queries of job_stream) made on a pool.
type streamReads struct{ n atomic.Int64 }

func (c *streamReads) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "FROM job_stream") {
		c.n.Add(1)
	}
	return ctx
}

func (c *streamReads) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Many open event streams of a job that does not move cost no queries: each reads once
// when it opens and then waits for the database's notification; a change wakes them all.
func TestIdleStreamsMakeNoQueries(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	reads := &streamReads{}
	cfg.ConnConfig.Tracer = reads
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	const streams = 300
	e := newEnv(t, onPool(pool), withWorkers(0), withStreamsPerAccount(streams)) // no worker: the job stays queued
	key := e.signupPro("idle-streams@example.com")
	r := e.do("POST", "/v1/batch", key, map[string]any{"fens": jobFENs(2), "depth": 5})
	if r.Status != 202 {
		t.Fatal(r.Raw)
	}
	id := r.Body["job_id"].(string)
	e.waitJob(key, id, func(map[string]any) bool { return true }) // the projection has the job

	var opened, ended sync.WaitGroup
	for range streams {
		opened.Add(1)
		ended.Add(1)
		go func() {
			defer ended.Done()
			res := openSSE(t, e, key, id, "", time.Minute)
			defer res.Body.Close()
			sc := bufio.NewScanner(res.Body)
			first := true
			for sc.Scan() {
				if first && strings.HasPrefix(sc.Text(), "data: ") { // the queued state: the stream is open
					first = false
					opened.Done()
				}
			}
			if first {
				opened.Done()
			}
		}()
	}
	opened.Wait()
	before := reads.n.Load()
	if before < streams {
		t.Fatalf("%d stream reads for %d streams", before, streams)
	}
	// The condition is the absence of queries over a span of time: one second of it.
	<-time.After(time.Second)
	if idle := reads.n.Load() - before; idle != 0 {
		t.Fatalf("%d idle streams made %d queries in a second", streams, idle)
	}
	// a change (the cancel) wakes every stream: each reads it and ends
	if c := e.do("DELETE", "/v1/jobs/"+id, key, nil); c.Status != 200 {
		t.Fatalf("cancel: %d %s", c.Status, c.Raw)
	}
	ended.Wait()
	if woke := reads.n.Load() - before; woke < streams {
		t.Fatalf("the cancel woke %d stream reads for %d streams", woke, streams)
	}
}

// An account holds at most StreamsPerAccount job event streams open on one server in
// each env, whichever of its keys and jobs they follow: one more is refused with 429 and
// Retry-After, while the account's test key and another account still open theirs; a
// stream that closes gives its slot back.
func TestStreamsPerAccount(t *testing.T) {
	const limit = 3
	e := newEnv(t, withWorkers(0), withStreamsPerAccount(limit)) // no worker: the jobs stay queued
	queued := func(key string) string {
		r := e.do("POST", "/v1/batch", key, map[string]any{"fens": jobFENs(1), "depth": 5})
		if r.Status != 202 {
			t.Fatal(r.Raw)
		}
		id := r.Body["job_id"].(string)
		e.waitJob(key, id, func(map[string]any) bool { return true }) // the projection has it
		return id
	}
	key, other := e.signupPro("streams-a@example.com"), e.signupPro("streams-b@example.com")
	second, _ := e.createKey(key, map[string]any{"label": "second", "scopes": []string{"jobs"}})
	testKey, _ := e.createKey(key, map[string]any{"label": "test", "env": "test", "scopes": []string{"jobs"}})
	job, secondJob, testJob, otherJob := queued(key), queued(second), queued(testKey), queued(other)
	open := func(key, id string) (*http.Response, context.CancelFunc) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		req, _ := http.NewRequestWithContext(ctx, "GET", e.srv.URL+"/v1/jobs/"+id+"/events", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := e.srv.Client().Do(req)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		t.Cleanup(func() { res.Body.Close(); cancel() })
		return res, cancel
	}
	var closeFirst context.CancelFunc
	for i, s := range []struct{ key, job string }{{key, job}, {second, secondJob}, {second, job}} {
		res, cancel := open(s.key, s.job)
		if res.StatusCode != 200 {
			t.Fatalf("stream %d: %d", i, res.StatusCode)
		}
		if i == 0 {
			closeFirst = cancel
		}
	}
	res, _ := open(key, secondJob)
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != 429 || res.Header.Get("Retry-After") != "5" || !strings.Contains(string(body), "job event streams open") {
		t.Fatalf("stream %d of one account: %d, Retry-After %q: %s", limit+1, res.StatusCode, res.Header.Get("Retry-After"), body)
	}
	if res, _ := open(testKey, testJob); res.StatusCode != 200 {
		t.Fatalf("the account's test stream: %d", res.StatusCode)
	}
	if res, _ := open(other, otherJob); res.StatusCode != 200 {
		t.Fatalf("another account's stream: %d", res.StatusCode)
	}
	closeFirst()
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, _ := open(second, secondJob)
		if res.StatusCode == 200 {
			break
		}
		if res.StatusCode != 429 || time.Now().After(deadline) {
			t.Fatalf("after one stream closed: %d", res.StatusCode)
		}
		time.Sleep(20 * time.Millisecond) // the closed stream's handler returns when it sees the disconnect
	}
}
