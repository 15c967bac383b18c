package k8s_test

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// runtimeEnv are variables the Go runtime reads rather than internal/config.
var runtimeEnv = map[string]bool{"GOMEMLIMIT": true, "GOGC": true}

// otelEnv are the OpenTelemetry variables internal/platform/tracing hands to the SDK
// and its OTLP exporter (docs/TRACING.md): both binaries read them, config does not.
var otelEnv = map[string]bool{"OTEL_EXPORTER_OTLP_ENDPOINT": true, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": true,
	"OTEL_EXPORTER_OTLP_PROTOCOL": true, "OTEL_EXPORTER_OTLP_HEADERS": true, "OTEL_TRACES_SAMPLER": true,
	"OTEL_TRACES_SAMPLER_ARG": true, "OTEL_SERVICE_NAME": true, "OTEL_RESOURCE_ATTRIBUTES": true}

// secretEnv must come from a Secret, never from a value in a manifest.
var secretEnv = []string{"DATABASE_URL", "REDIS_URL", "QUOTA_ADMIN_TOKEN", "QUOTA_WEBHOOK_SECRET"}

// sharedEnv must be the same for the api and the worker (docs/CONFIGURATION.md;
// docs/SCALING.md): the worker reads counters where the api counts them, and the api
// shows the signing secret the worker signs with.
var sharedEnv = []string{"DATABASE_URL", "REDIS_URL", "REDIS_CLUSTER", "QUOTA_REDIS_POOLS", "QUOTA_REDIS_PREFIX", "QUOTA_WEBHOOK_SECRET", "OTEL_EXPORTER_OTLP_ENDPOINT"}

func selector(t *testing.T, what string, ls *metav1.LabelSelector) labels.Selector {
	t.Helper()
	if ls == nil || (len(ls.MatchLabels) == 0 && len(ls.MatchExpressions) == 0) {
		t.Fatalf("%s: empty selector (it would select everything)", what)
	}
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return sel
}

// podsOf are the Deployments whose pods sel selects.
func podsOf(m *manifests, sel labels.Selector) []*appsv1.Deployment {
	var out []*appsv1.Deployment
	for _, d := range m.deployments {
		if sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			out = append(out, d)
		}
	}
	return out
}

// binaryOf is what the container runs: its command, or the image's entrypoint.
func binaryOf(t *testing.T, s *source, d *appsv1.Deployment, c corev1.Container) *binary {
	t.Helper()
	path := s.entrypoint
	if len(c.Command) > 0 {
		path = c.Command[0]
	}
	b := s.binaries[path]
	if b == nil {
		t.Fatalf("%s/%s runs %q, not a binary the Dockerfile installs", d.Name, c.Name, path)
	}
	return b
}

func envValue(c corev1.Container, name string) (corev1.EnvVar, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e, true
		}
	}
	return corev1.EnvVar{}, false
}

// metricsPort is the port of the api's QUOTA_METRICS_ADDR in c, where it serves
// /metrics and nothing else.
func metricsPort(c corev1.Container) (int32, bool) {
	e, ok := envValue(c, "QUOTA_METRICS_ADDR")
	if !ok {
		return 0, false
	}
	_, p, err := net.SplitHostPort(e.Value)
	n, err2 := strconv.ParseInt(p, 10, 32)
	return int32(n), err == nil && err2 == nil
}

