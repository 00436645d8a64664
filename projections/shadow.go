package projections

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A shadow is where the rebuild of an inline projection writes: empty copies of the
// read model's tables in a schema of their own, which replace the tables when the
// rebuild is done. The appends meanwhile go on writing the old tables, and a rebuild
// pays neither for the rows it would have deleted nor for keeping every index up to date
// row by row: the copies carry only the constraints the writers' ON CONFLICT clauses
// need, the other indexes are built once, sorted, at the end. The rebuild's statements
// find the copies first on the search_path, so the projection's writers run unchanged.
//
// Only the swap stops the appends (see lock): from the moment it holds the chain's head
// and the tables, it applies what was appended since its last read and replaces the
// tables. What the old tables were granted is not carried over (the service's own role
// owns them); a table other tables' foreign keys point at is not shadowed (openShadow).
type shadow struct {
	name       string // the schema's
	schema     string // quoted
	searchPath string // the rebuild's search_path before the shadow was put first
	tables     []shadowTable
}

type shadowTable struct {
	schema         string   // the original's, quoted
	original, copy string   // schema-qualified and quoted
	after          []string // indexes and foreign keys the copy gets once it is loaded
}

// errNotShadowed says a table cannot be shadowed: the rebuild empties it in place.
var errNotShadowed = errors.New("not shadowed")

