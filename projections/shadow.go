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

// A shadow is where a rebuild writes: empty copies of the read model's tables in a
// schema of their own, which replace the tables when the rebuild is done. Meanwhile
// the old tables stay as they were for their readers (and, for an inline projection,
// the appends go on writing them), and a rebuild pays neither for the rows it would have
// deleted nor for keeping every index up to date row by row: the copies carry only what
// refuses rows (which the writers' ON CONFLICT clauses need too), or nothing at all for
// COPY, and the other indexes are built once, sorted, at the end. The rebuild's
// statements find the copies first on the search_path, so the writers run unchanged.
//
// Only the swap stops anyone (see lock): holding the old tables (and, for an inline
// projection, the chain's head, so no append commits), it applies what was appended
// since its last read and replaces the tables. The rebuild holds the old tables in ACCESS
// SHARE mode from the start (LIKE takes it), so a migration that alters one of them
// meanwhile waits, and then alters the table swapped in. What the old tables were
// granted is not carried over (the service's own role owns them). A table that foreign
// keys point at, that owns a sequence or that a view reads is not shadowed (openShadow):
// the rebuild empties it in place.
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

// errNotShadowed says a projection's tables cannot be shadowed: the rebuild empties
// them in place.
var errNotShadowed = errors.New("not shadowed")

