package k8s_test

import (
	"bytes"
	"os"
	"reflect"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"sigs.k8s.io/yaml"
)

const (
	rulesFile          = "../prometheus/quotaplane.rules.yml"
	prometheusRuleFile = "prometheusrule.yaml"
	// updateRules, set to 1, makes TestPrometheusRuleIsTheRulesFile write the file
	// (make generate does).
	updateRules = "QUOTAPLANE_UPDATE_RULES"
)

// prometheusRule is the PrometheusRule of the rules file: its groups, indented under
// spec, as text, so comments and block scalars stay as they are.
func prometheusRule(rules []byte) []byte {
	var b bytes.Buffer
	b.WriteString(`# Generated from deploy/prometheus/quotaplane.rules.yml by make generate: edit that
# file, not this one (TestPrometheusRuleIsTheRulesFile fails when they differ). For the
# Prometheus Operator: add the label your Prometheus selects rules by in your overlay
# (kube-prometheus-stack: release: <its release name>), as for the ServiceMonitor.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: quotaplane
  labels:
    app.kubernetes.io/name: quotaplane
spec:
`)
	for line := range bytes.Lines(rules) {
		if len(bytes.TrimSpace(line)) == 0 {
			b.WriteString("\n")
			continue
		}
		b.WriteString("  ")
		b.Write(line)
	}
	return b.Bytes()
}

// TestPrometheusRuleIsTheRulesFile: deploy/k8s's PrometheusRule is the text of the
// rules file that promtool tests, not a copy converted by hand, and it decodes into
// the same groups, rule for rule.
func TestPrometheusRuleIsTheRulesFile(t *testing.T) {
	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	want := prometheusRule(rules)
	if os.Getenv(updateRules) == "1" {
		if err := os.WriteFile(prometheusRuleFile, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(prometheusRuleFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from %s: run make generate and commit", prometheusRuleFile, rulesFile)
	}
	var spec monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(rules, &spec); err != nil {
		t.Fatalf("%s as a PrometheusRule spec: %v", rulesFile, err)
	}
	m := mustLoad(t, prometheusRuleFile)
	if len(m.rules) != 1 {
		t.Fatalf("%d PrometheusRules in %s", len(m.rules), prometheusRuleFile)
	}
	if !reflect.DeepEqual(m.rules[0].Spec, spec) {
		t.Error("the PrometheusRule's groups differ from the rules file's")
	}
	n := 0
	for _, g := range spec.Groups {
		n += len(g.Rules)
	}
	if n < 20 {
		t.Errorf("%d rules: the rules file did not decode whole", n)
	}
}
