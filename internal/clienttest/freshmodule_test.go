package clienttest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// readmeProgram is the Go program of docs/TOUR.md (the tour of the API): the first ```go block that imports the
// client.
func readmeProgram(t *testing.T, root string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "TOUR.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile("(?ms)^```go\n(.*?)^```").FindAllStringSubmatch(string(b), -1) {
		if strings.Contains(m[1], `"github.com/quotaplane/quotaplane/client"`) && strings.Contains(m[1], "func main()") {
			return m[1]
		}
	}
	t.Fatal("docs/TOUR.md has no ```go block with a main program importing github.com/quotaplane/quotaplane/client")
	return ""
}

// The Done-when test: the tour's Go program, in a fresh module outside the
// repository whose go.mod requires the client (replaced by this checkout's client/),
// builds with nothing downloaded (GOPROXY=off, an empty module cache), its go.sum
// names nothing, and its check works against a running api.
func TestFreshModuleBuildsAgainstTheClientAlone(t *testing.T) {
	e := newEnv(t, "")
	root := testenv.RepoRoot(t)
	dir := t.TempDir()
	if strings.HasPrefix(dir, root) {
		t.Fatalf("temp dir %s is inside the repository", dir)
	}
	prog := strings.ReplaceAll(readmeProgram(t, root), "http://localhost:8080", e.url())
	gomod := "module example.com/fresh\n\ngo 1.23\n\nrequire github.com/quotaplane/quotaplane/client v0.0.0\n\n" +
		"replace github.com/quotaplane/quotaplane/client => " + filepath.Join(root, "client") + "\n"
	for name, content := range map[string]string{"go.mod": gomod, "main.go": prog} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goEnv := append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=mod", "GOWORK=off", "GOTOOLCHAIN=local",
		"GOMODCACHE="+filepath.Join(t.TempDir(), "modcache"))
	run := func(name string, args ...string) string {
		t.Helper()
		c := exec.Command(name, args...)
		c.Dir, c.Env = dir, goEnv
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("go", "mod", "tidy")
	run("go", "build", "-o", "fresh", ".")
	sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(sum)), "\n") {
		if line != "" && !strings.HasPrefix(line, "github.com/quotaplane/quotaplane/client ") {
			t.Errorf("go.sum names more than the client: %s", line)
		}
	}
	mods := run("go", "list", "-m", "all")
	if got := strings.Split(strings.TrimSpace(mods), "\n"); len(got) != 2 || got[0] != "example.com/fresh" ||
		!strings.HasPrefix(got[1], "github.com/quotaplane/quotaplane/client v0.0.0 => ") {
		t.Errorf("go list -m all:\n%s\nwant the module and the client only", mods)
	}

	c := exec.Command(filepath.Join(dir, "fresh"))
	c.Env = append(os.Environ(), "KEY="+e.st.DemoKey)
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("the fresh program: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "allowed: true remaining: 59 not decided: false" {
		t.Errorf("the fresh program printed %q, want alice's first check of the demo org allowed, 59 of 60 a minute left", got)
	}
}
