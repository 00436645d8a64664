package projections_test

import (
	"runtime/debug"
	"testing"

	"chessd/projections"
)

// A rebuild runs at RebuildGCPercent unless the operator set GOGC, and puts the
// former target back when it ends.
func TestRebuildGC(t *testing.T) {
	for _, tc := range []struct {
		gogc   string
		during int
	}{{"", projections.RebuildGCPercent}, {"150", 150}} {
		t.Run("GOGC="+tc.gogc, func(t *testing.T) {
			t.Setenv("GOGC", tc.gogc)
			before := debug.SetGCPercent(150)
			defer debug.SetGCPercent(before)
			restore := projections.RebuildGC()
			if got := debug.SetGCPercent(-1); got != tc.during {
				t.Errorf("during the rebuild: %d, want %d", got, tc.during)
			}
			debug.SetGCPercent(tc.during) // as it was, for restore to find
			restore()
			if got := debug.SetGCPercent(before); got != 150 {
				t.Errorf("after the rebuild: %d, want 150", got)
			}
		})
	}
}
