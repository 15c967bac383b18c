// Package deploy_test checks what deploy/ hands to operators against the code: every
// metric that a Grafana dashboard query or a Prometheus rule names is one the real
// quotaplane-api and quotaplane-worker export (or a recording rule of
// deploy/prometheus, or `up`, which Prometheus writes per target), every alert links to its docs/RUNBOOK.md section, and every alert
// has promtool cases that fire and that stay quiet.
package deploy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// exportedOnlySometimes are families the binaries declare but export only in
// circumstances this test does not create; each must still be declared in the Go
// source (checked), so a typo in a query cannot hide behind this list.
var exportedOnlySometimes = map[string]string{
	"quotaplane_redis_resends_total":   "only on a Redis Cluster (make test-cluster)",
	"quotaplane_cache_evictions_total": "only once a cache is over its size bound",
	"quotaplane_capacity_draws_total":  "only once a check draws on a capacity (an operator's, or an org limit marked fair_share)",
	"quotaplane_capacity_used_units":   "only once a check draws on a capacity",
	"quotaplane_capacity_limit_units":  "only once a check draws on a capacity",
	// internal/httpapi TestOrgBoundsOverHTTP reads it
	"quotaplane_org_bound_refusals_total": "only once an org reaches one of its bounds on the shared Redis",
}

// fromPrometheus are series Prometheus itself writes for every scrape target, which
// the binaries cannot export: the down alerts select them.
var fromPrometheus = []string{"up"}

// redisDB is the Redis database of the binaries under test (the README test uses 15).
const redisDB = 14

// TestMain removes the binaries testenv.StartStack builds.
func TestMain(m *testing.M) { testenv.Main(m) }

// TestQueriesNameExportedMetrics: every metric named by a dashboard query or a rule
// expression is exported by the real binaries after some traffic, or is a recording
// rule.
func TestQueriesNameExportedMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	root := testenv.RepoRoot(t)
	rules := loadRules(t, root)
	queries := append(dashboardQueries(t, root), rules.exprs...)
	if len(queries) < 20 {
		t.Fatalf("found %d queries in deploy/, want the dashboard's and the rules'", len(queries))
	}
	known := exportedMetrics(t)
	for _, r := range rules.records {
		known[r] = true
	}
	for _, name := range fromPrometheus {
		known[name] = true
	}
	for name, why := range exportedOnlySometimes {
		if !declaredInSource(t, root, name) {
			t.Errorf("%s is listed as exported %s, but no Go file declares it", name, why)
		}
		known[name] = true
	}
	for _, problem := range unknownMetrics(queries, known) {
		t.Error(problem)
	}
}

// TestUnknownMetricIsReported: the comparison itself catches a misspelt metric, a
// bad expression, and a metric named only through __name__.
func TestUnknownMetricIsReported(t *testing.T) {
	known := map[string]bool{"quotaplane_checks_total": true, "quotaplane_check_duration_seconds_bucket": true}
	tests := []struct {
		name, expr string
		want       int
	}{
		{"known", `sum(rate(quotaplane_checks_total[$__rate_interval]))`, 0},
		{"known histogram", `histogram_quantile(0.99, sum by (le) (rate(quotaplane_check_duration_seconds_bucket[5m])))`, 0},
		{"typo", `sum(rate(quotaplane_check_total[5m]))`, 1},
		{"typo in a __name__ matcher", `{__name__="quotaplane_checks_totl"}`, 1},
		{"bad expression", `sum(rate(quotaplane_checks_total[5m])`, 1},
	}
	for _, tt := range tests {
		got := unknownMetrics([]query{{where: tt.name, expr: tt.expr}}, known)
		if len(got) != tt.want {
			t.Errorf("%s: %q: problems %q, want %d", tt.name, tt.expr, got, tt.want)
		}
	}
}

