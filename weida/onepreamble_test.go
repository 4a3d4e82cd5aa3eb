package weida

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// TestOnePreambleParser keeps the preamble rules in weida/wire: this
// package peeks streams with wire.PreambleNeed and wire.ParsePreamble and
// must not check the magic byte or the kind itself, as conn.go once did
// beside them (the two copies could drift apart on a hostile stream).
func TestOnePreambleParser(t *testing.T) {
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "wire" && sel.Sel.Name == "Magic" {
				t.Errorf("%s: reads wire.Magic itself; parse the preamble with wire.ParsePreamble or wire.PreambleNeed", fset.Position(sel.Pos()))
			}
			if sel.Sel.Name == "Defined" {
				t.Errorf("%s: checks a frame kind itself; wire's preamble parser refuses reserved kinds", fset.Position(sel.Pos()))
			}
			return true
		})
	}
}
