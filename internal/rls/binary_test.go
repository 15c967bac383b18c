package rls_test

import (
	"context"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// redisDB is this package's database of the test Redis for StartStack.
const redisDB = 13

// The built quotaplane-api serves the rate limit service on QUOTA_GRPC_ADDR: its
// health answers SERVING, and the demo org's key checks alice of eng.
func TestBinaryServesShouldRateLimit(t *testing.T) {
	st := testenv.StartStack(t, testenv.StackOptions{RedisDB: redisDB})
	conn, err := grpc.NewClient(st.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: rlsv3.RateLimitService_ServiceDesc.ServiceName})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v\n%s", h.GetStatus(), err, st.Logs())
	}
	c := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(entry{"team", "eng"}), desc(entry{"user", "alice"})}}
	if _, err := c.ShouldRateLimit(ctx, req); status.Code(err) != codes.Unauthenticated {
		t.Errorf("no key: %v", err)
	}
	res, err := c.ShouldRateLimit(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+st.DemoKey), req)
	if err != nil || res.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(res.GetStatuses()) != 2 || headerOf(res, "RateLimit-Limit") == "" {
		t.Fatalf("demo key: %v %v\n%s", res, err, st.Logs())
	}
}
