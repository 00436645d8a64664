package httpapi

import (
	"testing"
	"time"
)

func TestRetryAfterSecondsRoundUp(t *testing.T) {
	for _, tc := range []struct {
		wait time.Duration
		want int
	}{
		{0, 1}, {time.Millisecond, 1}, {time.Second, 1}, {1400 * time.Millisecond, 2},
		{2*time.Second + time.Nanosecond, 3}, {359 * time.Second, 359}, {359500 * time.Millisecond, 360},
	} {
		if got := retryAfterSeconds(tc.wait); got != tc.want {
			t.Errorf("retryAfterSeconds(%v) = %d, want %d", tc.wait, got, tc.want)
		}
	}
}