// TestAlertsHaveRunbookAndTests: each alert has a summary and a runbook_url that
// points to an existing section of docs/RUNBOOK.md, and promtool cases where it fires
// and where it stays quiet.
func TestAlertsHaveRunbookAndTests(t *testing.T) {
	root := testenv.RepoRoot(t)
	rules := loadRules(t, root)
	if len(rules.alerts) == 0 {
		t.Fatal("no alerts in deploy/prometheus")
	}
	runbook, err := os.ReadFile(filepath.Join(root, "docs", "RUNBOOK.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^## (.+)$`).FindAllStringSubmatch(string(runbook), -1) {
		anchors[githubAnchor(m[1])] = true
	}
	fires, quiet := promtoolCases(t, root)
	const prefix = "https://github.com/quotaplane/quotaplane/blob/main/docs/RUNBOOK.md#"
	for _, a := range rules.alerts {
		if a.Annotations["summary"] == "" {
			t.Errorf("alert %s has no summary", a.Alert)
		}
		u := a.Annotations["runbook_url"]
		if anchor, ok := strings.CutPrefix(u, prefix); !ok || !anchors[anchor] {
			t.Errorf("alert %s: runbook_url %q is not %s<a section of docs/RUNBOOK.md>", a.Alert, u, prefix)
		}
		if !fires[a.Alert] {
			t.Errorf("alert %s: no promtool case where it fires (deploy/prometheus/tests)", a.Alert)
		}
		if !quiet[a.Alert] {
			t.Errorf("alert %s: no promtool case where it stays quiet (deploy/prometheus/tests)", a.Alert)
		}
	}
}

type query struct{ where, expr string }

type rule struct {
	Record      string            `yaml:"record"`
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	Annotations map[string]string `yaml:"annotations"`
}

type rules struct {
	exprs   []query
	records []string
	alerts  []rule
}

func loadRules(t *testing.T, root string) rules {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "deploy", "prometheus", "*.rules.yml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no deploy/prometheus/*.rules.yml: %v", err)
	}
	var out rules
	for _, f := range files {
		var doc struct {
			Groups []struct {
				Name  string `yaml:"name"`
				Rules []rule `yaml:"rules"`
			} `yaml:"groups"`
		}
		readYAML(t, f, &doc)
		for _, g := range doc.Groups {
			for _, r := range g.Rules {
				name := r.Record + r.Alert
				out.exprs = append(out.exprs, query{where: fmt.Sprintf("%s: %s", rel(root, f), name), expr: r.Expr})
				if r.Record != "" {
					out.records = append(out.records, r.Record)
				} else {
					out.alerts = append(out.alerts, r)
				}
			}
		}
	}
	return out
}

// promtoolCases returns the alerts that some promtool case expects to fire, and
// those that some case expects quiet (exp_alerts empty).
func promtoolCases(t *testing.T, root string) (fires, quiet map[string]bool) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "deploy", "prometheus", "tests", "*.yml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no deploy/prometheus/tests/*.yml: %v", err)
	}
	fires, quiet = map[string]bool{}, map[string]bool{}
	for _, f := range files {
		var doc struct {
			Tests []struct {
				AlertRuleTest []struct {
					Alertname string `yaml:"alertname"`
					ExpAlerts []any  `yaml:"exp_alerts"`
				} `yaml:"alert_rule_test"`
			} `yaml:"tests"`
		}
		readYAML(t, f, &doc)
		for _, tc := range doc.Tests {
			for _, c := range tc.AlertRuleTest {
				if len(c.ExpAlerts) > 0 {
					fires[c.Alertname] = true
				} else {
					quiet[c.Alertname] = true
				}
			}
		}
	}
	return fires, quiet
}

