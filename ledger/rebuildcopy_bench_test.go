package ledger

import (
	"fmt"
	"testing"
	"time"

	gojson "github.com/goccy/go-json"
	"github.com/shopspring/decimal"

	"chessd/eventstore"
)

// BenchmarkRebuildCopy is a rebuild's work in this process for a chunk of the bench's
// log: one-line ChargesSettled events read back from the log, decoded, checked and
// written as COPY rows.
func BenchmarkRebuildCopy(b *testing.B) {
	at := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	evs := make([]eventstore.Event, 2000)
	for i := range evs {
		line := SettledCharge{RequestID: fmt.Sprintf("req-rebuild-%d", i), Day: "2026-11-27", ChargedAt: at.Add(time.Duration(i) * time.Millisecond),
			Endpoint: "eval", Params: Params{Depth: 10, MultiPV: 1, Positions: 1, FEN: "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1"},
			Engine: "sf-17.1", Path: "native", Cached: true, Units: 1, USD: decimal.RequireFromString("0.0004")}
		enc, err := gojson.Marshal(&line)
		if err != nil {
			b.Fatal(err)
		}
		_, payload, err := settledEvent(fmt.Sprintf("acc_%d", i%1000), fmt.Sprintf("key_%d", i), "live", []SettledCharge{line}, [][]byte{enc})
		if err != nil {
			b.Fatal(err)
		}
		evs[i] = eventstore.Event{Position: int64(i + 1), Type: "ChargesSettled", SchemaVersion: 1, Payload: payload}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := RebuildCopy(evs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(evs)), "ns/event")
}
