package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

// layer is a package's place in the import order: a package imports its own layer and
// the ones below it.
type layer int

const (
	base      layer = iota + 1 // the shared vocabulary, error kinds, config, platform/*
	domain                     // tenants, quota, ledger, billing, webhooks
	service                    // checks: the check service both transports call
	transport                  // HTTP, gRPC, the console, the worker's jobs, the demo seed
	binary                     // cmd/*
	testOnly                   // test harnesses: free imports; imported only by binaries and each other
	outside                    // public shims and tools outside cmd/ and internal/: as testOnly
)

func (l layer) String() string {
	return [...]string{"unplaced", "base", "domain", "service", "transport", "cmd", "test-only", "outside"}[l]
}

// table places every package of the module, by its path inside the module. A path
// ending in "/..." places that directory and every package under it; the longest
// match wins. A package it does not place fails TestImportRules: give it a place.
var table = []struct {
	path  string
	layer layer
}{
	{"cmd/...", binary},

	{"internal/httpapi", transport},
	{"internal/httpapi/api", transport}, // generated from api/openapi.yaml
	{"internal/rls", transport},
	{"internal/console", transport},
	{"internal/worker", transport},
	{"internal/demo", transport},

	{"internal/checks", service},

	{"internal/tenants", domain},
	{"internal/quota", domain},
	{"internal/ledger", domain},
	{"internal/billing", domain},
	{"internal/webhooks", domain},

	{"internal/vocab", base},
	{"internal/derrors", base},
	{"internal/config", base},
	{"internal/platform/...", base},
	{"migrations", base}, // the embedded schema
	{"web", base},        // the console's embedded files

	{"internal/clienttest", testOnly},
	{"internal/faulttest", testOnly},
	{"internal/leasetest", testOnly},
	{"internal/readmetest", testOnly},
	{"internal/clustertest", testOnly},
	{"internal/alerttest", testOnly}, // the shipped alerts in a real Prometheus
	{"internal/loadgen", testOnly},
	{"internal/scale", testOnly}, // make scale: measures the worker's per-org costs
	{"internal/archtest", testOnly},
	{"internal/ledger/ledgertest", testOnly}, // the ledger's, billing's and webhooks' test env

	{"webhook", outside}, // public, kept for its importers: delegates to client/webhook
	{"deploy/...", outside},
	{"scripts/...", outside},
	{"examples/...", outside},
}

// rule is one import rule: broken reports why an import breaks it, or "".
type rule struct {
	name   string
	broken func(from, to string, lf, lt layer) string
}

var rules = []rule{
	{"layers", func(from, to string, lf, lt layer) string {
		if lf >= testOnly || lt >= testOnly || lt <= lf {
			return ""
		}
		return fmt.Sprintf("a %s package imports a %s package, a layer above its own", lf, lt)
	}},
	{"test-only packages are not imported", func(from, to string, lf, lt layer) string {
		if lt >= testOnly && lf != binary && lf < testOnly {
			return fmt.Sprintf("%s is a %s package; only cmd/* and other test-only packages import it", to, lt)
		}
		return ""
	}},
	{"tenants does not import quota", func(from, to string, _, _ layer) string {
		if from == "internal/tenants" && to == "internal/quota" {
			return "tenants takes the shared words from internal/vocab, not from the engine"
		}
		return ""
	}},
	{"quota and tenants do not import the ledger, billing or webhooks", func(from, to string, _, _ layer) string {
		if (from == "internal/quota" || from == "internal/tenants") &&
			(to == "internal/ledger" || to == "internal/billing" || to == "internal/webhooks") {
			return "ledger, billing and webhooks build on quota and tenants, not the other way"
		}
		return ""
	}},
	{"the transports import no engine package", func(from, to string, _, _ layer) string {
		if (from == "internal/httpapi" || from == "internal/rls") && to == "internal/quota" {
			return "a transport asks the check service (internal/checks) and renders its answer in the words of internal/vocab"
		}
		return ""
	}},
	{"vocab imports nothing internal but derrors", func(from, to string, _, _ layer) string {
		if from == "internal/vocab" && to != "internal/derrors" {
			return "internal/vocab is the leaf every domain package shares"
		}
		return ""
	}},
}

// pending are the breaks of the rules above, and the unplaced packages, that a step on
// another branch removes: each is tolerated (its rule's subtest says so and skips)
// until that step is merged, and then fails the test until it is deleted here. Delete
// this list's entries as the steps land; an empty list is the goal.
var pending = map[string]string{}

// pkg is what the test reads of `go list -json`.
type pkg struct {
	ImportPath string
	Imports    []string
	Module     *struct{ Path string }
}

// listModule lists the module's packages, by their path inside the module, with their
// imports of other packages of the module (test files' imports are not listed: a
// test may import what it tests with).
func listModule(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,Module", "./...")
	cmd.Dir = "../.." // the module root, from internal/archtest
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 || pkgs[0].Module == nil {
		t.Fatal("go list listed no package of a module")
	}
	prefix := pkgs[0].Module.Path + "/"
	ours := map[string]bool{}
	for _, p := range pkgs {
		ours[p.ImportPath] = true
	}
	graph := map[string][]string{}
	for _, p := range pkgs {
		from := strings.TrimPrefix(p.ImportPath, prefix)
		graph[from] = []string{}
		for _, imp := range p.Imports {
			if ours[imp] {
				graph[from] = append(graph[from], strings.TrimPrefix(imp, prefix))
			}
		}
	}
	return graph
}

