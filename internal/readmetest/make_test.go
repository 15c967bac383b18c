package readmetest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// `make scale` runs 1,000 and 10,000 orgs, and SCALE_ORGS=... replaces them, as
// docs/SCALING.md says. It ran 1,000 only: $(or $(SCALE_ORGS),1000,10000) splits its
// default at the comma, so make took "1000" as the next argument of or.
func TestMakeScaleRunsTheDocumentedOrgs(t *testing.T) {
	for _, c := range []struct{ env, want string }{
		{"", "-orgs 1000,10000"},
		{"SCALE_ORGS=1000,10000,100000", "-orgs 1000,10000,100000"},
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
		if !strings.Contains(string(out), c.want+"\n") {
			t.Errorf("%s make scale runs %q, want %q", c.env, strings.TrimSpace(string(out)), c.want)
		}
	}
}
