package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// wrkThreads is wrk's threads in every run, split between its processes.
const wrkThreads = 2

// load is what wrk reports (summed over the processes of one run).
type load struct {
	rate           float64
	p50, p99       string // per process, "/"-separated
	requests, non2 int64
	cpu            time.Duration // wrk's own
	cpuPer         string        // CPU µs per request: this process / PostgreSQL / wrk
}

// script writes a wrk Lua script posting the cached positions (depth 10, which keyless
// calls may ask for) and returns its path. Each request takes the next position and the
// next of keys; with no keys it sends no Authorization header (keyless). The trivial
// handler is driven by the same scripts.
func (b *bench) script(name string, keys []string) (string, error) {
	var bodies, quoted []string
	for _, fen := range positions {
		bodies = append(bodies, fmt.Sprintf("'{\"fen\":\"%s\",\"depth\":10}'", fen))
	}
	for _, k := range keys {
		quoted = append(quoted, fmt.Sprintf("%q", "Bearer "+k))
	}
	lua := fmt.Sprintf(`local bodies = {%s}
local auths = {%s}
local i = 0
request = function()
  i = i + 1
  local h = {["Content-Type"] = "application/json"}
  if #auths > 0 then h["Authorization"] = auths[(i %% #auths) + 1] end
  return wrk.format("POST", nil, h, bodies[(i %% #bodies) + 1])
end
`, strings.Join(bodies, ", "), strings.Join(quoted, ", "))
	path := filepath.Join(b.dir, name+".lua")
	return path, os.WriteFile(path, []byte(lua), 0o644)
}

// runWrk runs one wrk process per url, all at once, splitting conns and wrkThreads
// evenly between them, for d, and sums what they report.
func (b *bench) runWrk(urls []string, conns int, d time.Duration, script string) (load, error) {
	cpu0 := b.cpuNow()
	n := len(urls)
	loads := make([]load, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, u := range urls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := conns / n
			cmd := exec.Command("wrk", "--latency", fmt.Sprintf("-t%d", max(1, min(wrkThreads/n, c))), fmt.Sprintf("-c%d", c),
				fmt.Sprintf("-d%ds", int(d.Seconds())), "-s", script, u+"/eval")
			out, err := cmd.CombinedOutput()
			if err != nil {
				errs[i] = fmt.Errorf("wrk: %v: %s", err, out)
				return
			}
			loads[i], errs[i] = parseWrk(string(out))
			loads[i].cpu = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		}()
	}
	wg.Wait()
	cpu1 := b.cpuNow()
	var total load
	var p50, p99 []string
	for i, l := range loads {
		if errs[i] != nil {
			return load{}, errs[i]
		}
		total.rate += l.rate
		total.requests += l.requests
		total.non2 += l.non2
		total.cpu += l.cpu
		p50, p99 = append(p50, l.p50), append(p99, l.p99)
	}
	total.p50, total.p99 = strings.Join(p50, "/"), strings.Join(p99, "/")
	total.cpuPer = perCall(cpu0, cpu1, total)
	return total, nil
}

func parseWrk(out string) (load, error) {
	var l load
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "Requests/sec:":
			fmt.Sscan(f[1], &l.rate)
		case len(f) == 2 && f[0] == "50%":
			l.p50 = f[1]
		case len(f) == 2 && f[0] == "99%":
			l.p99 = f[1]
		case len(f) > 2 && f[1] == "requests" && f[2] == "in":
			fmt.Sscan(f[0], &l.requests)
		case strings.HasPrefix(strings.TrimSpace(line), "Non-2xx or 3xx responses:"):
			fmt.Sscan(f[len(f)-1], &l.non2)
		}
	}
	if l.rate == 0 {
		return l, fmt.Errorf("could not read wrk's output: %s", out)
	}
	return l, nil
}

// trivialURLs starts (once) n trivial JSON handlers on loopback and returns their base
// URLs: the floor against which the service's throughput is compared.
func (b *bench) trivialURLs(n int) ([]string, error) {
	for len(b.trivial) < n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		srv := &http.Server{Handler: http.HandlerFunc(trivial)}
		go srv.Serve(ln) //nolint:errcheck // closed at the end
		b.closers = append(b.closers, func() { srv.Close() })
		b.trivial = append(b.trivial, "http://"+ln.Addr().String()+"/v1")
	}
	return b.trivial[:n], nil
}

// trivial is the least a Go JSON API does per call: decode a small body, encode a small
// answer. No authentication, no storage.
func trivial(w http.ResponseWriter, r *http.Request) {
	var in struct {
		FEN   string `json:"fen"`
		Depth int    `json:"depth"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"fen": in.FEN, "depth": in.Depth, "cached": true}) //nolint:errcheck // the client went away
}
