package rls_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// A check from either transport enters the check service once, and the service
// enters the engine once per check (per path of Envoy's descriptors), within the
// transport's server span: the service marks its entry with an event on that span
// (checks.Check, checks.CheckPaths), the engine starts a child span (quota.check for
// one path, quota.check_batch for several).
func TestACheckEntersTheServiceOnce(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	r := newReplicaWith(t, testenv.PostgresURL(t), testenv.ID(t, "r"), replicaOptions{tp: tp})
	key := r.setup("acme", 25)
	grpcSpan := strings.TrimPrefix(rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, "/")

	// entered counts what one call made: spans by name and the service's events by
	// name, failing unless every span but Redis pipelines' (which belong to no
	// request: quota/trace.go) is of the server span's trace, and unless the engine's
	// span is the server span's child.
	// ended waits for a server span to be exported and returns what was. The server
	// span ends in otelgrpc's stats handler once the call is done on the server, which
	// may be just after the client has its answer.
	ended := func(server string) []tracetest.SpanStub {
		spans := exp.GetSpans()
		for deadline := time.Now().Add(2 * time.Second); !slices.ContainsFunc(spans, func(s tracetest.SpanStub) bool { return s.Name == server }) &&
			time.Now().Before(deadline); spans = exp.GetSpans() {
			time.Sleep(5 * time.Millisecond)
		}
		return spans
	}
	entered := func(t *testing.T, server, engine string) map[string]int {
		t.Helper()
		spans := ended(server)
		exp.Reset()
		n := map[string]int{}
		var root, eng *tracetest.SpanStub
		for i, s := range spans {
			n[s.Name]++
			for _, e := range s.Events {
				if strings.HasPrefix(e.Name, "checks.") {
					n[e.Name]++
					if s.Name != server {
						t.Errorf("event %s on span %s, want on %s", e.Name, s.Name, server)
					}
				}
			}
			switch s.Name {
			case server:
				root = &spans[i]
			case engine:
				eng = &spans[i]
			}
		}
		if root == nil || eng == nil {
			t.Fatalf("no %s or %s span: %v", server, engine, n)
		}
		if eng.Parent.SpanID() != root.SpanContext.SpanID() {
			t.Errorf("%s is not a child of %s", engine, server)
		}
		for _, s := range spans {
			if s.Name != "redis.pipeline" && s.SpanContext.TraceID() != root.SpanContext.TraceID() {
				t.Errorf("span %s is of another trace than %s", s.Name, server)
			}
		}
		return n
	}
	want := func(t *testing.T, n, want map[string]int) {
		t.Helper()
		for name, w := range want {
			if n[name] != w {
				t.Errorf("%d of %s, want %d (all: %v)", n[name], name, w, n)
			}
		}
	}

	t.Run("HTTP", func(t *testing.T) {
		r.used(key, "acme", "eng", "alice") // the key authenticated and the org cached
		exp.Reset()
		if rec := r.do("POST", "/v1/check", key, `{"org":"acme","team":"eng","user":"alice"}`); rec.Code != 200 {
			t.Fatalf("check = %d %s", rec.Code, rec.Body)
		}
		want(t, entered(t, "POST /v1/check", "quota.check"),
			map[string]int{"POST /v1/check": 1, "checks.Check": 1, "quota.check": 1, "checks.CheckPaths": 0, "checks.CheckBatch": 0})
	})
	t.Run("gRPC one path", func(t *testing.T) {
		r.mustShould(key, 0, desc(entry{"team", "eng"})) // the key authenticated
		ended(grpcSpan)                                  // the warm-up's spans are all in, not counted below
		exp.Reset()
		r.mustShould(key, 0, desc(entry{"team", "eng"}), desc(entry{"team", "eng"}, entry{"user", "alice"}))
		want(t, entered(t, grpcSpan, "quota.check"),
			map[string]int{grpcSpan: 1, "checks.CheckPaths": 1, "quota.check": 1, "quota.check_batch": 0, "checks.Check": 0})
	})
	t.Run("gRPC two paths", func(t *testing.T) {
		exp.Reset()
		r.mustShould(key, 0, desc(entry{"team", "eng"}, entry{"user", "alice"}), desc(entry{"team", "ops"}))
		want(t, entered(t, grpcSpan, "quota.check_batch"),
			map[string]int{grpcSpan: 1, "checks.CheckPaths": 1, "quota.check_batch": 1, "quota.check": 0})
	})
}
