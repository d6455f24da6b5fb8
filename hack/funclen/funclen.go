// Package funclen keeps functions short: its test fails when a function
// of the module (tests and generated code aside) is longer than Limit
// lines, unless longer.txt lists it at no more than its length there. The
// list only shrinks: a listed function that grew, shrank under the limit
// or is gone fails the test too, until the list says so.
package funclen

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
)

// Limit is the longest a function may be, in lines from func to its
// closing brace.
const Limit = 100

// Func is one function longer than Limit.
type Func struct {
	// Name is PATH:NAME, or PATH:RECEIVER.NAME for a method.
	Name  string
	Lines int
}

// Measure lists the functions of the Go files under root longer than
// Limit, skipping tests, zz_generated files, bin/ and hidden directories.
func Measure(root string) ([]Func, error) {
	var out []Func
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel != "." && (rel == "bin" || strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasPrefix(d.Name(), "zz_generated") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			lines := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			if lines > Limit {
				out = append(out, Func{Name: filepath.ToSlash(rel) + ":" + funcName(fn), Lines: lines})
			}
		}
		return nil
	})
	return out, err
}

func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	t := fn.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if g, ok := t.(*ast.IndexExpr); ok {
		t = g.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}
	return fn.Name.Name
}
