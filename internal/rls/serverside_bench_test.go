package rls_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/rls"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// The server side of ShouldRateLimit alone: the request decoded from its wire bytes,
// the service's call (descriptors, the check service, the engine and its pipeline to
// Redis) and the answer encoded, with no client and no gRPC transport, so allocs/op is
// the api's own per call. What grpc-go's server allocates per call around it (its
// stream, metadata, the interceptors') is not in it.

// benchService is the rate limit service over org "acme" (month + minute limits),
// team "eng" and its users, as internal/httpapi's benchServer.
func benchService(b *testing.B, leases quota.LeaseConfig) (*rls.Service, string) {
	b.Helper()
	ctx := context.Background()
	svc := tenants.NewService(testenv.Postgres(b), tenants.WithPasswordCost(64, 1))
	seed := tenants.Actor{Name: "bench"}
	big := int64(1) << 50
	lim := func(w vocab.Window, n int64) vocab.Limit { return vocab.Limit{Metric: "requests", Window: w, Limit: n} }
	if _, err := svc.CreatePlan(ctx, seed, tenants.PlanInput{ID: "p", Name: "P", FailMode: vocab.FailOpen,
		Limits: []vocab.Limit{lim(vocab.Month, big), lim(vocab.Minute, big)}}); err != nil {
		b.Fatal(err)
	}
	if _, err := svc.CreateOrg(ctx, seed, tenants.OrgInput{ID: "acme", Name: "Acme", PlanID: "p"}); err != nil {
		b.Fatal(err)
	}
	if _, err := svc.CreateTeam(ctx, seed, "acme", tenants.TeamInput{ID: "eng", Name: "Eng",
		Limits:     []vocab.Limit{lim(vocab.Month, big/2), lim(vocab.Minute, big/2)},
		UserLimits: []vocab.Limit{lim(vocab.Month, big/4), lim(vocab.Minute, big/4)}}); err != nil {
		b.Fatal(err)
	}
	_, key, err := svc.CreateAPIKey(ctx, seed, "acme", tenants.APIKeyInput{Name: "k", Scopes: []tenants.Scope{tenants.ScopeCheck}})
	if err != nil {
		b.Fatal(err)
	}
	router, err := quota.NewEngines(quota.EnginesConfig{DefaultURL: testenv.RedisURL(b), MaxInFlightPerOrg: 5000,
		RedisTimeout: time.Second, Engine: quota.Config{KeyPrefix: testenv.ID(b, "bench"), Leases: leases}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = router.Close() })
	cache := tenants.NewCache(svc, tenants.CacheOptions{TTL: time.Hour, KeyTTL: time.Hour})
	return rls.New(rls.Deps{Cache: cache, Checker: router, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))}), key
}

// pathRequest is what Envoy sends for one org -> team -> user path: three
// descriptors, org, org+team and org+team+user.
func pathRequest(user string) *rlsv3.RateLimitRequest {
	e := func(k, v string) *ratelimitv3.RateLimitDescriptor_Entry {
		return &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v}
	}
	return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{e("org", "acme")}},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{e("org", "acme"), e("team", "eng")}},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{e("org", "acme"), e("team", "eng"), e("user", user)}},
	}}
}

// userRequest is loadgen's call: one [team, user] descriptor.
func userRequest(user string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "team", Value: "eng"}, {Key: "user", Value: user}}}}}
}

// serveRLS calls ShouldRateLimit b.N times from about 50 goroutines, each call's
// request decoded from wire bytes and its answer encoded, as grpc-go's codec does.
func serveRLS(b *testing.B, s *rls.Service, key string, wires [][]byte) {
	b.Helper()
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+key))
	b.SetParallelism(max(1, 50/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		var out []byte
		for pb.Next() {
			i++
			in := new(rlsv3.RateLimitRequest)
			if err := proto.Unmarshal(wires[i%len(wires)], in); err != nil {
				b.Error(err)
				return
			}
			res, err := s.ShouldRateLimit(ctx, in)
			if err != nil || res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				b.Errorf("ShouldRateLimit: %v %v", res.GetOverallCode(), err)
				return
			}
			if out, err = (proto.MarshalOptions{}).MarshalAppend(out[:0], res); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func wiresOf(n int, req func(user string) *rlsv3.RateLimitRequest) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i], _ = proto.Marshal(req(fmt.Sprintf("u%d", i)))
	}
	return out
}

// BenchmarkServerShouldRateLimitPath: Envoy's three descriptors of one path over 1,000
// users, one Redis round trip each call.
func BenchmarkServerShouldRateLimitPath(b *testing.B) {
	s, key := benchService(b, quota.LeaseConfig{})
	serveRLS(b, s, key, wiresOf(1000, pathRequest))
}

// BenchmarkServerShouldRateLimit: one [team, user] descriptor over 1,000 users.
func BenchmarkServerShouldRateLimit(b *testing.B) {
	s, key := benchService(b, quota.LeaseConfig{})
	serveRLS(b, s, key, wiresOf(1000, userRequest))
}

// BenchmarkServerShouldRateLimitHot: the path of one user, leases on.
func BenchmarkServerShouldRateLimitHot(b *testing.B) {
	s, key := benchService(b, quota.LeaseConfig{Enabled: true})
	serveRLS(b, s, key, wiresOf(1, func(string) *rlsv3.RateLimitRequest { return pathRequest("hot") }))
}