// containerPort resolves a probe's or a Service's port (a name or a number) on c.
func containerPort(c corev1.Container, p intstr.IntOrString) (int32, bool) {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

// listenPort is the port of the container's address variable, which must listen
// beyond loopback: the kubelet and the Services reach the pod on its IP.
func listenPort(t *testing.T, d *appsv1.Deployment, c corev1.Container, b *binary) int32 {
	t.Helper()
	e, ok := envValue(c, b.addrVar)
	if !ok || e.ValueFrom != nil {
		t.Fatalf("%s/%s: %s is not set to a value (its default listens on 127.0.0.1, which no probe reaches)", d.Name, c.Name, b.addrVar)
	}
	host, port, err := net.SplitHostPort(e.Value)
	if err != nil {
		t.Fatalf("%s/%s: %s=%q: %v", d.Name, c.Name, b.addrVar, e.Value, err)
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		t.Errorf("%s/%s: %s=%q listens on loopback only: probes and Services cannot reach it", d.Name, c.Name, b.addrVar, e.Value)
	}
	n, err := strconv.ParseInt(port, 10, 32)
	if err != nil {
		t.Fatalf("%s/%s: %s=%q: %v", d.Name, c.Name, b.addrVar, e.Value, err)
	}
	return int32(n)
}

// TestProbesAndPorts: every probe is an HTTP GET of a path the container's binary
// serves without credentials, on the port of its address variable; the api is ready
// on /readyz and alive on /healthz; every declared port is one the binary listens on
// (the api's QUOTA_GRPC_ADDR too).
func TestProbesAndPorts(t *testing.T) {
	s, m := readSource(t), applied(t)
	for _, d := range m.deployments {
		for _, c := range d.Spec.Template.Spec.Containers {
			b := binaryOf(t, s, d, c)
			port := listenPort(t, d, c, b)
			if len(c.Ports) == 0 {
				t.Errorf("%s/%s declares no port", d.Name, c.Name)
			}
			// The api's other listeners: Envoy's rate limit service over gRPC, and
			// /metrics.
			listens := map[int32]bool{port: true}
			for _, e := range c.Env {
				if _, p, err := net.SplitHostPort(e.Value); (e.Name == "QUOTA_GRPC_ADDR" || e.Name == "QUOTA_METRICS_ADDR") && err == nil {
					n, _ := strconv.ParseInt(p, 10, 32)
					listens[int32(n)] = true
				}
			}
			for _, cp := range c.Ports {
				if !listens[cp.ContainerPort] {
					t.Errorf("%s/%s: port %s is %d, but %s listens on %d", d.Name, c.Name, cp.Name, cp.ContainerPort, b.addrVar, port)
				}
				if errs := validation.IsValidPortName(cp.Name); len(errs) > 0 {
					t.Errorf("%s/%s: port name %q: %v", d.Name, c.Name, cp.Name, errs)
				}
			}
			probes := map[string]*corev1.Probe{"startupProbe": c.StartupProbe, "livenessProbe": c.LivenessProbe, "readinessProbe": c.ReadinessProbe}
			for _, kind := range []string{"startupProbe", "livenessProbe"} {
				if probes[kind] == nil {
					t.Errorf("%s/%s has no %s", d.Name, c.Name, kind)
				}
			}
			for kind, p := range probes {
				if p == nil {
					continue
				}
				if p.HTTPGet == nil {
					t.Errorf("%s/%s %s is not an HTTP GET", d.Name, c.Name, kind)
					continue
				}
				if !b.paths[p.HTTPGet.Path] || !b.open[p.HTTPGet.Path] {
					t.Errorf("%s/%s %s: GET %s is not a path %s serves without credentials (%v)", d.Name, c.Name, kind, p.HTTPGet.Path, b.name, keys(b.open))
				}
				if got, ok := containerPort(c, p.HTTPGet.Port); !ok || got != port {
					t.Errorf("%s/%s %s: port %s is not %s's port %d", d.Name, c.Name, kind, p.HTTPGet.Port.String(), b.addrVar, port)
				}
			}
			if b.name == "quotaplane-api" {
				if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
					t.Errorf("%s/%s: readiness is not GET /readyz (Postgres and Redis reachable)", d.Name, c.Name)
				}
				if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path != "/healthz" {
					t.Errorf("%s/%s: liveness is %s, not /healthz: a liveness probe on dependencies restarts every pod when Postgres is down", d.Name, c.Name, c.LivenessProbe.HTTPGet.Path)
				}
			}
		}
	}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestProbeTimings: the startup probe waits longer than the binary waits for Postgres
// (QUOTA_STARTUP_TIMEOUT: /healthz answers only after), and a readiness probe
// tolerates a shared dependency's outage as long as the fault tests measure one
// (TestPostgresStoppedFor30s): /readyz fails on every replica at once, and a Service
// without ready pods refuses the checks the api would still answer from its cache.
func TestProbeTimings(t *testing.T) {
	s, m := readSource(t), applied(t)
	for _, d := range m.deployments {
		for _, c := range d.Spec.Template.Spec.Containers {
			startup, err := durationDefault(s.defaults["QUOTA_STARTUP_TIMEOUT"])
			if err != nil {
				t.Fatal(err)
			}
			if e, ok := envValue(c, "QUOTA_STARTUP_TIMEOUT"); ok {
				if startup, err = time.ParseDuration(e.Value); err != nil {
					t.Fatalf("%s/%s: QUOTA_STARTUP_TIMEOUT=%q: %v", d.Name, c.Name, e.Value, err)
				}
			}
			if p := c.StartupProbe; p != nil {
				if budget := time.Duration(p.PeriodSeconds*p.FailureThreshold) * time.Second; budget <= startup {
					t.Errorf("%s/%s: the startup probe gives up after %v, but the binary waits up to %v (QUOTA_STARTUP_TIMEOUT) for Postgres before it serves /healthz",
						d.Name, c.Name, budget, startup)
				}
			}
			if p := c.ReadinessProbe; p != nil {
				if tolerated := time.Duration(p.PeriodSeconds*p.FailureThreshold) * time.Second; tolerated < 30*time.Second {
					t.Errorf("%s/%s: a pod leaves the Service after %v of failed /readyz; a probe that times out on a busy node must not empty the Service", d.Name, c.Name, tolerated)
				}
			}
		}
	}
}

// TestSelectorsMatchLabels: each Deployment selects its own pods and no other's;
// Services, PodDisruptionBudgets, spread constraints and the HPA each reach one
// Deployment; Services' target ports exist on the pods they select; the
// ServiceMonitor scrapes every Service it selects on a port it has, at a path the
// binary behind it serves.
func TestSelectorsMatchLabels(t *testing.T) {
	s, m := readSource(t), applied(t)
	for _, d := range m.deployments {
		sel := selector(t, "Deployment "+d.Name, d.Spec.Selector)
		if got := podsOf(m, sel); len(got) != 1 || got[0] != d {
			t.Errorf("Deployment %s's selector %s selects the pods of %v", d.Name, sel, names(got))
		}
		for _, tsc := range d.Spec.Template.Spec.TopologySpreadConstraints {
			if got := podsOf(m, selector(t, d.Name+" topologySpreadConstraints", tsc.LabelSelector)); len(got) != 1 || got[0] != d {
				t.Errorf("Deployment %s spreads the pods of %v", d.Name, names(got))
			}
		}
		checkNames(t, "Deployment", d.ObjectMeta)
	}
	for _, svc := range m.services {
		checkNames(t, "Service", svc.ObjectMeta)
		ls := &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}
		ds := podsOf(m, selector(t, "Service "+svc.Name, ls))
		if len(ds) != 1 {
			t.Errorf("Service %s selects the pods of %v, want one Deployment's", svc.Name, names(ds))
			continue
		}
		for _, p := range svc.Spec.Ports {
			if !slices.ContainsFunc(ds[0].Spec.Template.Spec.Containers, func(c corev1.Container) bool { _, ok := containerPort(c, p.TargetPort); return ok }) {
				t.Errorf("Service %s port %s: targetPort %s is no port of %s's containers", svc.Name, p.Name, p.TargetPort.String(), ds[0].Name)
			}
		}
	}
	for _, pdb := range m.pdbs {
		checkNames(t, "PodDisruptionBudget", pdb.ObjectMeta)
		if ds := podsOf(m, selector(t, "PodDisruptionBudget "+pdb.Name, pdb.Spec.Selector)); len(ds) != 1 {
			t.Errorf("PodDisruptionBudget %s covers the pods of %v, want one Deployment's", pdb.Name, names(ds))
		}
	}
	for _, hpa := range m.hpas {
		checkNames(t, "HorizontalPodAutoscaler", hpa.ObjectMeta)
		ref := hpa.Spec.ScaleTargetRef
		if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || !slices.ContainsFunc(m.deployments, func(d *appsv1.Deployment) bool { return d.Name == ref.Name }) {
			t.Errorf("HorizontalPodAutoscaler %s scales %s %s %s, not one of these Deployments", hpa.Name, ref.APIVersion, ref.Kind, ref.Name)
		}
	}
	if len(m.monitors) == 0 {
		t.Fatal("no ServiceMonitor")
	}
	for _, sm := range m.monitors {
		checkServiceMonitor(t, s, m, sm)
	}
}

