package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"chessd/domain/position"
)

// games give 50 distinct positions for the job benchmarks.
var games = []string{
	"1. e4 c5 2. Nf3 d6 3. d4 cxd4 4. Nxd4 Nf6 5. Nc3 a6 6. Be3 e5 7. Nb3 Be6 8. f3 Be7 9. Qd2 O-O 10. O-O-O Nbd7 11. g4 b5 12. g5 b4 13. Ne2 Ne8 *",
	"1. d4 Nf6 2. c4 e6 3. Nc3 Bb4 4. e3 O-O 5. Bd3 d5 6. Nf3 c5 7. O-O Nc6 8. a3 Bxc3 9. bxc3 dxc4 10. Bxc4 Qc7 11. Bd3 e5 12. Qc2 Re8 13. Nxe5 Nxe5 14. dxe5 Qxe5 *",
}

func jobPositions() []string {
	var fens []string
	seen := map[string]bool{}
	for _, g := range games {
		game, err := position.ParsePGN(g, false, 0)
		if err != nil {
			panic(err)
		}
		for _, p := range game.Plies {
			if !seen[p.FEN] && len(fens) < 50 {
				seen[p.FEN] = true
				fens = append(fens, p.FEN)
			}
		}
	}
	return fens
}

// jobs measures 50-position batches through the service (submit to succeeded, cache
// off) against raw Stockfish on the same positions with the same number of processes,
// and single /eval latency while a batch runs.
func (b *bench) jobs() error {
	fens := jobPositions()
	fmt.Printf("\n## Jobs: 50-position batches against raw Stockfish (cache off)\n\n")
	fmt.Printf("%d distinct positions from two games; 2 engine processes on both sides (raw: two warm processes splitting the positions, ucinewgame before each).\n\n", len(fens))
	fmt.Println("| depth | raw positions/s | service positions/s | service / raw |")
	fmt.Println("|---|---|---|---|")
	b.svc.DisableCache()
	defer b.svc.EnableCache()
	for _, depth := range []int{10, 14} {
		took, err := runRawAll(b.binary, depth, 2, fens)
		if err != nil {
			return err
		}
		raw := float64(len(fens)) / took.Seconds()
		start := time.Now()
		if err := b.runJob(fens, depth); err != nil {
			return err
		}
		svc := float64(len(fens)) / time.Since(start).Seconds()
		fmt.Printf("| %d | %.1f | %.1f | **%.2f** |\n", depth, raw, svc, svc/raw)
	}

	fmt.Printf("\n## Single POST /eval latency while a batch runs\n\n")
	fmt.Println("Sequential depth-10 evals of one client (cache off), alone and while a 50-position depth-14 batch uses both processes.")
	fmt.Println()
	fmt.Println("| while | evals | p50 ms | p99 ms | max ms |")
	fmt.Println("|---|---|---|---|---|")
	evals := func(n int) ([]time.Duration, error) {
		var lat []time.Duration
		for i := range n {
			t0 := time.Now()
			if err := b.post(b.url, "/eval", fmt.Sprintf(`{"fen":%q,"depth":10}`, positions[i%len(positions)]), b.key, nil); err != nil {
				return nil, err
			}
			lat = append(lat, time.Since(t0))
		}
		return lat, nil
	}
	idle, err := evals(40)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- b.runJob(fens, 14) }()
	time.Sleep(300 * time.Millisecond)
	busy, err := evals(40)
	if err != nil {
		return err
	}
	if err := <-done; err != nil {
		return err
	}
	for _, row := range []struct {
		name string
		lat  []time.Duration
	}{{"idle", idle}, {"a batch runs", busy}} {
		sorted := append([]time.Duration(nil), row.lat...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
		fmt.Printf("| %s | %d | %.1f | %.1f | %.1f |\n", row.name, len(sorted), ms(sorted[len(sorted)/2]),
			ms(sorted[len(sorted)*99/100]), ms(sorted[len(sorted)-1]))
	}
	return nil
}

// runJob submits a batch and waits until it succeeded.
func (b *bench) runJob(fens []string, depth int) error {
	body, _ := json.Marshal(map[string]any{"fens": fens, "depth": depth})
	var job struct {
		ID    string `json:"job_id"`
		State string `json:"state"`
	}
	if err := b.post(b.url, "/batch", string(body), b.key, &job); err != nil {
		return err
	}
	for job.State != "succeeded" {
		if job.State == "failed" || job.State == "cancelled" {
			return fmt.Errorf("job %s %s", job.ID, job.State)
		}
		time.Sleep(20 * time.Millisecond)
		req, _ := http.NewRequest("GET", b.url+"/jobs/"+job.ID, nil)
		req.Header.Set("Authorization", "Bearer "+b.key)
		res, err := b.client.Do(req)
		if err != nil {
			return err
		}
		err = json.NewDecoder(res.Body).Decode(&job)
		res.Body.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// runRawAll runs fens on conc raw processes, splitting them, and returns the time
// they took. The processes are started and ready (network loaded) before the clock
// starts, as the service's pool is.
func runRawAll(binary string, depth, conc int, fens []string) (time.Duration, error) {
	var wg sync.WaitGroup
	var next atomic.Int64
	engines := make([]*rawEngine, conc)
	for i := range engines {
		eng, err := startRaw(binary)
		if err != nil {
			return 0, err
		}
		fmt.Fprintln(eng.in, "isready")
		eng.until("readyok")
		engines[i] = eng
	}
	start := time.Now()
	for _, eng := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(fens) {
					return
				}
				eng.search(fens[i], depth)
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	for _, eng := range engines {
		eng.close()
	}
	return took, nil
}
