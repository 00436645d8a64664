package gctune_test

import (
	"runtime/debug"
	"testing"

	"chessd/gctune"
)

// A process runs at Percent unless the operator set GOGC, and restore puts the former
// target back.
func TestApply(t *testing.T) {
	for _, tc := range []struct {
		gogc   string
		during int
	}{{"", gctune.Percent}, {"150", 150}} {
		t.Run("GOGC="+tc.gogc, func(t *testing.T) {
			t.Setenv("GOGC", tc.gogc)
			before := debug.SetGCPercent(150)
			defer debug.SetGCPercent(before)
			restore := gctune.Apply()
			if got := debug.SetGCPercent(-1); got != tc.during {
				t.Errorf("after Apply: %d, want %d", got, tc.during)
			}
			debug.SetGCPercent(tc.during) // as it was, for restore to find
			restore()
			if got := debug.SetGCPercent(before); got != 150 {
				t.Errorf("after restore: %d, want 150", got)
			}
		})
	}
}
