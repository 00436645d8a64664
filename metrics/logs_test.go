package metrics

import (
	"bytes"
	"log/slog"
	"net/http/httptest"
	"regexp"
	"strconv"
	"testing"
)

// Warnings and errors are counted whether or not LOG_LEVEL prints them, and only
// printed when it does.
func TestLogRecordsCounted(t *testing.T) {
	count := func(level string) int {
		t.Helper()
		rec := httptest.NewRecorder()
		New(Sources{}).Handler("").ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		m := regexp.MustCompile(`(?m)^chessd_log_records_total\{level="` + level + `"\} (\d+)$`).FindStringSubmatch(rec.Body.String())
		if m == nil {
			t.Fatalf("no chessd_log_records_total{level=%q} in\n%s", level, rec.Body.String())
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	for _, tc := range []struct {
		printed             slog.Level
		log                 func(*slog.Logger)
		warn, error, prints int
	}{
		{slog.LevelInfo, func(l *slog.Logger) { l.Info("fine") }, 0, 0, 1},
		{slog.LevelInfo, func(l *slog.Logger) { l.Warn("budget alerts", "err", "boom") }, 1, 0, 1},
		{slog.LevelError, func(l *slog.Logger) { l.With("loop", "alerts").Warn("budget alerts") }, 1, 0, 0},
		{slog.LevelError, func(l *slog.Logger) { l.WithGroup("g").Error("newer schema") }, 0, 1, 1},
		{slog.LevelInfo, func(l *slog.Logger) { l.Debug("quiet") }, 0, 0, 0},
	} {
		var out bytes.Buffer
		logger := slog.New(CountLogs(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: tc.printed})))
		warn, errs := count("warn"), count("error")
		tc.log(logger)
		if dw, de := count("warn")-warn, count("error")-errs; dw != tc.warn || de != tc.error {
			t.Errorf("printing from %v: counted %d warnings and %d errors, want %d and %d", tc.printed, dw, de, tc.warn, tc.error)
		}
		if n := bytes.Count(out.Bytes(), []byte("\n")); n != tc.prints {
			t.Errorf("printing from %v: %d lines printed, want %d: %s", tc.printed, n, tc.prints, out.String())
		}
	}
}
