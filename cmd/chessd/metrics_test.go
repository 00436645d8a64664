package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"chessd/metrics"
	"chessd/postgres/pgtest"
)

// scrape reads url's metrics and parses them with Prometheus' own text parser.
func scrape(t *testing.T, url, token string) map[string]*dto.MetricFamily {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("GET %s: %d %s", url, res.StatusCode, b)
	}
	if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("metrics served as %q", ct)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		t.Fatalf("the metrics do not parse: %v", err)
	}
	return fams
}

// sample is the value of name's series whose labels include want: a counter's or
// gauge's value, a histogram's count; 0 when there is no such series. Several matching
// series are summed.
func sample(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return 0
	}
	var sum float64
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// labelValues is every value label takes in name's series.
func labelValues(fams map[string]*dto.MetricFamily, name, label string) []string {
	seen := map[string]bool{}
	for _, m := range fams[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				seen[l.GetValue()] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

type labels = map[string]string

// /metrics of a real `chessd serve` parses with the Prometheus text parser, and its
// counters move by what the calls made between two scrapes did: requests by route
// template and status, engine searches and queue waits, charges and their units (equal
// to the ledger's), a refusal over budget, a job's positions; the gauges of the engine
// pool, the projections, the job queue, the database pool and the Go runtime are there.
// A worker serves its own on CHESSD_METRICS_ADDR.
func TestMetrics(t *testing.T) {
	bin := buildBinary(t)
	dbURL := pgtest.URL(t)
	const token = "scrape-token-for-the-test"
	port := freePort(t)
	srv := startServer(t, bin, dbURL, port, "CHESSD_METRICS_TOKEN="+token)
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	ctx := context.Background()
	pool := pgtest.NewDBAt(t, dbURL)

	for _, auth := range []string{"", "Bearer wrong", "Basic " + token} {
		req, _ := http.NewRequest("GET", metricsURL, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 401 {
			t.Fatalf("metrics with Authorization %q: %d, want 401", auth, res.StatusCode)
		}
	}

	call := func(method, path, key, body string, wantStatus int, out any) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.base+path, strings.NewReader(body))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != wantStatus {
			t.Fatalf("%s %s: %d %s, want %d", method, path, res.StatusCode, b, wantStatus)
		}
		if out != nil {
			if err := json.Unmarshal(b, out); err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
		}
	}
	var su struct {
		Secret    string `json:"api_key"`
		AccountID string `json:"account_id"`
	}
	call("POST", "/signup", "", `{"email":"metrics@example.com"}`, 201, &su)
	var tight struct {
		Secret string `json:"api_key"`
	}
	call("POST", "/keys", su.Secret, `{"label":"tight","scopes":["eval"],"budget_units":1}`, 201, &tight)

	before := scrape(t, metricsURL, token)

	const mate = `{"fen":"6k1/5ppp/8/8/8/8/5PPP/3R2K1 w - - 0 1","depth":8}`
	call("POST", "/eval", "", `{"fen":"r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3","depth":6}`, 200, nil) // keyless
	call("POST", "/eval", su.Secret, mate, 200, nil)                                                                            // charged, fresh
	call("POST", "/eval", su.Secret, mate, 200, nil)                                                                            // charged, cached
	call("POST", "/eval", tight.Secret, `{"fen":"4k3/8/8/8/8/8/8/4K2R w K - 0 1","depth":8}`, 402, nil)                         // over budget
	call("GET", "/nowhere", "", "", 404, nil)
	var job struct {
		ID    string `json:"job_id"`
		State string `json:"state"`
	}
	call("POST", "/analyze", su.Secret, `{"pgn":"1. e4 e5 2. Nf3 *","depth":6}`, 202, &job)
	polls := 0
	for deadline := time.Now().Add(90 * time.Second); job.State != "succeeded"; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the job did not succeed: %+v", job)
		}
		call("GET", "/jobs/"+job.ID, su.Secret, "", 200, &job)
		polls++
	}
	const positions = 3

	// The charges are settled off the response path: wait for the ledger to hold them
	// all, then for the counters that follow each commit.
	var charged, units int64
	for deadline := time.Now().Add(30 * time.Second); charged != 2+positions; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the ledger holds %d charges, want %d", charged, 2+positions)
		}
		if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(units), 0) FROM charge_lines() WHERE account_id = $1`, su.AccountID).
			Scan(&charged, &units); err != nil {
			t.Fatal(err)
		}
	}
	delta := func(after map[string]*dto.MetricFamily, name string, l labels) float64 {
		return sample(after, name, l) - sample(before, name, l)
	}
	var after map[string]*dto.MetricFamily
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		after = scrape(t, metricsURL, token)
		if delta(after, "chessd_charges_total", nil) >= 2+positions || time.Now().After(deadline) {
			break
		}
	}

	sf := labels{"engine": "sf-17.1", "path": "native"}
	with := func(l labels, kv ...string) labels {
		out := maps.Clone(l)
		for i := 0; i+1 < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	for _, c := range []struct {
		name   string
		labels labels
		want   float64
	}{
		{"chessd_http_request_duration_seconds", labels{"route": "/v1/eval", "method": "POST", "code": "200"}, 3},
		{"chessd_http_request_duration_seconds", labels{"route": "/v1/eval", "method": "POST", "code": "402"}, 1},
		{"chessd_http_request_duration_seconds", labels{"route": "/v1/analyze", "method": "POST", "code": "202"}, 1},
		{"chessd_http_request_duration_seconds", labels{"route": "/v1/jobs/{id}", "method": "GET", "code": "200"}, float64(polls)},
		{"chessd_http_request_duration_seconds", labels{"route": "unmatched", "method": "GET", "code": "404"}, 1},
		{"chessd_charges_total", labels{"endpoint": "eval", "cached": "false"}, 1},
		{"chessd_charges_total", labels{"endpoint": "eval", "cached": "true"}, 1},
		{"chessd_charges_total", labels{"endpoint": "analyze", "cached": "false"}, positions},
		{"chessd_charged_units_total", nil, float64(units)},
		{"chessd_reservations_refused_total", labels{"reason": "budget_units"}, 1},
		{"chessd_engine_searches_total", sf, 2 + positions}, // keyless, fresh eval, the job
		{"chessd_engine_queue_wait_seconds", with(sf, "priority", "interactive"), 2},
		{"chessd_engine_queue_wait_seconds", with(sf, "priority", "batch"), positions},
		{"chessd_job_positions_done_total", nil, positions},
	} {
		if got := delta(after, c.name, c.labels); got != c.want {
			t.Errorf("%s%v moved by %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if d := delta(after, "chessd_engine_nodes_total", sf); d <= 0 {
		t.Errorf("chessd_engine_nodes_total moved by %v", d)
	}
	if d := delta(after, "chessd_db_acquires_total", nil); d <= 0 {
		t.Errorf("chessd_db_acquires_total moved by %v", d)
	}
	// the job's positions came from at least one take, and at most one take per
	// position found them
	if d := delta(after, "chessd_job_queue_takes_total", labels{"result": "found"}); d < 1 || d > positions {
		t.Errorf("chessd_job_queue_takes_total{result=found} moved by %v, want 1 to %v", d, positions)
	}

	// named by Prometheus' conventions, as its own linter checks them (the Go runtime's
	// and the process's are the client library's)
	var ours []*dto.MetricFamily
	for name, f := range after {
		if strings.HasPrefix(name, "chessd_") {
			ours = append(ours, f)
		}
	}
	problems, err := promlint.NewWithMetricFamilies(ours).Lint()
	if err != nil || len(problems) > 0 {
		t.Errorf("promlint: %v %+v", err, problems)
	}

	// route labels are templates, never raw paths
	routes := labelValues(after, "chessd_http_request_duration_seconds", "route")
	if want := []string{"/v1/analyze", "/v1/eval", "/v1/jobs/{id}", "/v1/keys", "/v1/readyz", "/v1/signup", "unmatched"}; !slices.Equal(routes, want) {
		t.Errorf("route labels %q, want %q", routes, want)
	}
	var bounds []float64
	for _, b := range after["chessd_http_request_duration_seconds"].GetMetric()[0].GetHistogram().GetBucket() {
		bounds = append(bounds, b.GetUpperBound())
	}
	if want := append(slices.Clone(metrics.RequestBuckets), math.Inf(1)); !slices.Equal(bounds, want) {
		t.Errorf("latency buckets %v, want %v", bounds, want)
	}

	// gauges: present and sensible
	if busy, idle := sample(after, "chessd_engine_processes", with(sf, "state", "busy")), sample(after, "chessd_engine_processes", with(sf, "state", "idle")); busy+idle != 1 ||
		sample(after, "chessd_engine_pool_size", sf) != 1 {
		t.Errorf("engine processes busy %v idle %v of pool size %v", busy, idle, sample(after, "chessd_engine_pool_size", sf))
	}
	if q := sample(after, "chessd_job_positions_queued", nil); q != 0 || len(labelValues(after, "chessd_job_positions_queued", "state")) != 2 {
		t.Errorf("job positions queued after the job: %v (%v)", q, labelValues(after, "chessd_job_positions_queued", "state"))
	}
	if got := labelValues(after, "chessd_projection_lag_events", "projection"); !slices.Equal(got, []string{"accounts_v1", "disputes_v1", "jobs_v1", "ledger_v1"}) {
		t.Errorf("projection lag for %q", got)
	}
	if sample(after, "chessd_events_head_position", nil) <= 0 || sample(after, "chessd_db_connections_max", nil) <= 0 {
		t.Error("the log's head or the database pool's size is missing")
	}
	for _, name := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "process_cpu_seconds_total", "chessd_metrics_read_errors"} {
		if after[name] == nil {
			t.Errorf("%s missing", name)
		}
	}
	if n := sample(after, "chessd_metrics_read_errors", nil); n != 0 {
		t.Errorf("%v sources failed to be read", n)
	}
	// the server and its database share this machine's clock
	if after["chessd_db_clock_offset_seconds"] == nil || math.Abs(sample(after, "chessd_db_clock_offset_seconds", nil)) > 0.1 {
		t.Errorf("the database's clock offset: %v (present: %t); want it near 0 on one machine",
			sample(after, "chessd_db_clock_offset_seconds", nil), after["chessd_db_clock_offset_seconds"] != nil)
	}

	// a worker has no API listener: its metrics are on CHESSD_METRICS_ADDR
	workerURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", freePort(t))
	startWorker(t, bin, dbURL, "metrics-worker", "CHESSD_METRICS_ADDR="+strings.TrimSuffix(strings.TrimPrefix(workerURL, "http://"), "/metrics"))
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		res, err := http.Get(workerURL)
		if err == nil {
			res.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker's metrics never answered: %v", err)
		}
	}
	w := scrape(t, workerURL, "")
	for _, name := range []string{"go_goroutines", "chessd_job_positions_done_total", "chessd_db_connections_max", "chessd_db_clock_offset_seconds"} {
		if w[name] == nil {
			t.Errorf("worker: %s missing", name)
		}
	}
	for _, name := range []string{"chessd_http_request_duration_seconds", "chessd_projection_lag_events"} {
		if w[name] != nil {
			t.Errorf("worker: %s reported (the API server reports it)", name)
		}
	}
}

func TestMetricsConfig(t *testing.T) {
	for _, c := range []struct {
		addr    string
		wantErr bool
	}{{"", false}, {"off", false}, {":9090", false}, {"127.0.0.1:9090", false}, {"9090", true}, {"localhost", true}} {
		env := map[string]string{"CHESSD_METRICS_ADDR": c.addr}
		cfg, err := loadConfig(func(k string) string { return env[k] })
		if (err != nil) != c.wantErr || (err == nil && cfg.MetricsAddr != c.addr) {
			t.Errorf("CHESSD_METRICS_ADDR=%q: %+v %v", c.addr, cfg.MetricsAddr, err)
		}
	}
}
