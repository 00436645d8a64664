package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/projections"
)

// streamDepth makes the batch last more than one of a worker's records (RecordEvery,
// 1 s): at depth 8 it took one, and at depth 12 one or two.
const streamDepth = 14

// streamLatency measures how soon a job's event stream shows a position after the
// transaction that recorded it: the SSE client's receipt time minus the recorded time of
// the JobPositionAnalysed event (one machine, one clock). The stream waits for the jobs
// projection's notification (no polling while it listens). It measures once alone and
// once while charged calls settle beside the job: their transactions, open when a
// record commits, keep the record out of the projection's sight until they end.
func (b *bench) streamLatency() error {
	b.svc.DisableCache()
	defer b.svc.EnableCache()
	fmt.Printf("\n## Job event stream: from a position's commit to the SSE client\n\n")
	fmt.Printf("One 30-position batch at depth %d (cache off, several records), one SSE client; latency = when the client read the `position`\n", streamDepth)
	fmt.Println("event minus when the commit that recorded it was heard (its NOTIFY on the jobs topic, by a listener in the bench; issue 13's measure),")
	fmt.Println("and minus the recorded time of its JobPositionAnalysed event, set when the record appends it, before its transaction commits (the stream waits for the jobs projection's NOTIFY).")
	fmt.Printf("Settling beside: the same with charged POST /eval calls on a finished game (no engine, the cached price) at %d a second meanwhile,\n", settlingRate)
	fmt.Println("each settled by the meter in its own transaction.")
	fmt.Println()
	fmt.Println("| run | positions | **from the commit: median ms** | p90 ms | max ms | from the record's timestamp: median ms | p90 ms | max ms | where it goes: timestamp to commit / commit to projection / projection to client, medians ms |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for _, settling := range []bool{false, true} {
		if err := b.streamOnce(settling); err != nil {
			return err
		}
	}
	return nil
}

// settlingRate is how many charged calls a second settle beside the stream's job.
const settlingRate = 200

// settle posts charged calls on a finished game (no engine runs: the cached price) at
// settlingRate until ctx ends.
func (b *bench) settle(ctx context.Context) {
	const mate = "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3" // fool's mate
	tick := time.NewTicker(time.Second / settlingRate)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			b.post(b.url, "/eval", fmt.Sprintf(`{"fen":%q,"depth":10}`, mate), b.key, nil) //nolint:errcheck // load only
		}
	}
}

func (b *bench) streamOnce(settling bool) error {
	if settling {
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); b.settle(ctx) }()
		defer func() { stop(); <-done }()
	}
	fens := jobPositions()[:30]
	body, _ := json.Marshal(map[string]any{"fens": fens, "depth": streamDepth})
	var job struct {
		ID string `json:"job_id"`
	}
	// when the record's commit (its bus NOTIFY on the jobs topic) and the jobs
	// projection's commit (the stream's own NOTIFY) reached a listener here
	wctx, stopListening := context.WithCancel(context.Background())
	defer stopListening()
	wake := eventstore.Listen(wctx, b.pool, b.logger)
	committed, unsubCommits := wake.Subscribe("jobs")
	defer unsubCommits()
	if err := b.post(b.url, "/batch", string(body), b.key, &job); err != nil {
		return err
	}
	projected, unsubProjected := wake.Subscribe(projections.JobStreamTopic(job.ID))
	defer unsubProjected()
	var mu sync.Mutex
	var commitTimes, projectTimes []time.Time
	go func() {
		for {
			select {
			case <-wctx.Done():
				return
			case <-committed:
				mu.Lock()
				commitTimes = append(commitTimes, time.Now())
				mu.Unlock()
			case <-projected:
				mu.Lock()
				projectTimes = append(projectTimes, time.Now())
				mu.Unlock()
			}
		}
	}()
	req, _ := http.NewRequest("GET", b.url+"/jobs/"+job.ID+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+b.key)
	res, err := b.client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	seen := map[int]time.Time{} // position index -> when the client read it
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	kind := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			kind = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: ") && kind == "position":
			var p struct {
				Index int `json:"index"`
			}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &p); err == nil {
				seen[p.Index] = time.Now()
			}
		}
	}
	evs, err := eventstore.Load(context.Background(), b.pool, domain.JobStream(job.ID))
	if err != nil {
		return err
	}
	stopListening()
	mu.Lock()
	defer mu.Unlock()
	after := func(ts []time.Time, t time.Time) (time.Time, bool) {
		for _, x := range ts {
			if !x.Before(t) {
				return x, true
			}
		}
		return time.Time{}, false
	}
	var lat, fromCommit, toCommit, toProject, toClient []time.Duration
	for _, e := range evs {
		if e.Type != "JobPositionAnalysed" {
			continue
		}
		var p struct {
			Index int `json:"index"`
		}
		if json.Unmarshal(e.Payload, &p) == nil {
			if at, ok := seen[p.Index]; ok {
				lat = append(lat, at.Sub(e.RecordedAt))
				c, ok1 := after(commitTimes, e.RecordedAt)
				pr, ok2 := after(projectTimes, c)
				if ok1 && ok2 && !pr.After(at) {
					toCommit, toProject, toClient = append(toCommit, c.Sub(e.RecordedAt)), append(toProject, pr.Sub(c)), append(toClient, at.Sub(pr))
				}
				if ok1 && !c.After(at) {
					fromCommit = append(fromCommit, at.Sub(c))
				}
			}
		}
	}
	if len(lat) == 0 || len(fromCommit) == 0 {
		return fmt.Errorf("the stream showed no positions, or none after its commit was heard")
	}
	slices.Sort(lat)
	slices.Sort(fromCommit)
	run, where := "alone", "–"
	if settling {
		run = fmt.Sprintf("settling beside (%d a second)", settlingRate)
	}
	if len(toClient) > 0 {
		where = fmt.Sprintf("%.1f / %.1f / %.1f", ms(median(toCommit)), ms(median(toProject)), ms(median(toClient)))
	}
	fmt.Printf("| %s | %d | **%.1f** | %.1f | %.1f | %.1f | %.1f | %.1f | %s |\n", run, len(fromCommit), ms(fromCommit[len(fromCommit)/2]),
		ms(fromCommit[len(fromCommit)*9/10]), ms(fromCommit[len(fromCommit)-1]), ms(lat[len(lat)/2]), ms(lat[len(lat)*9/10]), ms(lat[len(lat)-1]), where)
	return nil
}
