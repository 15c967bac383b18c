package rls_test

import (
	"context"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
)

// panicky is the router, but a check of team "ops" panics.
type panicky struct{ checks.Engine }

func (p panicky) Decide(ctx context.Context, cs []quota.Check) {
	for i := range cs {
		if cs[i].Request.Team == "ops" {
			panic("a bug in the engine")
		}
	}
	p.Engine.Decide(ctx, cs)
}

// The gRPC server's interceptors, as HTTP's middleware: a panic in a handler answers
// INTERNAL and the server lives on; calls are counted by method and code; every call
// has a server span.
func TestInterceptors(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	reg := prometheus.NewRegistry()
	r := newReplicaWith(t, testenv.PostgresURL(t), testenv.ID(t, "r"), replicaOptions{tp: tp, grpcReg: reg,
		engine: func(e checks.Engine) checks.Engine { return panicky{e} }})
	key := r.setup("acme", 25)

	_, err := r.should(key, 0, desc(entry{"team", "ops"}))
	if st, _ := status.FromError(err); st.Code() != codes.Internal || strings.Contains(st.Message(), "a bug") {
		t.Errorf("a panicking call = %v %q, want INTERNAL without the panic's words", st.Code(), st.Message())
	}
	for range 2 {
		r.mustShould(key, 0, desc(entry{"team", "eng"})) // the server lives on
	}
	if _, err := r.should("", 0, desc(entry{"team", "eng"})); status.Code(err) != codes.Unauthenticated {
		t.Errorf("no key = %v, want UNAUTHENTICATED", err)
	}

	handled := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "quotaplane_grpc_server_handled_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var code, method string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "grpc_code":
					code = l.GetValue()
				case "grpc_method":
					method = l.GetValue()
				}
			}
			if method == "ShouldRateLimit" {
				handled[code] = m.GetCounter().GetValue()
			}
		}
	}
	for code, want := range map[string]float64{"OK": 2, "Internal": 1, "Unauthenticated": 1, "InvalidArgument": 0} {
		if handled[code] != want {
			t.Errorf("quotaplane_grpc_server_handled_total{grpc_method=ShouldRateLimit,grpc_code=%s} = %v, want %v (all: %v)", code, handled[code], want, handled)
		}
	}

	// A server span ends in otelgrpc's stats handler once the call is done on the
	// server, which may be just after the client has its answer: wait for the fourth.
	name := strings.TrimPrefix(rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, "/")
	n := 0
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		n = 0
		for _, s := range exp.GetSpans() {
			if s.Name == name {
				n++
			}
		}
		if n >= 4 || time.Now().After(deadline) {
			break
		}
	}
	if n != 4 {
		t.Errorf("%d server spans named %s, want 4 (one per call)", n, name)
	}
}
