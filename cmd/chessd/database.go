package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/eventstore"
	"chessd/postgres"
	"chessd/projections"
)

// database is an open, migrated database, and the embedded cluster when we use one.
type database struct {
	pool    *pgxpool.Pool
	cluster *postgres.Cluster // nil with DATABASE_URL
}

// openDatabase connects to DATABASE_URL, or starts the embedded cluster in the data
// directory and uses its "chessd" database. Migrations are applied either way.
func openDatabase(ctx context.Context, cfg config, logger *slog.Logger) (*database, error) {
	db := &database{}
	url := cfg.DatabaseURL
	if url == "" {
		c, err := postgres.NewCluster(filepath.Join(cfg.DataDir, "pg"), cfg.PGPort, logger)
		if err != nil {
			return nil, err
		}
		// Every process using the embedded cluster shares it; the last one out stops it,
		// and a cluster left running by a server that died is adopted.
		if err := c.Share(); err != nil {
			return nil, err
		}
		db.cluster = c
		started, err := c.Start(ctx)
		if err != nil {
			db.close(logger)
			return nil, err
		}
		if !started {
			logger.Info("using the embedded PostgreSQL already running in the data directory", "dir", c.Dir)
		}
		if err := postgres.CreateDatabase(ctx, c.URL("postgres"), "chessd"); err != nil {
			db.close(logger)
			return nil, err
		}
		url = c.URL("chessd")
	}
	pool, err := postgres.Open(ctx, url, 40)
	if err != nil {
		db.close(logger)
		return nil, err
	}
	db.pool = pool
	if err := postgres.Migrate(ctx, pool, logger); err != nil {
		db.close(logger)
		return nil, err
	}
	return db, nil
}

// close releases the pool and stops a cluster this process started.
func (db *database) close(logger *slog.Logger) {
	if db.pool != nil {
		db.pool.Close()
	}
	if db.cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		stopped, err := db.cluster.StopIfLast(ctx)
		switch {
		case err != nil:
			logger.Error("stop PostgreSQL", "err", err)
		case !stopped:
			logger.Info("embedded PostgreSQL left running: another chessd process uses it")
		}
	}
}

func withDatabase(ctx context.Context, cfg config, logger *slog.Logger, fn func(*database) error) error {
	db, err := openDatabase(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer db.close(logger)
	return fn(db)
}

func verify(ctx context.Context, db *database, out io.Writer) error {
	rep, err := eventstore.Verify(ctx, db.pool)
	if err != nil {
		return err
	}
	if rep.Tamper != nil {
		fmt.Fprintf(out, "TAMPERED after %d intact events: %v\n", rep.Events, rep.Tamper)
		return exitCode(1)
	}
	fmt.Fprintf(out, "ok: %d events, chain intact up to position %d\n", rep.Events, rep.Head)
	return nil
}

func rebuild(ctx context.Context, db *database, out io.Writer) error {
	ps := allProjections()
	reps, errs := projections.RebuildAll(ctx, db.pool, ps...)
	var failed []error
	for i, p := range ps {
		if errs[i] != nil {
			failed = append(failed, fmt.Errorf("rebuild %s: %w", p.Name(), errs[i]))
			continue
		}
		fmt.Fprintf(out, "rebuilt %s from %d events%s\n", p.Name(), reps[i].Applied, setAsideNote(reps[i]))
	}
	return errors.Join(failed...)
}

func allProjections() []projections.Projection {
	return []projections.Projection{projections.Accounts{}, projections.Ledger{}, projections.Jobs{}, projections.Disputes{}}
}