// place is the layer of a package (0: the table does not place it).
func place(path string) layer {
	best, found := -1, layer(0)
	for _, e := range table {
		dir, tree := strings.CutSuffix(e.path, "/...")
		if path == dir || (tree && strings.HasPrefix(path, dir+"/")) {
			if len(dir) > best {
				best, found = len(dir), e.layer
			}
		}
	}
	return found
}

// TestImportRules checks every import of every package of the module against the table
// and the rules (docs/ARCHITECTURE.md, "Layout").
func TestImportRules(t *testing.T) {
	graph := listModule(t)
	froms := make([]string, 0, len(graph))
	for from := range graph {
		froms = append(froms, from)
	}
	sort.Strings(froms)
	seen := map[string]bool{} // the pending entries that still happen

	t.Run("every package is placed", func(t *testing.T) {
		var tolerated []string
		for _, from := range froms {
			if place(from) != 0 {
				continue
			}
			if step, ok := pending[from]; ok {
				seen[from] = true
				tolerated = append(tolerated, from+": "+step)
				continue
			}
			t.Errorf("%s is in no layer of archtest's table: place it (docs/ARCHITECTURE.md, \"Layout\")", from)
		}
		if len(tolerated) > 0 && !t.Failed() {
			t.Skipf("pending:\n%s", strings.Join(tolerated, "\n"))
		}
	})

	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			var tolerated []string
			for _, from := range froms {
				lf := place(from)
				for _, to := range graph[from] {
					lt := place(to)
					if lf == 0 || lt == 0 {
						continue // reported by "every package is placed"
					}
					why := r.broken(from, to, lf, lt)
					if why == "" {
						continue
					}
					edge := from + " -> " + to
					if step, ok := pending[edge]; ok {
						seen[edge] = true
						tolerated = append(tolerated, edge+": "+step)
						continue
					}
					t.Errorf("%s: %s", edge, why)
				}
			}
			if len(tolerated) > 0 && !t.Failed() {
				t.Skipf("pending:\n%s", strings.Join(tolerated, "\n"))
			}
		})
	}

	t.Run("no pending entry is stale", func(t *testing.T) {
		for entry, step := range pending {
			if !seen[entry] {
				t.Errorf("pending %q (%s) no longer happens: delete it from archtest's pending", entry, step)
			}
		}
	})
}

// The rules must refuse what the layout forbids, or the test above passes on anything.
func TestRulesRefuse(t *testing.T) {
	broken := func(from, to string) []string {
		var names []string
		for _, r := range rules {
			if r.broken(from, to, place(from), place(to)) != "" {
				names = append(names, r.name)
			}
		}
		return names
	}
	for _, tc := range []struct {
		from, to string
		ok       bool
	}{
		{"internal/quota", "internal/httpapi", false},
		{"internal/tenants", "internal/rls", false},
		{"internal/billing", "internal/console", false},
		{"internal/quota", "internal/checks", false},
		{"internal/tenants", "internal/checks", false},
		{"internal/tenants", "internal/quota", false},
		{"internal/quota", "internal/ledger", false},
		{"internal/httpapi", "internal/quota", false},
		{"internal/rls", "internal/quota", false},
		{"internal/vocab", "internal/platform/redact", false},
		{"internal/platform/pgdb", "internal/tenants", false},
		{"internal/platform/problem", "internal/billing", false},
		{"internal/config", "internal/rls", false},
		{"internal/billing", "internal/readmetest", false},
		{"internal/httpapi", "cmd/api", false},
		{"cmd/api", "internal/httpapi", true},
		{"cmd/loadgen", "internal/loadgen", true},
		{"internal/httpapi", "internal/checks", true},
		{"internal/httpapi", "internal/console", true},
		{"internal/console", "internal/platform/problem", true},
		{"internal/rls", "internal/checks", true},
		{"internal/checks", "internal/quota", true},
		{"internal/checks", "internal/tenants", true},
		{"internal/ledger", "internal/quota", true},
		{"internal/webhooks", "internal/tenants", true},
		{"internal/quota", "internal/vocab", true},
		{"internal/vocab", "internal/derrors", true},
		{"internal/faulttest", "internal/platform/testenv", true},
		{"internal/loadgen", "internal/httpapi/api", true},
	} {
		got := broken(tc.from, tc.to)
		if (len(got) == 0) != tc.ok {
			t.Errorf("%s -> %s: rules broken %q, want ok=%v", tc.from, tc.to, got, tc.ok)
		}
	}
	for _, p := range []string{"internal/newthing", "internal/httpapi/problem", "cmdx"} {
		if l := place(p); l != 0 {
			t.Errorf("%s is placed in %s; want unplaced", p, l)
		}
	}
}
