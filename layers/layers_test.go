package layers_test

import (
	"errors"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

const module = "chessd"

// layer of every package of the module, bottom (0) to top. A package missing here
// fails the test: a new package takes its place in the order on purpose.
var layer = map[string]int{
	"domain":          0, // events, aggregates, invariants: no I/O
	"domain/position": 0,
	"migrations":      0, // SQL text, embedded
	"syncbuf":         0, // a buffer for concurrent writers (tests' logs, processes' output)
	"memo":            0, // a bounded concurrent map (what a process remembers of what anyone sends)
	"postgres":        1, // connections, migrations, the embedded cluster
	"postgres/pgtest": 1,
	"mail/mailtest":   1, // an SMTP server for tests, where a message's recipient reads it
	"engine":          1, // UCI processes: no database, no domain
	"ratelimit":       1, // its own table, through any connection
	"gctune":          1, // the garbage collector's target of chessd's processes (reads GOGC)
	"procenv":         1, // the environment of the processes chessd starts, without its secrets
	"eventstore":      2,
	"commands":        3,
	"ledger":          3,
	"projections":     4,
	"mail":            4, // sends the outbox the commands fill
	"webhook":         4, // signed deliveries to customers' endpoints
	"alerts":          5, // budget thresholds, told by webhook
	"auth":            5, // reads the write side through commands
	"analysis":        5, // uses the engines
	"httpapi":         6,
	"executor":        6, // consumes the command bus beside httpapi, above the engines
	"metrics":         6, // reads everyone's stats at scrape time; httpapi reports to it through a func
	"cmd/chessd":      7,
	"cmd/chessbench":  7,
	"layers":          7, // this test

	"openapi":             1, // the OpenAPI document (embedded) and how it is served: imports nothing of ours
	"openapi/openapitest": 1, // checks traffic against the document, for every package's tests
	"console":             1, // the web console's built assets (embedded) and how they are served: imports nothing of ours
	"client":              1, // the Go client generated from the OpenAPI document: imports nothing of ours
	"ucibridge":           1, // UCI on stdin/stdout to the API, through client (chess rules: domain/position)
	"cli":                 1, // the binary's client commands (eval, usage, uci, …), through client
	"examples/eval":       7, // an example program of the client
}

// noIO are imports a package of layer 0 may not have.
var noIO = regexp.MustCompile(`^(os|os/exec|net|net/http|database/sql|syscall)$|^github\.com/(jackc|ThreeDotsLabs)/`)

// packages lists the module's packages by path relative to the module root, with
// their directories.
func packages(t *testing.T) map[string]*build.Package {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found: %v", err)
	}
	out := map[string]*build.Package{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor" || name == "node_modules") {
			return filepath.SkipDir
		}
		p, err := build.ImportDir(path, 0)
		var none *build.NoGoError
		if errors.As(err, &none) {
			return nil
		}
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		out[filepath.ToSlash(rel)] = p
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 10 {
		t.Fatalf("found only %d packages under %s", len(out), root)
	}
	return out
}

// TestArrowsPointDown: no package imports one of a higher layer (test files aside:
// a test may drive its package from above), and the domain does no I/O.
func TestArrowsPointDown(t *testing.T) {
	for rel, p := range packages(t) {
		from, ok := layer[rel]
		if !ok {
			t.Errorf("package %s has no layer: give it one in layers_test.go and docs/ARCHITECTURE.md", rel)
			continue
		}
		for _, imp := range p.Imports {
			if from == 0 && noIO.MatchString(imp) {
				t.Errorf("%s (no I/O) imports %s", rel, imp)
			}
			dep, ok := strings.CutPrefix(imp, module+"/")
			if !ok {
				continue
			}
			to, known := layer[dep]
			if !known {
				t.Errorf("%s imports %s, which has no layer", rel, imp)
			} else if to > from {
				t.Errorf("%s (layer %d) imports %s (layer %d): an arrow pointing up; move the code instead", rel, from, dep, to)
			}
		}
	}
}

// sqlText is a statement: keywords in capitals, as all our SQL is written (prose, "With a
// key ...", passes).
var sqlText = regexp.MustCompile(`(?s)^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|ALTER|DROP|TRUNCATE|LOCK|COPY|BEGIN|COMMIT)\s`)

// TestCmdAndHTTPAPIHoldNoSQL: cmd/ only wires and httpapi only speaks HTTP; what they
// read and write they reach through the package that owns the table. Checked on the
// source of every non-test file: no SQL text, and no call that sends a statement.
func TestCmdAndHTTPAPIHoldNoSQL(t *testing.T) {
	// r.URL.Query() takes no argument; a database call takes at least a context.
	statements := map[string]bool{"Query": true, "QueryRow": true, "Exec": true, "SendBatch": true, "CopyFrom": true, "Begin": true, "BeginTx": true}
	fset := token.NewFileSet()
	checked := 0
	for rel, p := range packages(t) {
		if rel != "httpapi" && !strings.HasPrefix(rel, "cmd/") {
			continue
		}
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			checked++
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.BasicLit:
					if n.Kind != token.STRING {
						break
					}
					if s, err := strconv.Unquote(n.Value); err == nil && sqlText.MatchString(s) {
						t.Errorf("%s: SQL text %.40q", fset.Position(n.Pos()), s)
					}
				case *ast.CallExpr:
					if sel, ok := n.Fun.(*ast.SelectorExpr); ok && statements[sel.Sel.Name] && len(n.Args) > 0 {
						t.Errorf("%s: database call %s", fset.Position(n.Pos()), sel.Sel.Name)
					}
				}
				return true
			})
		}
	}
	if checked == 0 {
		t.Fatal("no source files found under cmd/ and httpapi/")
	}
}

// moneyState names the tables, views and functions of the money path's state: budgets
// and their zones, balances and allowance days, leases and holds, idempotency, charges
// and credits, and the meter's functions. moneyNames are those of its names that are
// not also English words: no string outside ledger has them, whether it starts a
// statement or is a piece of one.
var (
	moneyState = regexp.MustCompile(`\b(leases|idempotency|charges|credits)\b|` + moneyNames.String())
	moneyNames = regexp.MustCompile(`\b(key_balances|key_periods|account_days|account_budgets|account_zones|keyless_usage|charge_batches|charge_batch_hours|credited_charges|ledger_entries|meter_[a-z_]+)\b`)
)

// TestMoneyHasOneHome: no statement outside ledger names the money path's state, and no
// string outside it names one of its tables (tests aside: they check it from outside).
// Key and account commands change budgets through ledger's functions, in their own
// transactions.
func TestMoneyHasOneHome(t *testing.T) {
	fset := token.NewFileSet()
	statements := 0
	for rel, p := range packages(t) {
		if rel == "ledger" {
			continue
		}
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil {
					return true
				}
				if !sqlText.MatchString(s) {
					if m := moneyNames.FindString(s); m != "" {
						t.Errorf("%s: a string outside ledger names %s: %.60q", fset.Position(lit.Pos()), m, s)
					}
					return true
				}
				statements++
				if m := moneyState.FindString(s); m != "" {
					t.Errorf("%s: a statement outside ledger names %s: %.60q", fset.Position(lit.Pos()), m, s)
				}
				return true
			})
		}
	}
	if statements < 20 {
		t.Fatalf("found only %d statements outside ledger", statements)
	}
}
