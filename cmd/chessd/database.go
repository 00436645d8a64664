package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
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

// parseVerify reads verify's anchors (--anchor, --anchors), files included, before the
// database is opened.
func parseVerify(fs *flag.FlagSet, args []string) (action, error) {
	var anchors []eventstore.Anchor
	fs.Func("anchor", "position:hash printed by an earlier verify (or logged by serve); repeatable", func(s string) error {
		a, err := eventstore.ParseAnchor(s)
		if err != nil {
			return err
		}
		anchors = append(anchors, a)
		return nil
	})
	fs.Func("anchors", "a file of such anchors, one a line (# comments)", func(path string) error {
		read, err := readAnchors(path)
		anchors = append(anchors, read...)
		return err
	})
	if _, err := parseArgs(fs, args, 0); err != nil {
		return nil, err
	}
	walk := onDatabase(func(ctx context.Context, db *database, out io.Writer) error { return verify(ctx, db, anchors, out) })
	return func(ctx context.Context, cfg config, logger *slog.Logger, out io.Writer) error {
		// exit 1 says tampered: a walk that could not be made (the database out of
		// reach) must not say so, nor pass for intact
		err := walk(ctx, cfg, logger, out)
		if err != nil && !errors.As(err, new(exitCode)) {
			return exitError{code: 2, err: err}
		}
		return err
	}, nil
}

// verify walks the chain, checking it against the anchors given, and prints the anchor
// of what it walked, to be kept outside the database. Tampering found is exit status 1.
func verify(ctx context.Context, db *database, anchors []eventstore.Anchor, out io.Writer) error {
	rep, err := eventstore.Verify(ctx, db.pool, anchors...)
	if err != nil {
		return err
	}
	if rep.Tamper != nil {
		fmt.Fprintf(out, "TAMPERED after %d intact events: %v\n", rep.Events, rep.Tamper)
		return exitCode(1)
	}
	fmt.Fprintf(out, "ok: %d events, chain intact up to position %d", rep.Events, rep.Head)
	if len(anchors) > 0 {
		fmt.Fprintf(out, ", and at the %d anchors given", len(anchors))
	}
	fmt.Fprintln(out)
	if rep.Events > 0 {
		fmt.Fprintf(out, "anchor: %s (keep it outside the database; a later verify --anchor proves nothing up to it was rewritten)\n", rep.Anchor)
	}
	return nil
}

// readAnchors reads a file of anchors, one a line; blank lines and # comments are skipped.
func readAnchors(path string) ([]eventstore.Anchor, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []eventstore.Anchor
	for i, line := range strings.Split(string(b), "\n") {
		line, _, _ = strings.Cut(line, "#")
		if strings.TrimSpace(line) == "" {
			continue
		}
		a, err := eventstore.ParseAnchor(line)
		if err != nil {
			return nil, fmt.Errorf("%s line %d: %w", path, i+1, err)
		}
		out = append(out, a)
	}
	return out, nil
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
	return projections.All() // one list: /health reports what runs
}
