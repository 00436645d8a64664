package httpapi

import (
	"testing"
	"time"
)

func TestAppendMillis(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0.000"},
		{999 * time.Nanosecond, "0.000"},
		{time.Microsecond, "0.001"},
		{999 * time.Microsecond, "0.999"},
		{1234 * time.Microsecond, "1.234"},
		{5 * time.Millisecond, "5.000"},
		{12345600 * time.Microsecond, "12345.600"},
		{-time.Millisecond, "0.000"},
	} {
		if got := string(appendMillis(nil, tc.d)); got != tc.want {
			t.Errorf("appendMillis(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}