// openShadow makes the empty copies of tables, in a schema named after the projection,
// and puts it first on the transaction's search_path: what it reads of the catalog in
// one round trip, what it makes in another. The copies have the tables' columns,
// defaults and checks and, unless bare, what refuses rows (primary key, unique
// constraints and indexes, exclusions), which ON CONFLICT needs too; the statements of
// the rest (other indexes, foreign keys; with bare, all) wait for finishCopies.
func openShadow(ctx context.Context, tx pgx.Tx, name string, tables []string, bare bool) (*shadow, error) {
	s := &shadow{name: "rebuild_" + name}
	s.schema = pgx.Identifier{s.name}.Sanitize()
	read := &pgx.Batch{}
	read.Queue(`SELECT current_setting('search_path')`).QueryRow(func(row pgx.Row) error { return row.Scan(&s.searchPath) })
	// what would have to follow the table (a dropped table takes its sequences along,
	// and a view or a foreign key would stop the drop)
	var bound []string
	read.Queue(`SELECT coalesce(array_agg(t), '{}') FROM unnest($1::text[]) t
		 WHERE EXISTS (SELECT 1 FROM pg_constraint f WHERE f.confrelid = to_regclass(t) AND f.contype = 'f')
		    OR EXISTS (SELECT 1 FROM pg_depend d JOIN pg_class q ON q.oid = d.objid AND q.relkind = 'S'
		                WHERE d.classid = 'pg_class'::regclass AND d.refobjid = to_regclass(t) AND d.deptype = 'a')
		    OR EXISTS (SELECT 1 FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid
		                WHERE d.classid = 'pg_rewrite'::regclass AND d.refobjid = to_regclass(t) AND r.ev_class <> to_regclass(t))`,
		tables).QueryRow(func(row pgx.Row) error { return row.Scan(&bound) })
	// each table with its constraints, then its other indexes (an index of the copy
	// cannot take the name of a constraint's before the constraint has it)
	var defs []shadowDef
	read.Queue(`SELECT t.ord, format('%I', n.nspname), format('%I', c.relname), coalesce(x.kind, ''), coalesce(x.def, ''), coalesce(x.refuses, false)
		  FROM unnest($1::text[]) WITH ORDINALITY t(name, ord)
		  JOIN pg_class c ON c.oid = to_regclass(t.name) JOIN pg_namespace n ON n.oid = c.relnamespace
		  LEFT JOIN LATERAL (
		      SELECT 'c' AS kind, format('%I ', conname) || pg_get_constraintdef(oid) AS def, contype <> 'f' AS refuses
		        FROM pg_constraint WHERE conrelid = c.oid AND contype IN ('p', 'u', 'x', 'f')
		      UNION ALL
		      SELECT 'i', pg_get_indexdef(i.indexrelid), i.indisunique
		        FROM pg_index i WHERE i.indrelid = c.oid AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid)
		  ) x ON true
		 ORDER BY t.ord, x.kind, x.def`, tables).Query(func(rows pgx.Rows) error {
		var err error
		defs, err = pgx.CollectRows(rows, pgx.RowToStructByPos[shadowDef])
		return err
	})
	// what the tables' owner granted to others, on the tables and on their columns: a
	// copy has none of it until given
	var grants []shadowGrant
	read.Queue(`SELECT t.ord, g.privilege, g.col, CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE format('%I', pg_get_userbyid(g.grantee)) END, g.grantable
		  FROM unnest($1::text[]) WITH ORDINALITY t(name, ord)
		  JOIN pg_class c ON c.oid = to_regclass(t.name)
		  CROSS JOIN LATERAL (
		      SELECT a.privilege_type AS privilege, '' AS col, a.grantee, a.is_grantable AS grantable
		        FROM aclexplode(c.relacl) a WHERE a.grantee <> c.relowner
		      UNION ALL
		      SELECT a.privilege_type, format('%I', att.attname), a.grantee, a.is_grantable
		        FROM pg_attribute att, aclexplode(att.attacl) a
		       WHERE att.attrelid = c.oid AND att.attacl IS NOT NULL AND a.grantee <> c.relowner
		  ) g
		 ORDER BY 1, 2, 3, 4`, tables).Query(func(rows pgx.Rows) error {
		var err error
		grants, err = pgx.CollectRows(rows, pgx.RowToStructByPos[shadowGrant])
		return err
	})
	if err := tx.SendBatch(ctx, read).Close(); err != nil {
		return nil, fmt.Errorf("shadow: read the tables: %w", err)
	}
	if len(bound) > 0 {
		return nil, fmt.Errorf("foreign keys, sequences or views are bound to %s: %w", strings.Join(bound, ", "), errNotShadowed)
	}
	build := &pgx.Batch{}
	// two rebuilds of one projection: the second waits for the first's schema to go
	build.Queue(`SELECT pg_advisory_xact_lock(hashtext('chessd rebuild ' || $1))`, name)
	build.Queue(`CREATE SCHEMA ` + s.schema)
	for _, d := range defs {
		if len(s.tables) < d.Table {
			st := shadowTable{schema: d.Schema, original: d.Schema + "." + d.Rel, copy: s.schema + "." + d.Rel}
			build.Queue(`CREATE TABLE ` + st.copy + ` (LIKE ` + st.original + ` INCLUDING ALL EXCLUDING INDEXES)`)
			s.tables = append(s.tables, st)
		}
		st := &s.tables[len(s.tables)-1]
		stmt := `ALTER TABLE ` + st.copy + ` ADD CONSTRAINT ` + d.Def
		switch d.Kind {
		case "":
			continue // neither constraints nor indexes
		case "i":
			// CREATE [UNIQUE] INDEX name ON [ONLY] schema.table USING ...: the same
			// index, under the same name, on the copy
			on := " ON " + st.original + " "
			if strings.Count(d.Def, on) != 1 {
				return nil, fmt.Errorf("shadow: cannot read index %q", d.Def)
			}
			stmt = strings.Replace(d.Def, on, " ON "+st.copy+" ", 1)
		}
		if d.Refuses && !bare {
			build.Queue(stmt)
		} else {
			st.after = append(st.after, stmt)
		}
	}
	if len(s.tables) != len(tables) {
		return nil, fmt.Errorf("shadow: of the tables %v, only %d exist", tables, len(s.tables))
	}
	for _, g := range grants {
		build.Queue(g.statement(s.tables[g.Table-1].copy))
	}
	build.Queue(`SELECT set_config('search_path', $1, true)`, s.schema+", "+s.searchPath)
	if err := tx.SendBatch(ctx, build).Close(); err != nil {
		return nil, fmt.Errorf("shadow: make the copies: %w", err)
	}
	return s, nil
}

