package k8s_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// kinds are the API types a manifest may be, by apiVersion and kind. Anything else,
// a misspelled kind or an apiVersion the cluster no longer serves, is refused.
var kinds = map[string]func() any{
	"apps/v1 Deployment":                      func() any { return new(appsv1.Deployment) },
	"v1 Service":                              func() any { return new(corev1.Service) },
	"v1 Secret":                               func() any { return new(corev1.Secret) },
	"policy/v1 PodDisruptionBudget":           func() any { return new(policyv1.PodDisruptionBudget) },
	"autoscaling/v2 HorizontalPodAutoscaler":  func() any { return new(autoscalingv2.HorizontalPodAutoscaler) },
	"monitoring.coreos.com/v1 ServiceMonitor": func() any { return new(monitoringv1.ServiceMonitor) },
	"monitoring.coreos.com/v1 PrometheusRule": func() any { return new(monitoringv1.PrometheusRule) },
	"networking.k8s.io/v1 NetworkPolicy":      func() any { return new(networkingv1.NetworkPolicy) },
}

// decode reads one YAML document into its API type the way the API server's strict
// field validation does: YAML with a repeated key is refused, then the JSON is
// decoded case-sensitively with unknown and duplicate fields refused
// (sigs.k8s.io/json, what apimachinery's strict serializer uses).
func decode(doc []byte) (any, error) {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, err
	}
	var tm metav1.TypeMeta
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(js, &tm); err != nil {
		return nil, err
	}
	newObj, ok := kinds[tm.APIVersion+" "+tm.Kind]
	if !ok {
		return nil, fmt.Errorf("unknown apiVersion/kind %q %q", tm.APIVersion, tm.Kind)
	}
	obj := newObj()
	strict, err := sigsjson.UnmarshalStrict(js, obj)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	if len(strict) > 0 {
		return nil, fmt.Errorf("%s: %w", tm.Kind, errors.Join(strict...))
	}
	return obj, nil
}

// documents splits a multi-document YAML file.
func documents(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(stripComments(doc))) > 0 {
			docs = append(docs, doc)
		}
	}
}

func stripComments(doc []byte) []byte {
	var out []byte
	for line := range bytes.Lines(doc) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line...)
		}
	}
	return out
}

// manifests are the decoded objects of one set of files.
type manifests struct {
	deployments []*appsv1.Deployment
	services    []*corev1.Service
	secrets     []*corev1.Secret
	pdbs        []*policyv1.PodDisruptionBudget
	hpas        []*autoscalingv2.HorizontalPodAutoscaler
	monitors    []*monitoringv1.ServiceMonitor
	rules       []*monitoringv1.PrometheusRule
	policies    []*networkingv1.NetworkPolicy
}

func (m *manifests) add(obj any) {
	switch o := obj.(type) {
	case *appsv1.Deployment:
		m.deployments = append(m.deployments, o)
	case *networkingv1.NetworkPolicy:
		m.policies = append(m.policies, o)
	case *corev1.Service:
		m.services = append(m.services, o)
	case *corev1.Secret:
		m.secrets = append(m.secrets, o)
	case *policyv1.PodDisruptionBudget:
		m.pdbs = append(m.pdbs, o)
	case *autoscalingv2.HorizontalPodAutoscaler:
		m.hpas = append(m.hpas, o)
	case *monitoringv1.ServiceMonitor:
		m.monitors = append(m.monitors, o)
	case *monitoringv1.PrometheusRule:
		m.rules = append(m.rules, o)
	}
}