func checkServiceMonitor(t *testing.T, s *source, m *manifests, sm *monitoringv1.ServiceMonitor) {
	t.Helper()
	checkNames(t, "ServiceMonitor", sm.ObjectMeta)
	if len(sm.Spec.NamespaceSelector.MatchNames) > 0 || sm.Spec.NamespaceSelector.Any {
		t.Errorf("ServiceMonitor %s looks beyond its own namespace", sm.Name)
	}
	sel := selector(t, "ServiceMonitor "+sm.Name, &sm.Spec.Selector)
	used := map[int]bool{}
	for _, svc := range m.services {
		if !sel.Matches(labels.Set(svc.Labels)) {
			continue
		}
		scraped := false
		for i, ep := range sm.Spec.Endpoints {
			for _, p := range svc.Spec.Ports {
				if p.Name != ep.Port {
					continue
				}
				scraped, used[i] = true, true
				// The binary behind the Service's port must serve the path.
				for _, d := range podsOf(m, labels.SelectorFromSet(svc.Spec.Selector)) {
					for _, c := range d.Spec.Template.Spec.Containers {
						if _, ok := containerPort(c, p.TargetPort); !ok {
							continue
						}
						path := ep.Path
						if path == "" {
							path = "/metrics"
						}
						if mp, ok := metricsPort(c); ok {
							if got, _ := containerPort(c, p.TargetPort); got == mp {
								if path != "/metrics" {
									t.Errorf("ServiceMonitor %s scrapes %s on the api's metrics port, which serves only /metrics", sm.Name, path)
								}
								continue
							}
						}
						if b := binaryOf(t, s, d, c); !b.paths[path] || !b.open[path] {
							t.Errorf("ServiceMonitor %s scrapes %s on Service %s port %s, which %s does not serve without credentials", sm.Name, path, svc.Name, p.Name, b.name)
						}
					}
				}
			}
		}
		if !scraped {
			t.Errorf("ServiceMonitor %s selects Service %s but none of its endpoints names one of its ports", sm.Name, svc.Name)
		}
	}
	for i, ep := range sm.Spec.Endpoints {
		if !used[i] {
			t.Errorf("ServiceMonitor %s endpoint port %q is a port of no Service it selects", sm.Name, ep.Port)
		}
	}
}

