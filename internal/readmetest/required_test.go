package readmetest

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// described are routes the pages introduce in prose, with the schema of their body:
// the paragraph that first names the route must name each field the API requires (a
// reader who follows the prose, not the example, is refused otherwise: a throttle
// needs a reason, say).
var described = []struct{ page, route, schema string }{
	{"docs/TOUR.md", "PUT /v1/orgs/{org}/throttle", "ThrottleSet"},
}

func TestPagesNameTheRequiredFieldsOfTheRoutesTheyDescribe(t *testing.T) {
	root := testenv.RepoRoot(t)
	doc, err := api.GetSwagger()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range described {
		ref := doc.Components.Schemas[d.schema]
		if ref == nil || ref.Value == nil {
			t.Fatalf("api/openapi.yaml has no schema %s", d.schema)
		}
		text, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(d.page)))
		if err != nil {
			t.Fatal(err)
		}
		para := paragraphNaming(string(text), "`"+d.route+"`")
		if para == "" {
			t.Errorf("%s: no paragraph names `%s`", d.page, d.route)
			continue
		}
		required := slices.Clone(ref.Value.Required)
		slices.Sort(required)
		for _, field := range required {
			if !regexp.MustCompile("`" + regexp.QuoteMeta(field) + "`").MatchString(para) {
				t.Errorf("%s: the paragraph introducing %s does not name `%s`, which %s requires:\n%s", d.page, d.route, field, d.schema, para)
			}
		}
	}
}

// paragraphNaming is the first paragraph of text (outside fenced blocks) containing s.
func paragraphNaming(text, s string) string {
	var para []string
	inFence := false
	flush := func() string {
		p := strings.Join(para, "\n")
		para = para[:0]
		if strings.Contains(p, s) {
			return p
		}
		return ""
	}
	for _, line := range strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n") {
		if _, ok := fence(line); ok {
			if p := flush(); p != "" {
				return p
			}
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		if strings.TrimSpace(line) == "" {
			if p := flush(); p != "" {
				return p
			}
			continue
		}
		para = append(para, line)
	}
	return flush()
}
