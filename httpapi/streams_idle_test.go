package httpapi_test

import (
	"bufio"
	"context"
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
	e := newEnv(t, onPool(pool), withWorkers(0)) // no worker: the job stays queued
	key := e.signupPro("idle-streams@example.com")
	r := e.do("POST", "/v1/batch", key, map[string]any{"fens": jobFENs(2), "depth": 5})
	if r.Status != 202 {
		t.Fatal(r.Raw)
	}
	id := r.Body["job_id"].(string)
	e.waitJob(key, id, func(map[string]any) bool { return true }) // the projection has the job

	const streams = 300
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
