package metrics

import (
	"context"
	"log/slog"
	"sync/atomic"
)

// logRecords counts the process's warnings and errors, whatever LOG_LEVEL prints: a
// background loop that fails at every pass (the budget alerts, the outboxes' senders,
// the sweep of old rows) only logs, and an operator's alert needs a number to watch.
var logRecords struct{ warn, error atomic.Int64 }

// CountLogs wraps h so that every record at warning level and above is counted for
// chessd_log_records_total, printed or not: it is passed on to h only when h prints
// its level.
func CountLogs(h slog.Handler) slog.Handler { return countingHandler{h} }

type countingHandler struct{ next slog.Handler }

func (c countingHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || c.next.Enabled(ctx, l)
}

func (c countingHandler) Handle(ctx context.Context, r slog.Record) error {
	switch {
	case r.Level >= slog.LevelError:
		logRecords.error.Add(1)
	case r.Level >= slog.LevelWarn:
		logRecords.warn.Add(1)
	}
	if !c.next.Enabled(ctx, r.Level) {
		return nil
	}
	return c.next.Handle(ctx, r)
}

func (c countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return countingHandler{c.next.WithAttrs(as)}
}

func (c countingHandler) WithGroup(name string) slog.Handler {
	return countingHandler{c.next.WithGroup(name)}
}