func names(ds []*appsv1.Deployment) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Name)
	}
	return out
}

// checkNames: names and label values the API server would refuse.
func checkNames(t *testing.T, kind string, om metav1.ObjectMeta) {
	t.Helper()
	if errs := validation.IsDNS1035Label(om.Name); len(errs) > 0 {
		t.Errorf("%s %q: %v", kind, om.Name, errs)
	}
	for k, v := range om.Labels {
		if errs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(errs) > 0 {
			t.Errorf("%s %s label %s=%s: %v", kind, om.Name, k, v, errs)
		}
	}
}

// TestEnvironment: every variable a container sets is one its binary reads;
// credentials come from the Secret, whose example has every key the Deployments use
// and placeholders the binaries refuse; the api and the worker agree on what they
// share.
func TestEnvironment(t *testing.T) {
	s, m := readSource(t), applied(t)
	example := mustLoad(t, exampleSecret)
	if len(example.secrets) != 1 {
		t.Fatalf("%s holds %d Secrets, want 1", exampleSecret, len(example.secrets))
	}
	secret := example.secrets[0]
	usedKeys := map[string]bool{}
	shared := map[string]map[string]string{} // variable -> binary -> its source
	for _, d := range m.deployments {
		for _, c := range d.Spec.Template.Spec.Containers {
			b := binaryOf(t, s, d, c)
			seen := map[string]bool{}
			for _, e := range c.Env {
				if seen[e.Name] {
					t.Errorf("%s/%s sets %s twice", d.Name, c.Name, e.Name)
				}
				seen[e.Name] = true
				if !b.env[e.Name] && !runtimeEnv[e.Name] && !otelEnv[e.Name] {
					t.Errorf("%s/%s sets %s, which %s does not read (internal/config.%s reads %v)", d.Name, c.Name, e.Name, b.name, b.loader, keys(b.env))
				}
				src := "value " + strconv.Quote(e.Value)
				if ref := secretRef(e); ref != nil {
					src = "secret " + ref.Name + "/" + ref.Key
					if ref.Name != secret.Name {
						t.Errorf("%s/%s %s: from Secret %q, not %q (%s)", d.Name, c.Name, e.Name, ref.Name, secret.Name, exampleSecret)
					} else if _, ok := secret.StringData[ref.Key]; !ok {
						t.Errorf("%s/%s %s: key %q is not in %s", d.Name, c.Name, e.Name, ref.Key, exampleSecret)
					}
					usedKeys[ref.Key] = true
				} else if e.ValueFrom != nil {
					src = "valueFrom " + e.ValueFrom.String()
				}
				if slices.Contains(secretEnv, e.Name) && secretRef(e) == nil {
					t.Errorf("%s/%s: %s is not from a Secret", d.Name, c.Name, e.Name)
				}
				if slices.Contains(sharedEnv, e.Name) {
					if shared[e.Name] == nil {
						shared[e.Name] = map[string]string{}
					}
					shared[e.Name][b.name] = src
				}
			}
			// Their defaults are 127.0.0.1, which is the pod itself here.
			for _, name := range []string{"DATABASE_URL", "REDIS_URL"} {
				if !seen[name] {
					t.Errorf("%s/%s does not set %s", d.Name, c.Name, name)
				}
			}
			// An operator turns tracing on by setting one value, with a sampler
			// already chosen.
			for _, name := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_SAMPLER"} {
				if !seen[name] {
					t.Errorf("%s/%s does not set %s", d.Name, c.Name, name)
				}
			}
		}
	}
	for name, by := range shared {
		if len(by) != len(s.binaries) || len(slices.Compact(slices.Sorted(mapValues(by)))) != 1 {
			t.Errorf("%s must be the same for every binary: %v", name, by)
		}
	}
	for k := range secret.StringData {
		if !usedKeys[k] {
			t.Errorf("%s has %s, which no container reads", exampleSecret, k)
		}
	}
	// config refuses a token or master secret under 16 characters: the example's
	// placeholders must be refused, never become a known working credential.
	for _, k := range []string{"QUOTA_ADMIN_TOKEN", "QUOTA_WEBHOOK_SECRET"} {
		if v, ok := secret.StringData[k]; !ok || len(v) >= 16 {
			t.Errorf("%s %s = %q: want a placeholder under 16 characters, which the binaries refuse", exampleSecret, k, v)
		}
	}
}

