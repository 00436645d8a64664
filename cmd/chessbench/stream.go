package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"chessd/domain"
	"chessd/eventstore"
)

// streamLatency measures how soon a job's event stream shows a position after the
// transaction that recorded it: the SSE client's receipt time minus the recorded time of
// the JobPositionAnalysed event (one machine, one clock). The stream waits for the jobs
// projection's notification (no polling while it listens).
func (b *bench) streamLatency() error {
	b.svc.DisableCache()
	defer b.svc.EnableCache()
	fens := jobPositions()[:30]
	body, _ := json.Marshal(map[string]any{"fens": fens, "depth": 8})
	var job struct {
		ID string `json:"job_id"`
	}
	if err := b.post(b.url, "/batch", string(body), b.key, &job); err != nil {
		return err
	}
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
	var lat []time.Duration
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
			}
		}
	}
	if len(lat) == 0 {
		return fmt.Errorf("the stream showed no positions")
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	fmt.Printf("\n## Job event stream: from a position's record to the SSE client\n\n")
	fmt.Println("One 30-position batch at depth 8 (cache off), one SSE client; latency = when the client read the `position`")
	fmt.Println("event minus the recorded time of its JobPositionAnalysed event (the stream waits for the jobs projection's NOTIFY).")
	fmt.Println()
	fmt.Println("| positions | median ms | p90 ms | max ms |")
	fmt.Println("|---|---|---|---|")
	fmt.Printf("| %d | %.1f | %.1f | %.1f |\n", len(lat), ms(lat[len(lat)/2]), ms(lat[len(lat)*9/10]), ms(lat[len(lat)-1]))
	return nil
}
