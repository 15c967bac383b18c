package readmetest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// `make scale` runs the worker's measure and the api's at 100,000 orgs, both even
// when the first is out of its bounds, and SCALE_ORGS=... replaces the worker's
// counts, as docs/SCALING.md says: a list with a comma stays whole ($(or
// $(SCALE_ORGS),a,b) would split a default at its comma).
func TestMakeScaleRunsTheDocumentedOrgs(t *testing.T) {
	for _, c := range []struct{ env, want string }{
		{"", "-orgs 100000 || status=1"},
		{"SCALE_ORGS=2000,100000", "-orgs 2000,100000 || status=1"},
		{"", "BENCH_ORGS=100000 bash scripts/bench_orgs.sh || status=1"},
	} {
		cmd := exec.Command("make", "-n", "scale")
		cmd.Dir = "../.."
		cmd.Env = os.Environ()
		if c.env != "" {
			cmd.Env = append(cmd.Env, c.env)
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make -n scale: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), c.want) {
			t.Errorf("%s make scale runs %q, want %q", c.env, strings.TrimSpace(string(out)), c.want)
		}
	}
}