func secretRef(e corev1.EnvVar) *corev1.SecretKeySelector {
	if e.ValueFrom == nil {
		return nil
	}
	return e.ValueFrom.SecretKeyRef
}

func mapValues(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}

// TestReplicas: the HPA owns the api's replica count, and QUOTA_REPLICAS counts every
// api pod that can answer at once (the HPA's maximum plus the rollout's surge), so the
// `local` fail mode never admits more than a limit in total. Disruption budgets let a
// node drain and keep pods serving.
func TestReplicas(t *testing.T) {
	s, m := readSource(t), applied(t)
	autoscaled := map[string]int32{} // Deployment -> the fewest replicas it runs
	for _, hpa := range m.hpas {
		d := m.deployment(t, hpa.Spec.ScaleTargetRef.Name)
		minR := int32(1)
		if hpa.Spec.MinReplicas != nil {
			minR = *hpa.Spec.MinReplicas
		}
		maxR := hpa.Spec.MaxReplicas
		if minR < 2 || minR > maxR {
			t.Errorf("HPA %s: minReplicas %d, maxReplicas %d: want 2 <= min <= max", hpa.Name, minR, maxR)
		}
		autoscaled[d.Name] = minR
		if d.Spec.Replicas != nil {
			t.Errorf("Deployment %s sets replicas: %d, which every kubectl apply resets under its HPA", d.Name, *d.Spec.Replicas)
		}
		for _, metric := range hpa.Spec.Metrics {
			if metric.Resource == nil {
				continue
			}
			for _, c := range d.Spec.Template.Spec.Containers {
				if _, ok := c.Resources.Requests[metric.Resource.Name]; !ok {
					t.Errorf("HPA %s scales on %s, which %s/%s does not request", hpa.Name, metric.Resource.Name, d.Name, c.Name)
				}
			}
		}
		surge := intstr.FromString("25%") // the Deployment default
		if ru := d.Spec.Strategy.RollingUpdate; ru != nil && ru.MaxSurge != nil {
			surge = *ru.MaxSurge
		}
		extra, err := intstr.GetScaledValueFromIntOrPercent(&surge, int(maxR), true)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			if !binaryOf(t, s, d, c).env["QUOTA_REPLICAS"] {
				continue
			}
			want := int(maxR) + extra
			e, _ := envValue(c, "QUOTA_REPLICAS")
			if got, err := strconv.Atoi(e.Value); err != nil || got != want {
				t.Errorf("%s/%s: QUOTA_REPLICAS=%q, want %d: the HPA's maxReplicas %d plus the rollout's maxSurge %d pods answer at once "+
					"(fewer would let the local fail mode admit more than a limit; more admits less than it could)", d.Name, c.Name, e.Value, want, maxR, extra)
			}
		}
	}
	for _, pdb := range m.pdbs {
		d := podsOf(m, selector(t, "PodDisruptionBudget "+pdb.Name, pdb.Spec.Selector))[0]
		n, ok := autoscaled[d.Name]
		if !ok {
			if d.Spec.Replicas == nil {
				t.Fatalf("Deployment %s sets no replicas and has no HPA", d.Name)
			}
			n = *d.Spec.Replicas
		}
		var available int
		switch {
		case pdb.Spec.MaxUnavailable != nil:
			down, err := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MaxUnavailable, int(n), true)
			if err != nil {
				t.Fatal(err)
			}
			available = int(n) - down
		case pdb.Spec.MinAvailable != nil:
			var err error
			if available, err = intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MinAvailable, int(n), true); err != nil {
				t.Fatal(err)
			}
		}
		if available < 1 || available >= int(n) {
			t.Errorf("PodDisruptionBudget %s keeps %d of %s's %d pods: want at least 1 kept and 1 evictable, or node drains block or leave nothing serving",
				pdb.Name, available, d.Name, n)
		}
	}
}

