package rls_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	xdsmatcherv3 "github.com/cncf/xds/go/xds/type/matcher/v3"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3" // the Any types the doc names
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3" // HttpRequestHeaderMatchInput
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// docBlock returns the YAML block of docs/ENVOY.md after the marker comment.
func docBlock(t *testing.T, marker string) []byte {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "docs", "ENVOY.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- " + marker + " -->\n```yaml\n(.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatalf("docs/ENVOY.md has no yaml block after <!-- %s -->", marker)
	}
	return m[1]
}

// decodeStrict decodes YAML (as JSON) into msg; an unknown field or Any type fails.
func decodeStrict(t *testing.T, what string, v any, msg proto.Message) {
	t.Helper()
	js, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(js, msg); err != nil {
		t.Fatalf("%s does not decode into %T: %v", what, msg, err)
	}
}

func validate(t *testing.T, what string, msg proto.Message) {
	t.Helper()
	if v, ok := msg.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
}

// The bootstrap and the Istio EnvoyFilter of docs/ENVOY.md decode strictly into
// go-control-plane's types, pass their generated validators, and make the
// descriptors the service understands, pointing at its cluster with a key.
func TestEnvoyDocDecodes(t *testing.T) {
	b, hcm := bootstrapOf(t, "envoy-bootstrap")
	var rl ratelimitfilterv3.RateLimit
	if err := hcm.GetHttpFilters()[0].GetTypedConfig().UnmarshalTo(&rl); err != nil {
		t.Fatal(err)
	}
	validate(t, "the rate limit filter", &rl)
	checkFilter(t, &rl)
	checkActions(t, hcm.GetRouteConfig().GetVirtualHosts()[0].GetRateLimits())
	var rlsCluster bool
	for _, c := range b.GetStaticResources().GetClusters() {
		rlsCluster = rlsCluster || c.GetName() == rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
	}
	if !rlsCluster {
		t.Error("the filter names a cluster the bootstrap does not define")
	}

	var ef struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Metadata   struct {
			Name      string `yaml:"name"`
			Namespace string `yaml:"namespace"`
		} `yaml:"metadata"`
		Spec struct {
			WorkloadSelector map[string]any `yaml:"workloadSelector"`
			ConfigPatches    []struct {
				ApplyTo string         `yaml:"applyTo"`
				Match   map[string]any `yaml:"match"`
				Patch   struct {
					Operation string `yaml:"operation"`
					Value     any    `yaml:"value"`
				} `yaml:"patch"`
			} `yaml:"configPatches"`
		} `yaml:"spec"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(docBlock(t, "istio-envoyfilter")))
	dec.KnownFields(true)
	if err := dec.Decode(&ef); err != nil {
		t.Fatalf("the EnvoyFilter: %v", err)
	}
	if ef.APIVersion != "networking.istio.io/v1alpha3" || ef.Kind != "EnvoyFilter" || len(ef.Spec.ConfigPatches) != 3 {
		t.Fatalf("the EnvoyFilter: %s %s with %d patches", ef.APIVersion, ef.Kind, len(ef.Spec.ConfigPatches))
	}
	for _, p := range ef.Spec.ConfigPatches {
		switch p.ApplyTo {
		case "CLUSTER":
			var c clusterv3.Cluster
			decodeStrict(t, "the CLUSTER patch", p.Patch.Value, &c)
			validate(t, "the CLUSTER patch", &c)
		case "HTTP_FILTER":
			var f hcmv3.HttpFilter
			decodeStrict(t, "the HTTP_FILTER patch", p.Patch.Value, &f)
			var rl ratelimitfilterv3.RateLimit
			if err := f.GetTypedConfig().UnmarshalTo(&rl); err != nil {
				t.Fatal(err)
			}
			validate(t, "the HTTP_FILTER patch", &rl)
			checkFilter(t, &rl)
		case "VIRTUAL_HOST":
			var vh routev3.VirtualHost // a MERGE patch: only rate_limits, no name or domains
			decodeStrict(t, "the VIRTUAL_HOST patch", p.Patch.Value, &vh)
			checkActions(t, vh.GetRateLimits())
		default:
			t.Errorf("unexpected applyTo %q", p.ApplyTo)
		}
	}
}

// checkFilter: the filter asks the service's cluster with a key, and fails closed:
// when Quotaplane cannot answer, requests are refused with a stated status, never
// forwarded uncounted (docs/ENVOY.md, "When Quotaplane cannot answer").
func checkFilter(t *testing.T, rl *ratelimitfilterv3.RateLimit) {
	t.Helper()
	if !rl.GetFailureModeDeny() || rl.GetStatusOnError().GetCode() == 0 {
		t.Errorf("the filter: failure_mode_deny %v, status_on_error %v; want it to fail closed with a stated status",
			rl.GetFailureModeDeny(), rl.GetStatusOnError())
	}
	checkService(t, rl.GetRateLimitService().GetGrpcService())
}

// checkService: a filter asks the service's cluster with a key in its metadata.
func checkService(t *testing.T, g *corev3.GrpcService) {
	t.Helper()
	md := g.GetInitialMetadata()
	if g.GetEnvoyGrpc().GetClusterName() != "quotaplane_rls" || len(md) != 1 || md[0].GetKey() != "authorization" ||
		!regexp.MustCompile(`^Bearer \S+$`).MatchString(md[0].GetValue()) {
		t.Errorf("the filter's service: %v", g)
	}
}

// bootstrapOf decodes the bootstrap of docs/ENVOY.md after marker strictly, validates
// it, and returns it with its listener's http connection manager, validated too.
func bootstrapOf(t *testing.T, marker string) (*bootstrapv3.Bootstrap, *hcmv3.HttpConnectionManager) {
	t.Helper()
	var raw any
	if err := yaml.Unmarshal(docBlock(t, marker), &raw); err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	decodeStrict(t, "the bootstrap "+marker, raw, &b)
	validate(t, "the bootstrap "+marker, &b)
	var hcm hcmv3.HttpConnectionManager
	if err := b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	validate(t, "the http connection manager", &hcm)
	return &b, &hcm
}

// checkActions: every descriptor entry the actions make has a key the service reads.
func checkActions(t *testing.T, rls []*routev3.RateLimit) {
	t.Helper()
	if len(rls) == 0 {
		t.Fatal("no rate_limits")
	}
	for _, r := range rls {
		for _, a := range r.GetActions() {
			key := a.GetRequestHeaders().GetDescriptorKey()
			if a.GetGenericKey() != nil {
				key = a.GetGenericKey().GetDescriptorKey()
			}
			switch key {
			case "org", "team", "user", "metric":
			default:
				t.Errorf("an action makes entry key %q, which the service refuses", key)
			}
		}
	}
}

// The rate_limit_quota filter's bootstrap of docs/ENVOY.md decodes strictly into
// go-control-plane's types and passes their validators; every bucket it builds fails
// closed, names only entries the service reads, and reports; the filter asks the
// service's cluster with a key, and the route's override names its metric.
func TestEnvoyRLQSDocDecodes(t *testing.T) {
	b, hcm := bootstrapOf(t, "envoy-rlqs-bootstrap")
	var fc rlqsfilterv3.RateLimitQuotaFilterConfig
	if err := hcm.GetHttpFilters()[0].GetTypedConfig().UnmarshalTo(&fc); err != nil {
		t.Fatal(err)
	}
	validate(t, "the rate limit quota filter", &fc)
	checkService(t, fc.GetRlqsServer())
	var settings []*xdsmatcherv3.Matcher_OnMatch
	for _, m := range fc.GetBucketMatchers().GetMatcherList().GetMatchers() {
		settings = append(settings, m.GetOnMatch())
	}
	settings = append(settings, fc.GetBucketMatchers().GetOnNoMatch())
	var override rlqsfilterv3.RateLimitQuotaOverride
	route := hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()[0]
	if err := route.GetTypedPerFilterConfig()["envoy.filters.http.rate_limit_quota"].UnmarshalTo(&override); err != nil {
		t.Fatal(err)
	}
	validate(t, "the route's override", &override)
	settings = append(settings, override.GetBucketMatchers().GetOnNoMatch())
	metrics := map[string]bool{}
	for _, om := range settings {
		var s rlqsfilterv3.RateLimitQuotaBucketSettings
		if err := om.GetAction().GetTypedConfig().UnmarshalTo(&s); err != nil {
			t.Fatal(err)
		}
		validate(t, "a bucket's settings", &s)
		if s.GetNoAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL ||
			s.GetExpiredAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
			t.Errorf("bucket %s: no_assignment_behavior %v, expired_assignment_behavior %v; want both DENY_ALL",
				om.GetAction().GetName(), s.GetNoAssignmentBehavior(), s.GetExpiredAssignmentBehavior())
		}
		if d := s.GetReportingInterval().AsDuration(); d <= 0 || d > 2*time.Second {
			t.Errorf("bucket %s: reporting_interval %v, want up to 2 s", om.GetAction().GetName(), d)
		}
		for key, v := range s.GetBucketIdBuilder().GetBucketIdBuilder() {
			switch key {
			case "org", "team", "user":
			case "metric":
				metrics[v.GetStringValue()] = true
			default:
				t.Errorf("bucket %s: entry key %q, which the service refuses", om.GetAction().GetName(), key)
			}
		}
	}
	if !metrics["requests"] || !metrics["search"] {
		t.Errorf("the buckets' metrics %v, want requests and the route's search", metrics)
	}
	var cluster bool
	for _, c := range b.GetStaticResources().GetClusters() {
		cluster = cluster || c.GetName() == "quotaplane_rls" &&
			c.GetHealthChecks()[0].GetGrpcHealthCheck().GetServiceName() == "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"
	}
	if !cluster {
		t.Error("no cluster quotaplane_rls health-checking the rate limit quota service")
	}
}
