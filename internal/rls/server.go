package rls

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/quotaplane/quotaplane/internal/derrors"
)

// NewServer returns a gRPC server carrying the rate limit service (ShouldRateLimit),
// the rate limit quota service (StreamRateLimitQuotas, rlqs.go) and the standard
// health service (grpc.health.v1), SERVING for "" and both services' names. Stop
// it with GracefulStop, after health's Shutdown (returned) has told load balancers.
//
// Its interceptors are the HTTP layer's middleware for gRPC: calls by method and
// code counted on d.Registerer (quotaplane_grpc_server_handled_total and the
// handling time histogram; go-grpc-middleware's Prometheus provider), a panic in a
// handler answered INTERNAL and logged with its stack, the server living on
// (go-grpc-middleware's recovery), and, when d.TracerProvider is set, a server span
// per call (otelgrpc's stats handler). Requests are read with lenientCodec: a string
// that is not UTF-8 is decided as a bad value, not failed as a bad call. opts are
// added after them.
func NewServer(d Deps, opts ...grpc.ServerOption) (*grpc.Server, *health.Server) {
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	var unary []grpc.UnaryServerInterceptor
	var stream []grpc.StreamServerInterceptor
	var m *grpcprom.ServerMetrics
	if d.Registerer != nil {
		m = grpcprom.NewServerMetrics(
			grpcprom.WithServerCounterOptions(grpcprom.WithNamespace("quotaplane")),
			grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramNamespace("quotaplane")))
		d.Registerer.MustRegister(m)
		unary, stream = append(unary, m.UnaryServerInterceptor()), append(stream, m.StreamServerInterceptor())
	}
	rec := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		return statusOf(d.Logger, "panic", derrors.E(derrors.Internal, "", fmt.Errorf("panic in handler: %v\n%s", p, debug.Stack())))
	})
	unary = append(unary, recovery.UnaryServerInterceptor(rec))
	stream = append(stream, recovery.StreamServerInterceptor(rec))
	all := []grpc.ServerOption{grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...),
		grpc.ForceServerCodecV2(newLenientCodec())}
	if d.TracerProvider != nil {
		all = append(all, grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(d.TracerProvider))))
	}
	g := grpc.NewServer(append(all, opts...)...)
	svc := New(d)
	rlsv3.RegisterRateLimitServiceServer(g, svc)
	rlqsv3.RegisterRateLimitQuotaServiceServer(g, newQuotaService(svc, d.RLQS, newRLQSMetrics(d.Registerer)))
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(rlqsv3.RateLimitQuotaService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, h)
	if m != nil {
		m.InitializeMetrics(g) // every method's series exist from the start, at 0
	}
	return g, h
}