// openShadow makes the empty copies of tables, in a schema named after the projection,
// and puts it first on the transaction's search_path.
func openShadow(ctx context.Context, tx pgx.Tx, name string, tables []string, bare bool) (*shadow, error) {
	s := &shadow{name: "rebuild_" + name}
	s.schema = pgx.Identifier{s.name}.Sanitize()
	if err := tx.QueryRow(ctx, `SELECT current_setting('search_path')`).Scan(&s.searchPath); err != nil {
		return nil, err
	}
	var referenced []string
	if err := tx.QueryRow(ctx, `SELECT coalesce(array_agg(t), '{}') FROM unnest($1::text[]) t
		 WHERE EXISTS (SELECT 1 FROM pg_constraint f WHERE f.confrelid = to_regclass(t) AND f.contype = 'f')`, tables).Scan(&referenced); err != nil {
		return nil, err
	}
	if len(referenced) > 0 {
		return nil, fmt.Errorf("foreign keys point at %s: %w", strings.Join(referenced, ", "), errNotShadowed)
	}
	// two rebuilds of one projection: the second waits for the first's schema to go
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('chessd rebuild ' || $1))`, name); err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `CREATE SCHEMA `+s.schema); err != nil {
		return nil, fmt.Errorf("shadow schema: %w", err)
	}
	for _, t := range tables {
		st, err := s.copyTable(ctx, tx, t, bare)
		if err != nil {
			return nil, fmt.Errorf("shadow %s: %w", t, err)
		}
		s.tables = append(s.tables, st)
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, s.schema+", "+s.searchPath); err != nil {
		return nil, err
	}
	return s, nil
}

// copyTable makes the copy of table t with its columns, defaults and checks and, unless
// bare, what refuses rows (primary key, unique constraints and indexes, exclusions),
// which ON CONFLICT needs too. It keeps the statements of the rest (other indexes,
// foreign keys; with bare, all) for later.
func (s *shadow) copyTable(ctx context.Context, tx pgx.Tx, t string, bare bool) (shadowTable, error) {
	var st shadowTable
	var rel string
	err := tx.QueryRow(ctx, `SELECT format('%I', n.nspname), format('%I', c.relname)
		  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`, t).Scan(&st.schema, &rel)
	if err != nil {
		return st, err
	}
	st.original, st.copy = st.schema+"."+rel, s.schema+"."+rel
	if _, err := tx.Exec(ctx, `CREATE TABLE `+st.copy+` (LIKE `+st.original+` INCLUDING ALL EXCLUDING INDEXES)`); err != nil {
		return st, err
	}
	// constraints first: an index of the copy cannot take the name of a constraint's
	rows, err := tx.Query(ctx, `
		SELECT 'c', format('%I ', conname) || pg_get_constraintdef(oid), contype <> 'f'
		  FROM pg_constraint WHERE conrelid = $1::regclass AND contype IN ('p', 'u', 'x', 'f')
		UNION ALL
		SELECT 'i', pg_get_indexdef(i.indexrelid), i.indisunique
		  FROM pg_index i WHERE i.indrelid = $1::regclass AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
		ORDER BY 1`, st.original)
	if err != nil {
		return st, err
	}
	var kind, def string
	var refuses bool
	var now []string
	if _, err := pgx.ForEachRow(rows, []any{&kind, &def, &refuses}, func() error {
		stmt := `ALTER TABLE ` + st.copy + ` ADD CONSTRAINT ` + def
		if kind == "i" {
			// CREATE [UNIQUE] INDEX name ON [ONLY] schema.table USING ...: the same
			// index, under the same name, on the copy
			on := " ON " + st.original + " "
			if strings.Count(def, on) != 1 {
				return fmt.Errorf("cannot read index %q", def)
			}
			stmt = strings.Replace(def, on, " ON "+st.copy+" ", 1)
		}
		if refuses && !bare {
			now = append(now, stmt)
		} else {
			st.after = append(st.after, stmt)
		}
		return nil
	}); err != nil {
		return st, err
	}
	for _, stmt := range now {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return st, err
		}
	}
	return st, nil
}

// finishCopies builds the copies' other indexes and foreign keys and gathers their
// statistics, before the swap stops the appends.
func (s *shadow) finishCopies(ctx context.Context, tx pgx.Tx) error {
	// sorting a million rows for an index takes more than the default 64 MB
	if _, err := tx.Exec(ctx, `SET LOCAL maintenance_work_mem = '256MB'`); err != nil {
		return err
	}
	for _, st := range s.tables {
		for _, stmt := range st.after {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("shadow of %s: %w", st.original, err)
			}
		}
		if _, err := tx.Exec(ctx, `ANALYZE `+st.copy); err != nil {
			return err
		}
	}
	return nil
}

// lock holds the chain's head, so no append commits, and the old tables, so no one
// reads or writes them. An append that read one of them before it waits for the head
// (a credit reads its charge) would wait on the rebuild while it waits on the append:
// the tables are asked for with a short lock timeout, and on a timeout the head is let
// go and both are asked for again.
func (s *shadow) lock(ctx context.Context, tx pgx.Tx) error {
	names := make([]string, len(s.tables))
	for i, st := range s.tables {
		names[i] = st.original
	}
	wait := 50 * time.Millisecond
	for try := 1; ; try++ {
		b := &pgx.Batch{}
		b.Queue(`SAVEPOINT swap`)
		b.Queue(`SELECT 1 FROM event_chain FOR UPDATE`)
		b.Queue(fmt.Sprintf(`SET LOCAL lock_timeout = %d`, wait.Milliseconds()))
		b.Queue(`LOCK TABLE ` + strings.Join(names, ", ") + ` IN ACCESS EXCLUSIVE MODE`)
		b.Queue(`SET LOCAL lock_timeout = 0`)
		b.Queue(`RELEASE SAVEPOINT swap`)
		err := tx.SendBatch(ctx, b).Close()
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55P03" || try == 60 { // lock_not_available: about a minute
			return err
		}
		if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT swap`); err != nil {
			return err
		}
		wait = min(2*wait, time.Second)
	}
}

// swap replaces the old tables with the copies and takes the shadow off the search_path.
// It runs under lock.
func (s *shadow) swap(ctx context.Context, tx pgx.Tx) error {
	b := &pgx.Batch{}
	for _, st := range s.tables {
		b.Queue(`DROP TABLE ` + st.original)
		b.Queue(`ALTER TABLE ` + st.copy + ` SET SCHEMA ` + st.schema)
	}
	b.Queue(`DROP SCHEMA ` + s.schema)
	b.Queue(`SELECT set_config('search_path', $1, true)`, s.searchPath)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("swap in the rebuilt tables: %w", err)
	}
	return nil
}
