package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkCachedEval is a cached POST /eval through the handler alone (no network, no
// OpenAPI check): the service's own CPU and allocations per call, which bound the
// cached throughput of `chessbench -parts cached` (#12). Keyless and charged, on real
// PostgreSQL and engines; the charges settle beside, as in a server.
func BenchmarkCachedEval(b *testing.B) {
	e := newEnv(b, withoutProjections(), withWorkers(0), withKeylessPerDay(1<<30))
	key := e.signupPro("bench-cached@example.com")
	body := `{"fen":"rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1","depth":8}`
	if r := e.do("POST", "/v1/eval", key, body); r.Status != 200 {
		b.Fatalf("warm the cache: %d %s", r.Status, r.Raw)
	}
	for _, tc := range []struct{ name, key string }{{"keyless", ""}, {"charged", key}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				req := httptest.NewRequest("POST", "/v1/eval", strings.NewReader(body))
				if tc.key != "" {
					req.Header.Set("Authorization", "Bearer "+tc.key)
				}
				w := httptest.NewRecorder()
				e.api.ServeHTTP(w, req)
				if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"cached":true`) {
					b.Fatalf("%d %s", w.Code, w.Body)
				}
			}
			b.StopTimer()
			if err := e.meter.Flush(b.Context()); err != nil {
				b.Fatal(err)
			}
		})
	}
}