// dashboardQueries returns the expr of every target of every panel (rows' panels
// included) of every deploy/grafana/*.json.
func dashboardQueries(t *testing.T, root string) []query {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "deploy", "grafana", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no deploy/grafana/*.json: %v", err)
	}
	var out []query
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var dash any
		if err := json.Unmarshal(b, &dash); err != nil {
			t.Fatalf("%s: %v", rel(root, f), err)
		}
		var walk func(v any, title string)
		walk = func(v any, title string) {
			switch v := v.(type) {
			case map[string]any:
				if s, ok := v["title"].(string); ok {
					title = s
				}
				if e, ok := v["expr"].(string); ok {
					out = append(out, query{where: fmt.Sprintf("%s: panel %q", rel(root, f), title), expr: e})
				}
				for _, c := range v {
					walk(c, title)
				}
			case []any:
				for _, c := range v {
					walk(c, title)
				}
			}
		}
		walk(dash, "")
	}
	return out
}

// grafanaVars are Grafana's interval variables, replaced by a duration to parse.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "${__rate_interval}", "5m", "$__interval", "1m", "$__range", "1h")

// unknownMetrics parses each query and returns a problem for each metric name it
// selects that known does not hold, and for each query that does not parse.
func unknownMetrics(queries []query, known map[string]bool) []string {
	var problems []string
	for _, q := range queries {
		expr, err := parser.ParseExpr(grafanaVars.Replace(q.expr))
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %q does not parse: %v", q.where, q.expr, err))
			continue
		}
		parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
			vs, ok := n.(*parser.VectorSelector)
			if !ok {
				return nil
			}
			// The parser turns a selector's name into a __name__ matcher too.
			names := map[string]bool{vs.Name: true}
			for _, m := range vs.LabelMatchers {
				if m.Name == model.MetricNameLabel {
					names[m.Value] = true
				}
			}
			for name := range names {
				if name != "" && !known[name] {
					problems = append(problems, fmt.Sprintf("%s: %q names %s, which the api and the worker do not export and no recording rule defines", q.where, q.expr, name))
				}
			}
			return nil
		})
	}
	return problems
}

// exportedMetrics runs the real binaries on a fresh database (testenv.StartStack: the
// demo org seeded as `make run` does, Redis database redisDB), makes checks so that
// labelled families have series, waits for a usage flush, and returns every sample
// name both /metrics serve (a histogram gives _bucket, _sum and _count).
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	st := testenv.StartStack(t, testenv.StackOptions{RedisDB: redisDB})
	apiAddr, workerAddr, key := st.APIAddr, st.WorkerAddr, st.DemoKey

	// An allowed check, a denied one (429: above the org's month limit) and a batch.
	for _, body := range []string{`{"org":"demo","team":"eng","user":"alice"}`, `{"org":"demo","team":"eng","user":"alice","cost":100000}`} {
		post(t, "http://"+apiAddr+"/v1/check", key, body)
	}
	post(t, "http://"+apiAddr+"/v1/check/batch", key, `{"checks":[{"org":"demo","team":"sales","user":"bob"}]}`)

	names := map[string]bool{}
	// The worker's month utilization appears once a flush has read the checked
	// counters, its River jobs once the first heartbeat job is in River's table.
	waitFor(t, "the worker to flush the checks' usage and run a job", st, func() bool {
		clear(names)
		scrape(t, "http://"+workerAddr+"/metrics", names)
		return names["quotaplane_worker_month_utilization_ratio"] && names["quotaplane_worker_jobs"]
	})
	scrape(t, "http://"+st.MetricsAddr+"/metrics", names)
	for _, must := range []string{"quotaplane_checks_total", "quotaplane_worker_flush_lag_seconds", "go_goroutines"} {
		if !names[must] {
			t.Fatalf("%s is not among the exported metrics: the scrape went wrong (%d names)", must, len(names))
		}
	}
	return names
}

// scrape adds the sample names of the text exposition at u to names.
func scrape(t *testing.T, u string, names map[string]bool) {
	t.Helper()
	res, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		t.Fatalf("parse %s: %v", u, err)
	}
	for name, mf := range families {
		names[name] = true
		switch mf.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			names[name+"_sum"], names[name+"_count"] = true, true
		}
	}
}

func post(t *testing.T, u, key, body string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK && res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("POST %s %s = %d %s", u, body, res.StatusCode, b)
	}
}

func waitFor(t *testing.T, what string, st *testenv.Stack, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; logs:\n%s", what, st.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// declaredInSource reports whether a non-test Go file under internal/ or cmd/ has
// name as a string literal.
func declaredInSource(t *testing.T, root, name string) bool {
	t.Helper()
	found := false
	for _, dir := range []string{"internal", "cmd"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d os.DirEntry, err error) error {
			if err != nil || found || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return err
			}
			b, err := os.ReadFile(p)
			if err == nil && strings.Contains(string(b), strconv.Quote(name)) {
				found = true
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return found
}

// githubAnchor is the anchor GitHub gives a Markdown heading.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func rel(root, p string) string {
	r, err := filepath.Rel(root, p)
	if err != nil {
		return p
	}
	return r
}
