package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestErrorClasses(t *testing.T) {
	pg := func(code string) error { return fmt.Errorf("query: %w", &pgconn.PgError{Code: code}) }
	for _, tc := range []struct {
		name                   string
		err                    error
		unavailable, transient bool
	}{
		{"nil", nil, false, false},
		{"connection failure (08006)", pg("08006"), true, true},
		{"cannot connect now (57P03)", pg("57P03"), true, true},
		{"admin shutdown (57P01)", pg("57P01"), true, true},
		{"too many connections (53300)", pg("53300"), true, true},
		{"serialization failure (40001)", pg("40001"), false, true},
		{"deadlock (40P01)", pg("40P01"), false, true},
		{"unique violation (23505)", pg("23505"), false, false},
		{"query canceled (57014)", pg("57014"), false, false},
		{"connection dropped", fmt.Errorf("write events: %w", io.ErrUnexpectedEOF), true, true},
		{"connection closed", fmt.Errorf("begin: %w", pgconn.ErrConnClosed), true, true},
		{"connection refused", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, true, true},
		{"connection reset", fmt.Errorf("read: %w", syscall.ECONNRESET), true, true},
		{"client gone", context.Canceled, false, false},
		{"deadline", fmt.Errorf("acquire: %w", context.DeadlineExceeded), false, false},
		{"anything else", errors.New("boom"), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsUnavailable(tc.err); got != tc.unavailable {
				t.Errorf("IsUnavailable = %v, want %v", got, tc.unavailable)
			}
			if got := IsTransient(tc.err); got != tc.transient {
				t.Errorf("IsTransient = %v, want %v", got, tc.transient)
			}
		})
	}
}
