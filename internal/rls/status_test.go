package rls

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Every error kind has a row of the table.
func TestEveryKindHasACode(t *testing.T) {
	for _, k := range derrors.Kinds() {
		if int(k) >= len(table) || (table[k] == row{}) {
			t.Errorf("kind %v has no row in the gRPC table", k)
		}
	}
}

// The check service's errors keep the codes Envoy decides on; a store's causes are
// never sent.
func TestStatusOf(t *testing.T) {
	for _, c := range []struct {
		err  error
		code codes.Code
		msg  string
	}{
		{derrors.Field("team", "must match"), codes.InvalidArgument, "descriptor 0: team: must match"},
		{fmt.Errorf("%w: cost -1", quota.ErrInvalid), codes.InvalidArgument, "descriptor 0: invalid quota request: cost -1"},
		{&tenants.UnknownMetricError{Metric: "tokens"}, codes.InvalidArgument, "tokens"},
		{derrors.E(derrors.NotFound, `team "x" of org "y" not found`, nil), codes.InvalidArgument, `team "x" of org "y" not found`},
		{derrors.E(derrors.Forbidden, "this key lacks the scope this operation needs: check", nil), codes.PermissionDenied, "check"},
		{derrors.E(derrors.Unavailable, "the quota store is unavailable; retry shortly", errors.New("dial tcp: refused")), codes.Unavailable, "descriptor 0: the quota store is unavailable; retry shortly"},
		{errors.New("something unforeseen"), codes.Internal, "descriptor 0: internal error"},
		{fmt.Errorf("check: %w", quota.ErrOverloaded), codes.Unavailable, "in flight"},
		{derrors.Canceled, codes.Canceled, "descriptor 0: the caller went away"},
	} {
		st, _ := status.FromError(statusOf(nil, "descriptor 0", c.err))
		if st.Code() != c.code || !strings.Contains(st.Message(), c.msg) || strings.Contains(st.Message(), "dial tcp") {
			t.Errorf("%v = %v %q, want %v containing %q", c.err, st.Code(), st.Message(), c.code, c.msg)
		}
	}
}

// No gRPC status code is chosen outside the table: no other Go file of the project
// names a constant of google.golang.org/grpc/codes (the table of HTTP statuses is
// kept the same way by internal/platform/problem's TestNoStatusOutsideTheMap; tests
// and packages named *test, fakes that tests run, may name codes).
func TestNoCodeOutsideTheMap(t *testing.T) {
	root := filepath.Join("..", "..")
	self := filepath.Join("internal", "rls", "status.go")
	fset := token.NewFileSet()
	checked := 0
	for _, dir := range []string{"internal", "cmd"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") ||
				strings.HasSuffix(path, self) || strings.HasSuffix(filepath.Base(filepath.Dir(path)), "test") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly|parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			name := ""
			for _, im := range f.Imports {
				if p, _ := strconv.Unquote(im.Path.Value); p == "google.golang.org/grpc/codes" {
					name = "codes"
					if im.Name != nil {
						name = im.Name.Name
					}
				}
			}
			checked++
			if name == "" {
				return nil
			}
			if f, err = parser.ParseFile(fset, path, nil, parser.SkipObjectResolution); err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok {
					if x, ok := sel.X.(*ast.Ident); ok && x.Name == name {
						t.Errorf("%s: codes.%s: a gRPC code is the table's to choose (internal/rls/status.go)", fset.Position(n.Pos()), sel.Sel.Name)
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

// A descriptor is named in an error and in Quotaplane-Refused by its index and at
// most four entries, each key and value clipped to vocab.MaxEcho characters: a 1 MB
// value, or a thousand entries, are not echoed.
func TestDescriptorNameIsBounded(t *testing.T) {
	mb := strings.Repeat("v", 1<<20)
	d := &ratelimitv3.RateLimitDescriptor{}
	for range 1000 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: mb, Value: mb})
	}
	st, _ := status.FromError(statusOf(nil, descriptorName(7, d), derrors.E(derrors.Unavailable, "", errors.New("down"))))
	msg := st.Message()
	if st.Code() != codes.Unavailable || !strings.HasPrefix(msg, "descriptor 7 (") || !strings.Contains(msg, "996 more") ||
		strings.Contains(msg, strings.Repeat("v", vocab.MaxEcho+1)) || len(msg) > 1024 {
		t.Errorf("= %v, %d bytes: %.300q", st.Code(), len(msg), msg)
	}
}

// Whatever a message of the check service quotes of a descriptor, its errors and
// Quotaplane-Refused carry at most vocab.MaxEcho characters of each value.
func TestMessagesClipTheDescriptorsValues(t *testing.T) {
	user := strings.Repeat("u", 128) // a valid id
	d := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "team", Value: "eng"}, {Key: "user", Value: user}}}
	err := derrors.E(derrors.Unprocessable, fmt.Sprintf("user %q is not registered in team %q", user, "eng"), nil)
	st, _ := status.FromError(statusOfDescriptor(nil, 2, d, err))
	words := clipValues(wordsOf(err), d)
	for _, msg := range []string{st.Message(), words} {
		if strings.Contains(msg, strings.Repeat("u", vocab.MaxEcho+1)) || !strings.Contains(msg, `"`+strings.Repeat("u", vocab.MaxEcho)+`…" is not registered in team "eng"`) {
			t.Errorf("%q", msg)
		}
	}
	if !strings.HasPrefix(st.Message(), "descriptor 2 (team=eng, user=") {
		t.Errorf("%q", st.Message())
	}
}