// shadowDef is a table of a shadow and one of its constraints or indexes, as the
// catalog gives them.
type shadowDef struct {
	Table       int    // its place in the list, from 1
	Schema, Rel string // quoted
	Kind        string // c: constraint, i: index, "": none
	Def         string
	Refuses     bool // it refuses rows
}

// shadowGrant is a privilege the owner of a shadow's table granted to another role.
type shadowGrant struct {
	Table     int    // its place in the list, from 1
	Privilege string // SELECT, INSERT, UPDATE...
	Column    string // quoted; "" for the whole table
	Grantee   string // quoted, or PUBLIC
	Grantable bool
}

// statement grants the same on table (quoted).
func (g shadowGrant) statement(table string) string {
	stmt := "GRANT " + g.Privilege
	if g.Column != "" {
		stmt += " (" + g.Column + ")"
	}
	stmt += " ON " + table + " TO " + g.Grantee
	if g.Grantable {
		stmt += " WITH GRANT OPTION"
	}
	return stmt
}

// finishCopies builds the copies' other constraints, indexes and foreign keys, then
// runs fill (when given: the tables a projection derives from its others), then gathers
// the copies' statistics, all before the swap stops anyone.
func (s *shadow) finishCopies(ctx context.Context, tx pgx.Tx, fill func() error) error {
	b := &pgx.Batch{}
	// sorting a million rows for an index takes more than the default 64 MB; and a
	// fill that groups every row of a table (the ledger's rollups) sorts them on disk
	// under the default 4 MB of work_mem, where it would hash them in memory (200,000
	// charges: 0.83 s against 0.37)
	b.Queue(`SET LOCAL maintenance_work_mem = '256MB'`)
	b.Queue(`SET LOCAL work_mem = '64MB'`)
	for _, st := range s.tables {
		for _, stmt := range st.after {
			b.Queue(stmt)
		}
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("shadow: constraints and indexes: %w", err)
	}
	if fill != nil {
		if err := fill(); err != nil {
			return err
		}
	}
	b = &pgx.Batch{}
	for _, st := range s.tables {
		b.Queue(`ANALYZE ` + st.copy)
	}
	return tx.SendBatch(ctx, b).Close()
}

// lock holds the old tables, so no one reads or writes them, and with head the chain's
// head, so no append commits.
func (s *shadow) lock(ctx context.Context, tx pgx.Tx, head bool) error {
	names := make([]string, len(s.tables))
	for i, st := range s.tables {
		names[i] = st.original
	}
	return lockTables(ctx, tx, names, head)
}

// lockTables takes tables in ACCESS EXCLUSIVE mode and, with head, the chain's head
// first. A reader that holds one of the tables and waits for another (auth reads
// key_secrets, then api_keys), or an append that read one before it waits for the head
// (a credit reads its charge), would wait on the rebuild while the rebuild waits on it:
// the tables are asked for with a lock timeout shorter than PostgreSQL's deadlock check,
// and on a timeout everything is let go and asked for again, waiting longer each time.
func lockTables(ctx context.Context, tx pgx.Tx, tables []string, head bool) error {
	wait := 50 * time.Millisecond
	for try := 1; ; try++ {
		b := &pgx.Batch{}
		b.Queue(`SAVEPOINT lock_tables`)
		if head {
			b.Queue(`SELECT 1 FROM event_chain FOR UPDATE`)
		}
		b.Queue(fmt.Sprintf(`SET LOCAL lock_timeout = %d`, wait.Milliseconds()))
		b.Queue(`LOCK TABLE ` + strings.Join(tables, ", ") + ` IN ACCESS EXCLUSIVE MODE`)
		b.Queue(`SET LOCAL lock_timeout = 0`)
		b.Queue(`RELEASE SAVEPOINT lock_tables`)
		err := tx.SendBatch(ctx, b).Close()
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55P03" || try == 100 { // lock_not_available: about a minute
			return err
		}
		if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT lock_tables`); err != nil {
			return err
		}
		wait = min(2*wait, 600*time.Millisecond) // under deadlock_timeout's default second
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
