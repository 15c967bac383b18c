package readmetest

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// orgKeyLike is a bearer token in the docs that looks like an org key: qp, letters,
// an underscore.
var orgKeyLike = regexp.MustCompile(`Bearer (qp[a-z]*)_`)

// Every key-like bearer token in the docs starts as keys do (org keys start qpk_), so
// a reader can tell an org key from the operator token at a glance.
func TestDocsKeyPlaceholdersLookLikeKeys(t *testing.T) {
	root := testenv.RepoRoot(t)
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "README.md"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range orgKeyLike.FindAllStringSubmatch(string(b), -1) {
			if m[1] != "qpk" {
				t.Errorf("%s: a bearer token %s_..., want qpk_ (org keys are qpk_<id>_<secret>)", filepath.Base(f), m[1])
			}
		}
	}
}
