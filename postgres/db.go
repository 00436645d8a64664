package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/migrations"
)

// Open connects a pool to url and waits (up to a minute) until the server answers.
func Open(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := WaitReady(waitCtx, pool.Ping); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// CreateDatabase creates database name on the server behind adminURL if it is missing.
func CreateDatabase(ctx context.Context, adminURL, name string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // created meanwhile by another process
		return nil
	}
	return err
}

// Migrate applies every embedded migration not yet recorded, each in its own
// transaction, in file-name order. An advisory lock keeps two starting servers from
// applying the same step twice.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	names, err := migrationNames()
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	const lockID = 7_254_001
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, lockID); err != nil {
		return err
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, lockID) //nolint:errcheck // released with the session anyway
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	for _, name := range names {
		var done bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE name = $1)`, name).Scan(&done); err != nil {
			return err
		}
		if done {
			continue
		}
		sql, err := fs.ReadFile(migrations.FS, name)
		if err != nil {
			return err
		}
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, string(sql)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (name) VALUES ($1)`, name)
			return err
		})
		if err != nil {
			return fmt.Errorf("migration %s: %w", name, err)
		}
		logger.Info("migration applied", "name", name)
	}
	if _, newer, err := Compare(ctx, conn); err != nil {
		return err
	} else if len(newer) > 0 {
		return fmt.Errorf("%w (it has %s)", ErrSchemaNewer, strings.Join(newer, ", "))
	}
	return nil
}

// Pending lists migrations the database has not applied.
func Pending(ctx context.Context, q Querier) ([]string, error) {
	pending, _, err := Compare(ctx, q)
	return pending, err
}

// ErrSchemaNewer says the database has migrations this binary does not know: a newer
// chessd migrated it. This one would write what the newer schema expects differently
// (a rollup it does not know of), so it does not run on it.
var ErrSchemaNewer = errors.New("the database's schema is newer than this chessd: run the newer version")

// WatchNewer checks every interval whether a newer chessd has migrated the database
// since this one started, and returns an error wrapping ErrSchemaNewer (naming the
// migrations) when it has; otherwise it returns ctx's error when ctx ends. A check that
// fails (the database away) is tried again at the next interval. Servers step aside
// through /readyz; a job executor has no readiness gate, so it watches with this and
// stops rather than write what the newer schema expects differently.
func WatchNewer(ctx context.Context, q Querier, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		if _, newer, err := Compare(ctx, q); err == nil && len(newer) > 0 {
			return fmt.Errorf("%w (it has %s)", ErrSchemaNewer, strings.Join(newer, ", "))
		}
	}
}

// Compare tells which embedded migrations the database has not applied (pending) and
// which applied ones this binary does not know (newer). /readyz is ready only when
// both are empty.
func Compare(ctx context.Context, q Querier) (pending, newer []string, err error) {
	names, err := migrationNames()
	if err != nil {
		return nil, nil, err
	}
	rows, err := q.Query(ctx, `SELECT name FROM schema_migrations ORDER BY name`)
	if err != nil {
		return nil, nil, err
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, nil, err
	}
	for _, n := range names {
		if !slices.Contains(applied, n) {
			pending = append(pending, n)
		}
	}
	for _, n := range applied {
		if !slices.Contains(names, n) {
			newer = append(newer, n)
		}
	}
	return pending, newer, nil
}

func migrationNames() ([]string, error) {
	entries, err := fs.ReadDir(migrations.FS, ".")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".sql") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names, nil
}

// Querier is what both a pool and a transaction offer.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// IsRetryable reports errors after which the whole transaction may simply run again:
// serialization failures and deadlocks.
func IsRetryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// IsUnavailable reports errors that say the database could not be reached or went away
// (rather than that a statement failed): a refused or failed connection, one that
// dropped mid-statement, the server shutting down, starting up or out of connection
// slots. They pass once the database is back: the client is told to retry (503), and
// long-lived loops try again.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"): // connection exception
			return true
		case pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03": // admin or crash shutdown, cannot connect now
			return true
		case pgErr.Code == "53300": // too many connections
			return true
		}
		return false
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		(errors.As(err, &netErr) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded))
}

// IsTransient reports errors after which the same work may succeed if simply tried
// again later: IsRetryable's conflicts and IsUnavailable's outages.
func IsTransient(err error) bool { return IsRetryable(err) || IsUnavailable(err) }