// TestPodSecurity: non-root, read-only root file system, no privilege escalation, no
// capabilities, no service account token, resources set, GOMEMLIMIT under the
// memory limit.
func TestPodSecurity(t *testing.T) {
	m := applied(t)
	for _, d := range m.deployments {
		ps := d.Spec.Template.Spec
		if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
			t.Errorf("%s mounts a service account token it does not use", d.Name)
		}
		psc := ps.SecurityContext
		if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 ||
			psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: pod securityContext %v: want runAsNonRoot, a non-zero runAsUser and the RuntimeDefault seccomp profile", d.Name, psc)
		}
		for _, c := range ps.Containers {
			sc := c.SecurityContext
			if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
				sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
				sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
				t.Errorf("%s/%s: securityContext %v: want readOnlyRootFilesystem, no privilege escalation, capabilities drop ALL", d.Name, c.Name, sc)
			}
			for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				if _, ok := c.Resources.Requests[r]; !ok {
					t.Errorf("%s/%s requests no %s", d.Name, c.Name, r)
				}
			}
			limit, ok := c.Resources.Limits[corev1.ResourceMemory]
			if !ok {
				t.Errorf("%s/%s has no memory limit", d.Name, c.Name)
				continue
			}
			if req := c.Resources.Requests[corev1.ResourceMemory]; req.Cmp(limit) > 0 {
				t.Errorf("%s/%s requests more memory than its limit", d.Name, c.Name)
			}
			e, ok := envValue(c, "GOMEMLIMIT")
			if !ok {
				t.Errorf("%s/%s sets no GOMEMLIMIT under its memory limit %s", d.Name, c.Name, limit.String())
				continue
			}
			soft, err := goMemLimit(e.Value)
			if err != nil || soft.Cmp(limit) >= 0 {
				t.Errorf("%s/%s: GOMEMLIMIT=%q (%v) is not under the memory limit %s", d.Name, c.Name, e.Value, err, limit.String())
			}
		}
		if p := ps.Containers[0].Lifecycle; p != nil && p.PreStop != nil && p.PreStop.Sleep != nil && ps.TerminationGracePeriodSeconds != nil &&
			p.PreStop.Sleep.Seconds >= *ps.TerminationGracePeriodSeconds {
			t.Errorf("%s: the preStop sleep takes the whole grace period", d.Name)
		}
	}
}

