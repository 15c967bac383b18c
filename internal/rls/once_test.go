package rls_test

import (
	"context"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// A check from either transport enters the check service once, and the service
// enters the engine once per check (per path of Envoy's descriptors), each within the
// transport's server span: HTTP -> checks.Check -> quota.check; gRPC ->
// checks.CheckPaths -> quota.check (one path) or quota.check_batch (several).
func TestACheckEntersTheServiceOnce(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	r := newReplicaWith(t, testenv.PostgresURL(t), testenv.ID(t, "r"), replicaOptions{tp: tp})
	key := r.setup("acme", 25)
	grpcSpan := strings.TrimPrefix(rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, "/")

	// count counts the spans of each name, failing unless every span is of one trace
	// (but Redis pipelines', which belong to none: quota/trace.go).
	count := func(t *testing.T) map[string]int {
		t.Helper()
		spans := exp.GetSpans()
		exp.Reset()
		n := map[string]int{}
		var first *tracetest.SpanStub
		for i, s := range spans {
			n[s.Name]++
			if s.Name == "redis.pipeline" {
				continue
			}
			if first == nil {
				first = &spans[i]
			}
			if s.SpanContext.TraceID() != first.SpanContext.TraceID() {
				t.Errorf("span %s is of another trace than %s", s.Name, first.Name)
			}
		}
		return n
	}
	// parentOf checks that the span named child is a child of the span named parent.
	parentOf := func(t *testing.T, spans tracetest.SpanStubs, parent, child string) {
		t.Helper()
		var p, c *tracetest.SpanStub
		for i := range spans {
			switch spans[i].Name {
			case parent:
				p = &spans[i]
			case child:
				c = &spans[i]
			}
		}
		if p == nil || c == nil || c.Parent.SpanID() != p.SpanContext.SpanID() {
			t.Errorf("%s is not the parent of %s", parent, child)
		}
	}

	t.Run("HTTP", func(t *testing.T) {
		// the key's first use is authenticated once and cached; the check is what is counted
		r.used(key, "acme", "eng", "alice")
		exp.Reset()
		if rec := r.do("POST", "/v1/check", key, `{"org":"acme","team":"eng","user":"alice"}`); rec.Code != 200 {
			t.Fatalf("check = %d %s", rec.Code, rec.Body)
		}
		spans := exp.GetSpans()
		parentOf(t, spans, "POST /v1/check", "checks.Check")
		parentOf(t, spans, "checks.Check", "quota.check")
		n := count(t)
		for name, want := range map[string]int{"POST /v1/check": 1, "checks.Check": 1, "quota.check": 1, "checks.CheckPaths": 0} {
			if n[name] != want {
				t.Errorf("%d spans %s, want %d (all: %v)", n[name], name, want, n)
			}
		}
	})
	t.Run("gRPC one path", func(t *testing.T) {
		r.mustShould(key, 0, desc(entry{"team", "eng"})) // authenticates the key
		exp.Reset()
		r.mustShould(key, 0, desc(entry{"team", "eng"}), desc(entry{"team", "eng"}, entry{"user", "alice"}))
		spans := exp.GetSpans()
		parentOf(t, spans, grpcSpan, "checks.CheckPaths")
		parentOf(t, spans, "checks.CheckPaths", "quota.check")
		n := count(t)
		for name, want := range map[string]int{grpcSpan: 1, "checks.CheckPaths": 1, "quota.check": 1, "quota.check_batch": 0, "checks.Check": 0} {
			if n[name] != want {
				t.Errorf("%d spans %s, want %d (all: %v)", n[name], name, want, n)
			}
		}
	})
	t.Run("gRPC two paths", func(t *testing.T) {
		r.mustShould(key, 0, desc(entry{"team", "eng"}, entry{"user", "alice"}), desc(entry{"team", "ops"}))
		spans := exp.GetSpans()
		parentOf(t, spans, grpcSpan, "checks.CheckPaths")
		parentOf(t, spans, "checks.CheckPaths", "quota.check_batch")
		n := count(t)
		for name, want := range map[string]int{grpcSpan: 1, "checks.CheckPaths": 1, "quota.check_batch": 1, "quota.check": 0} {
			if n[name] != want {
				t.Errorf("%d spans %s, want %d (all: %v)", n[name], name, want, n)
			}
		}
	})
}
