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

// goClientSection is docs/TOUR.md's "### Go client" section (the tour of the API).
func goClientSection(t *testing.T, root string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "TOUR.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(b), "\r\n", "\n")
	_, rest, ok := strings.Cut(text, "\n### Go client\n")
	if !ok {
		t.Fatal(`docs/TOUR.md has no "### Go client" section`)
	}
	if end := regexp.MustCompile(`\n##+ `).FindStringIndex(rest); end != nil {
		rest = rest[:end[0]]
	}
	return rest
}

// The blocks of the section, in order: the setup commands (```sh), the program
// (```go, saved as main.go) and the commands that build and run it (```sh), with the
// answer they print.
type goSteps struct {
	setup, program, run, printed string
}

func goClientSteps(t *testing.T, root string) goSteps {
	t.Helper()
	blocks := regexp.MustCompile("(?ms)^```(sh|go)\n(.*?)^```").FindAllStringSubmatch(goClientSection(t, root), -1)
	var kinds []string
	for _, b := range blocks {
		kinds = append(kinds, b[1])
	}
	if strings.Join(kinds, " ") != "sh go sh" {
		t.Fatalf("the Go client section's blocks are %v, want the setup (sh), the program (go), the run (sh)", kinds)
	}
	if !strings.Contains(blocks[1][2], `"github.com/quotaplane/quotaplane/client"`) || !strings.Contains(blocks[1][2], "func main()") {
		t.Fatal("the Go client section's program does not import github.com/quotaplane/quotaplane/client")
	}
	var run, printed []string
	for _, line := range strings.Split(strings.TrimSpace(blocks[2][2]), "\n") {
		if c, ok := strings.CutPrefix(line, "# "); ok {
			printed = append(printed, c)
		} else {
			run = append(run, line)
		}
	}
	return goSteps{setup: blocks[0][2], program: blocks[1][2], run: strings.Join(run, "\n"), printed: strings.Join(printed, "\n")}
}

// newcomerGoEnv is this process's environment without the Go settings a test run or
// a developer's shell may add (a workspace, a proxy, flags), so go answers with the
// defaults a newcomer has: the public module proxy and checksum database. The module
// cache is the user's own.
func newcomerGoEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "GOFLAGS", "GOPROXY", "GOWORK", "GONOPROXY", "GONOSUMDB", "GOPRIVATE", "GOSUMDB", "GOINSECURE", "GO111MODULE":
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// The tour's Go client section, followed as printed in a fresh directory outside the
// repository: its setup commands (a new module whose go.mod replaces the client by the
// clone's client/ directory, the only way to depend on it before it is published), its
// program saved as main.go, and its `go mod tidy && go run .` with KEY set, which
// prints what the section shows. The test writes no go.mod of its own: the section's
// way is what is tested.
func TestTourGoClientStepsWorkInAFreshDirectory(t *testing.T) {
	e := newEnv(t, "")
	root := testenv.RepoRoot(t)
	dir := t.TempDir()
	if strings.HasPrefix(dir, root) {
		t.Fatalf("temp dir %s is inside the repository", dir)
	}
	steps := goClientSteps(t, root)
	// The clone is this checkout: the one line the reader writes themselves.
	clone := regexp.MustCompile(`(?m)^QUOTAPLANE=\S*(\s+#.*)?$`)
	if !clone.MatchString(steps.setup) {
		t.Fatalf("the setup commands do not set QUOTAPLANE to the clone:\n%s", steps.setup)
	}
	setup := clone.ReplaceAllLiteralString(steps.setup, "QUOTAPLANE="+root)
	prog := strings.ReplaceAll(steps.program, "http://localhost:8080", e.url())
	script := setup + "\ncat > main.go <<'QUOTAPLANE_MAIN_GO'\n" + prog + "QUOTAPLANE_MAIN_GO\n" + steps.run + "\n"

	c := exec.Command("bash", "-euo", "pipefail", "-c", script)
	c.Dir, c.Env = dir, newcomerGoEnv("KEY="+e.st.DemoKey, "GOTOOLCHAIN=local")
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("the tour's Go client steps: %v\n%s\nscript:\n%s", err, out, script)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if got := lines[len(lines)-1]; got != steps.printed {
		t.Errorf("the program printed %q, want what the tour shows, %q (all output:\n%s)", got, steps.printed, out)
	}

	// The module the steps made depends on the client alone, replaced by the clone's.
	gomod, err := os.ReadFile(filepath.Join(dir, "hello", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(gomod), "replace github.com/quotaplane/quotaplane/client => "+filepath.Join(root, "client")) {
		t.Errorf("go.mod:\n%s\nwant the client replaced by the clone's client/", gomod)
	}
	list := exec.Command("go", "list", "-m", "all")
	list.Dir, list.Env = filepath.Join(dir, "hello"), newcomerGoEnv("GOTOOLCHAIN=local")
	mods, err := list.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -m all: %v\n%s", err, mods)
	}
	if got := strings.Split(strings.TrimSpace(string(mods)), "\n"); len(got) != 2 || got[0] != "example.com/hello" ||
		!strings.HasPrefix(got[1], "github.com/quotaplane/quotaplane/client v0.0.0-") {
		t.Errorf("go list -m all:\n%s\nwant the module and the client only", mods)
	}
}