// goMemLimit reads the Go runtime's GOMEMLIMIT syntax (bytes, or B/KiB/MiB/GiB/TiB).
func goMemLimit(v string) (resource.Quantity, error) {
	for _, suffix := range []string{"KiB", "MiB", "GiB", "TiB"} {
		if n, ok := strings.CutSuffix(v, suffix); ok {
			return resource.ParseQuantity(n + strings.TrimSuffix(suffix, "B"))
		}
	}
	return resource.ParseQuantity(strings.TrimSuffix(v, "B"))
}

// TestKustomizeBuild renders the directory as kubectl apply -k does, and the overlay
// docs/DEPLOY.md tells operators to write (with this directory for its remote base),
// and decodes both strictly: kustomize takes every manifest, and the overlay sets
// every container's image, the namespace and the ServiceMonitor's label. Skipped
// without kubectl, whose kustomize this uses.
func TestKustomizeBuild(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed: the kustomize build is not checked")
	}
	build := func(dir string) *manifests {
		t.Helper()
		out, err := exec.Command(kubectl, "kustomize", dir).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, out)
		}
		docs, err := documents(out)
		if err != nil {
			t.Fatal(err)
		}
		built := &manifests{}
		for i, doc := range docs {
			obj, err := decode(doc)
			if err != nil {
				t.Fatalf("kubectl kustomize %s, document %d: %v", dir, i+1, err)
			}
			built.add(obj)
		}
		return built
	}
	count := func(m *manifests) string {
		return fmt.Sprint(len(m.deployments), len(m.services), len(m.secrets), len(m.pdbs), len(m.hpas), len(m.monitors))
	}
	src := applied(t)
	if base := build("."); count(base) != count(src) {
		t.Errorf("kustomize built %s objects of each kind, the files hold %s", count(base), count(src))
	}

	doc, err := os.ReadFile(filepath.Join(root, "docs/DEPLOY.md"))
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindSubmatch(doc)
	if block == nil {
		t.Fatal("docs/DEPLOY.md has no yaml block (the overlay)")
	}
	remote := regexp.MustCompile(`(?m)^(\s*- )https://github.com/quotaplane/quotaplane//deploy/k8s\?ref=\S+$`)
	// kustomize takes a base outside the overlay only by a relative path.
	dir := t.TempDir()
	abs, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, abs)
	if err != nil {
		t.Fatal(err)
	}
	overlay := remote.ReplaceAll(dedent(block[1]), []byte("${1}"+rel))
	if bytes.Equal(overlay, dedent(block[1])) {
		t.Fatalf("docs/DEPLOY.md's overlay does not name this directory as a remote resource:\n%s", block[1])
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), overlay, 0o644); err != nil {
		t.Fatal(err)
	}
	var want struct {
		Namespace string `json:"namespace"`
		Images    []struct {
			NewName string `json:"newName"`
			NewTag  string `json:"newTag"`
		} `json:"images"`
	}
	if err := yaml.Unmarshal(overlay, &want); err != nil || want.Namespace == "" || len(want.Images) != 1 {
		t.Fatalf("docs/DEPLOY.md's overlay sets no namespace or image (%v):\n%s", err, overlay)
	}
	built := build(dir)
	if count(built) != count(src) {
		t.Errorf("the overlay built %s objects of each kind, the files hold %s", count(built), count(src))
	}
	for _, d := range built.deployments {
		if d.Namespace != want.Namespace {
			t.Errorf("overlay: Deployment %s in namespace %q, want %q", d.Name, d.Namespace, want.Namespace)
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			if img := want.Images[0].NewName + ":" + want.Images[0].NewTag; c.Image != img {
				t.Errorf("overlay: %s/%s runs image %q, want %q", d.Name, c.Name, c.Image, img)
			}
		}
	}
	for _, sm := range built.monitors {
		if len(sm.Labels) <= len(src.monitors[0].Labels) {
			t.Errorf("overlay: ServiceMonitor %s labels %v: the patch added none", sm.Name, sm.Labels)
		}
	}
}