func (m *manifests) deployment(t *testing.T, name string) *appsv1.Deployment {
	t.Helper()
	for _, d := range m.deployments {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("no Deployment %q", name)
	return nil
}

// mustLoad decodes every document of the files, failing the test on any error.
func mustLoad(t *testing.T, files ...string) *manifests {
	t.Helper()
	m := &manifests{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs, err := documents(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if len(docs) == 0 {
			t.Fatalf("%s: no document", f)
		}
		for i, doc := range docs {
			obj, err := decode(doc)
			if err != nil {
				t.Fatalf("%s, document %d: %v", f, i+1, err)
			}
			m.add(obj)
		}
	}
	return m
}

// kustomization is the part of kustomization.yaml this directory uses. It is not a
// Kubernetes API type, and kustomize's own types would compile kustomize's embedded
// OpenAPI documents into this test; TestKustomizeBuild runs the real kustomize.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	// Set when an operator applies this directory itself (docs/DEPLOY.md).
	Namespace string `json:"namespace,omitempty"`
	Images    []any  `json:"images,omitempty"`
}

const exampleSecret = "secret.example.yaml"

func readKustomization(t *testing.T) kustomization {
	t.Helper()
	data, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	return k
}

// applied are the objects kubectl apply -k creates: the kustomization's resources.
func applied(t *testing.T) *manifests {
	t.Helper()
	return mustLoad(t, readKustomization(t).Resources...)
}

// TestKustomizationListsEveryManifest: every YAML file here is either applied or the
// Secret example, which is never applied (it would set placeholder credentials).
func TestKustomizationListsEveryManifest(t *testing.T) {
	k := readKustomization(t)
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("kustomization.yaml is %s %s", k.APIVersion, k.Kind)
	}
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, f := range files {
		if f != "kustomization.yaml" && f != exampleSecret {
			want = append(want, f)
		}
	}
	got := slices.Sorted(slices.Values(k.Resources))
	if !slices.Equal(got, want) {
		t.Errorf("kustomization resources = %v, want every manifest but %s: %v", got, exampleSecret, want)
	}
	if slices.Contains(k.Resources, exampleSecret) {
		t.Errorf("the kustomization applies %s", exampleSecret)
	}
	m := mustLoad(t, k.Resources...)
	if len(m.secrets) > 0 {
		t.Errorf("the kustomization applies a Secret: credentials do not belong in the repository")
	}
	// One image name, no registry or tag: an overlay's images entry sets them all.
	for _, d := range m.deployments {
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.Image != imageName {
				t.Errorf("%s/%s: image %q, want %q, the name docs/DEPLOY.md's overlay sets", d.Name, c.Name, c.Image, imageName)
			}
		}
	}
}

const imageName = "quotaplane"

// TestEveryManifestDecodesStrictly decodes every document of every YAML file here,
// the Secret example included.
func TestEveryManifestDecodesStrictly(t *testing.T) {
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var manifestFiles []string
	for _, f := range files {
		if f != "kustomization.yaml" {
			manifestFiles = append(manifestFiles, f)
		}
	}
	m := mustLoad(t, manifestFiles...)
	for name, n := range map[string]int{"Deployment": len(m.deployments), "Service": len(m.services),
		"PodDisruptionBudget": len(m.pdbs), "HorizontalPodAutoscaler": len(m.hpas),
		"ServiceMonitor": len(m.monitors), "PrometheusRule": len(m.rules), "Secret": len(m.secrets)} {
		if n == 0 {
			t.Errorf("no %s among %v", name, manifestFiles)
		}
	}
}

// TestTyposAreRefused shows that the decode refuses what the API server's strict
// field validation refuses: each case edits one line of api.yaml or
// servicemonitor.yaml, and the edited file must fail, naming what is wrong.
func TestTyposAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name, file, from, to, want string
	}{
		{"misspelled field", "api.yaml", "readinessProbe:", "readinesProbe:", `unknown field "spec.template.spec.containers[0].readinesProbe"`},
		{"field in the wrong case", "api.yaml", "containerPort: 8080", "containerport: 8080", `unknown field "spec.template.spec.containers[0].ports[0].containerport"`},
		{"field at the wrong level", "api.yaml", "    type: RollingUpdate\n", "    type: RollingUpdate\n    maxSurge: 1\n", `unknown field "spec.strategy.maxSurge"`},
		{"repeated key", "api.yaml", "          periodSeconds: 5\n            failureThreshold: 24", "          periodSeconds: 5\n            periodSeconds: 24", `"periodSeconds" already set`},
		{"misspelled kind", "api.yaml", "kind: HorizontalPodAutoscaler", "kind: HorizontalPodAutoScaler", `unknown apiVersion/kind "autoscaling/v2" "HorizontalPodAutoScaler"`},
		{"misspelled ServiceMonitor field", "servicemonitor.yaml", "      interval: 15s", "      intervall: 15s", `unknown field "spec.endpoints[0].intervall"`},
		{"wrong type", "api.yaml", "maxReplicas: 6", "maxReplicas: six", "maxReplicas"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := os.ReadFile(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(data, []byte(tc.from)) {
				t.Fatalf("%s no longer contains %q: update the case", tc.file, tc.from)
			}
			docs, err := documents(bytes.Replace(data, []byte(tc.from), []byte(tc.to), 1))
			if err != nil {
				t.Fatal(err)
			}
			var errs []error
			for _, doc := range docs {
				if _, err := decode(doc); err != nil {
					errs = append(errs, err)
				}
			}
			if len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.want) {
				t.Errorf("errors = %v, want one naming %s", errs, tc.want)
			}
		})
	}
}
