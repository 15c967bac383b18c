package problem_test

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/platform/problem"
)

func TestEveryKindHasAStatus(t *testing.T) {
	for _, k := range derrors.Kinds() {
		st := problem.Status(k)
		if k != derrors.Internal && st == http.StatusInternalServerError {
			t.Errorf("kind %q has no row of its own in the table", k)
		}
		if st < 400 {
			t.Errorf("kind %q maps to %d", k, st)
		}
	}
}

func TestFrom(t *testing.T) {
	notFound := derrors.New(derrors.NotFound, "not found")
	cases := []struct {
		name   string
		err    error
		status int
		detail string
		fields int
	}{
		{"wrapped not found", fmt.Errorf("get team: %w", derrors.Wrap(notFound, "team %q of org %q", "t", "o")), 404, `team "t" of org "o" not found`, 0},
		{"field", derrors.Field("cost", "must be an integer"), 400, "cost: must be an integer", 1},
		{"an internal error says nothing of itself", errors.New("pq: secret table"), 500, "internal error", 0},
		{"an unavailable one neither", derrors.E(derrors.Unavailable, "the database is unavailable; retry shortly", errors.New("dial 10.0.0.3")), 503, "the database is unavailable; retry shortly", 0},
		{"a 5xx sentinel has the kind's words", fmt.Errorf("x: %w", derrors.New(derrors.Overloaded, "quota: 300 in flight")), 503, "too many requests in flight; retry shortly", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := problem.From(tc.err)
			if d.Status != tc.status || d.Detail != tc.detail || len(d.Errors) != tc.fields {
				t.Errorf("From = %+v, want %d %q with %d field errors", d, tc.status, tc.detail, tc.fields)
			}
			if d.Type != problem.TypeBase+strings.ReplaceAll(strings.ToLower(http.StatusText(d.Status)), " ", "-") || d.Title == "" {
				t.Errorf("type %q, title %q", d.Type, d.Title)
			}
		})
	}
	rec := httptest.NewRecorder()
	problem.Write(rec, httptest.NewRequest("GET", "/", nil), nil, fmt.Errorf("read: %w", errContextCanceled()))
	if rec.Body.Len() != 0 {
		t.Errorf("a canceled request was answered: %s", rec.Body)
	}
}

func errContextCanceled() error { return derrors.Canceled }

// No status of an error is chosen outside the table: no other Go file of the project
// names a 4xx or 5xx http.Status constant, calls http.Error or http.NotFound, or writes
// a 4xx/5xx literal. (2xx and 3xx answers are the handlers' own; generated code is
// oapi-codegen's, and its error handler is set to ours; loadgen is a client, reading
// statuses, not answering them; packages named *test, such as tracingtest's OTLP
// receiver, are fakes that tests run, not the API.)
func TestNoStatusOutsideTheMap(t *testing.T) {
	errorStatus := map[string]bool{}
	for code := 400; code < 600; code++ {
		if text := http.StatusText(code); text != "" {
			name := "Status" + strings.NewReplacer(" ", "", "-", "", "'", "").Replace(text)
			errorStatus[name] = true
		}
	}
	errorStatus["StatusRequestEntityTooLarge"], errorStatus["StatusTeapot"] = true, true
	root := filepath.Join("..", "..", "..")
	fset := token.NewFileSet()
	checked := 0
	for _, dir := range []string{"internal", "cmd"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") ||
				strings.Contains(path, filepath.Join("platform", "problem")) || strings.HasSuffix(path, ".gen.go") ||
				strings.Contains(path, "loadgen") || strings.HasSuffix(filepath.Base(filepath.Dir(path)), "test") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			checked++
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.SelectorExpr:
					if x, ok := n.X.(*ast.Ident); ok && x.Name == "http" {
						if errorStatus[n.Sel.Name] || n.Sel.Name == "Error" || n.Sel.Name == "NotFound" {
							t.Errorf("%s: http.%s: an error status is the table's to choose (internal/platform/problem)", fset.Position(n.Pos()), n.Sel.Name)
						}
					}
				case *ast.CallExpr:
					if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "WriteHeader" && len(n.Args) == 1 {
						if lit, ok := n.Args[0].(*ast.BasicLit); ok && lit.Kind == token.INT && lit.Value >= "400" && len(lit.Value) == 3 {
							t.Errorf("%s: WriteHeader(%s): an error status is the table's to choose", fset.Position(n.Pos()), lit.Value)
						}
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checked < 50 {
		t.Fatalf("checked %d files; is the walk rooted right?", checked)
	}
}