// dedent removes the indentation of a block quoted in a Markdown list.
func dedent(b []byte) []byte {
	lines := bytes.Split(b, []byte("\n"))
	indent := -1
	for _, l := range lines {
		if n := len(l) - len(bytes.TrimLeft(l, " ")); len(bytes.TrimSpace(l)) > 0 && (indent < 0 || n < indent) {
			indent = n
		}
	}
	for i, l := range lines {
		if len(l) >= indent && indent > 0 {
			lines[i] = l[indent:]
		}
	}
	return bytes.Join(lines, []byte("\n"))
}

// Each NetworkPolicy selects one Deployment's pods and restricts their ingress, and
// lets in every port they serve (probes, Services, scrapes), by name.
func TestNetworkPolicies(t *testing.T) {
	m := applied(t)
	covered := map[string]bool{}
	for _, np := range m.policies {
		checkNames(t, "NetworkPolicy", np.ObjectMeta)
		ds := podsOf(m, selector(t, "NetworkPolicy "+np.Name, &np.Spec.PodSelector))
		if len(ds) != 1 {
			t.Errorf("NetworkPolicy %s selects the pods of %v, want one Deployment's", np.Name, names(ds))
			continue
		}
		covered[ds[0].Name] = true
		if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			t.Errorf("NetworkPolicy %s does not restrict ingress", np.Name)
		}
		allowed := map[string]bool{}
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				if p.Port == nil || p.Port.Type != intstr.String {
					t.Errorf("NetworkPolicy %s: port %v, want a container port's name", np.Name, p.Port)
					continue
				}
				allowed[p.Port.StrVal] = true
			}
		}
		for _, c := range ds[0].Spec.Template.Spec.Containers {
			for _, cp := range c.Ports {
				if !allowed[cp.Name] {
					t.Errorf("NetworkPolicy %s shuts out port %s (%d) of %s", np.Name, cp.Name, cp.ContainerPort, ds[0].Name)
				}
			}
		}
	}
	for _, d := range m.deployments {
		if !covered[d.Name] {
			t.Errorf("Deployment %s has no NetworkPolicy", d.Name)
		}
	}
}
