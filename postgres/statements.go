package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// StatementsSetting is the server setting that StartStatements needs (Cluster.Settings).
const StatementsSetting = "shared_preload_libraries=pg_stat_statements"

// Statement is what PostgreSQL spent on one statement (pg_stat_statements): nested
// statements of functions are counted on their own and inside their caller.
type Statement struct {
	Query   string // normalised, whitespace folded, cut to 120 characters
	Calls   int64
	Rows    int64
	TotalMS float64
}

// StartStatements turns the counting on in pool's database and starts it from zero.
func StartStatements(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return fmt.Errorf("pg_stat_statements: %w", err)
	}
	if _, err := pool.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
		return fmt.Errorf("pg_stat_statements: %w", err)
	}
	return nil
}

// TopStatements returns the n statements that took most time since StartStatements,
// and starts the count again.
func TopStatements(ctx context.Context, pool *pgxpool.Pool, n int) ([]Statement, error) {
	rows, err := pool.Query(ctx, `SELECT left(regexp_replace(query, '\s+', ' ', 'g'), 120), calls, rows, total_exec_time
		FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		ORDER BY total_exec_time DESC LIMIT $1`, n)
	if err != nil {
		return nil, fmt.Errorf("pg_stat_statements: %w", err)
	}
	defer rows.Close()
	var out []Statement
	for rows.Next() {
		var s Statement
		if err := rows.Scan(&s.Query, &s.Calls, &s.Rows, &s.TotalMS); err != nil {
			return nil, fmt.Errorf("pg_stat_statements: %w", err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pg_stat_statements: %w", err)
	}
	if _, err := pool.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
		return nil, fmt.Errorf("pg_stat_statements: %w", err)
	}
	return out, nil
}

// Settle leaves pool's database as a long-running one would be before a measurement:
// table vacuumed and analysed (autovacuum would otherwise work on freshly written rows
// during it) and no dirty buffers left (a checkpoint).
func Settle(ctx context.Context, pool *pgxpool.Pool, table string) error {
	// VACUUM runs alone, outside a transaction: two statements, not one string
	for _, sql := range []string{`VACUUM (ANALYZE) ` + pgx.Identifier{table}.Sanitize(), `CHECKPOINT`} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			return fmt.Errorf("settle: %w", err)
		}
	}
	return nil
}
