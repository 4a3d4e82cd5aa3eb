package connectors_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestDropReasonsDocumented: every drop reason the runtime assigns has a row
// in the operator's table of reasons, so a new one cannot ship unexplained.
func TestDropReasonsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	f, err := parser.ParseFile(token.NewFileSet(), "metrics.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "Reason") || i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok {
					continue
				}
				reason, _ := strconv.Unquote(lit.Value)
				found++
				if !strings.Contains(string(doc), "| `"+reason+"` |") {
					t.Errorf("drop reason %q (%s) has no row in docs/OPERATIONS.md", reason, name.Name)
				}
			}
		}
	}
	if found < 10 {
		t.Fatalf("found only %d Reason constants in metrics.go", found)
	}
}
