package httpapi_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// httpapi holds no SQL: what it reads, it reads through the package that owns the table
// (ledger, projections, commands). Checked on the source: no SQL text and no call that
// sends a statement, in any non-test file (pool.Ping in health.go sends none).
func TestHTTPAPIHoldsNoSQL(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	sqlText := regexp.MustCompile(`(?is)^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|ALTER|DROP|TRUNCATE|LOCK)\s`)
	statements := map[string]bool{"Query": true, "QueryRow": true, "Exec": true, "SendBatch": true, "CopyFrom": true, "Begin": true, "BeginTx": true}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
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
				// r.URL.Query() takes no argument; a database call takes at least a context
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && statements[sel.Sel.Name] && len(n.Args) > 0 {
					t.Errorf("%s: database call %s", fset.Position(n.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
	if checked == 0 {
		t.Fatal("no source files found")
	}
}
