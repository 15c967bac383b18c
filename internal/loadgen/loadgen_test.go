package loadgen_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/httpapi"
	"github.com/quotaplane/quotaplane/internal/loadgen"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/rls"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

const token = "loadgen-test-operator-token"

// testRedisTimeout replaces the 100 ms production default: these tests check
// exactness, and a machine busy with -race builds can stall Redis past 100 ms.
const testRedisTimeout = 2 * time.Second

// apiServer serves the HTTP API and the gRPC rate limit service; it returns the
// base URL and the gRPC address.
func apiServer(t *testing.T) (string, string) {
	t.Helper()
	svc := tenants.NewService(testenv.Postgres(t), tenants.WithPasswordCost(64, 1))
	cache := tenants.NewCache(svc, tenants.CacheOptions{})
	router, err := quota.NewEngines(quota.EnginesConfig{DefaultURL: testenv.RedisURL(t), RedisTimeout: testRedisTimeout, Engine: quota.Config{KeyPrefix: testenv.ID(t, "lg")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = router.Close() })
	h, err := httpapi.NewHandler(httpapi.Deps{Tenants: svc, Cache: cache, Checker: router, Redis: testenv.Redis(t), AdminToken: token,
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	g, _ := rls.NewServer(rls.Deps{Cache: cache, Checker: router, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	return srv.URL, ln.Addr().String()
}

// Three orgs whose org limit binds (users 50, teams 120 of 150, orgs 192 of 240):
// however the load falls, exactly 3 x 192 checks are admitted and no level is over.
func TestRunAdmitsExactlyTheLimits(t *testing.T) {
	for _, batch := range []int{0, 20, -1} {
		t.Run(map[int]string{0: "single", 20: "batch", -1: "grpc"}[batch], func(t *testing.T) {
			ctx := context.Background()
			url, grpcAddr := apiServer(t)
			cfg := loadgen.Config{URL: url, AdminToken: token, Prefix: "t", Orgs: 3, Teams: 2, Users: 3,
				UserMonth: 50, Concurrency: 8, Requests: 1500, Batch: max(batch, 0)}
			if batch < 0 {
				cfg.GRPCAddr = grpcAddr
			}
			orgs, err := loadgen.Provision(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			var progress bytes.Buffer
			cfg.Progress = &progress
			rep, err := loadgen.Run(ctx, cfg, orgs)
			if err != nil {
				t.Fatal(err)
			}
			var text bytes.Buffer
			rep.Text(&text)
			t.Log("\n" + text.String())
			if !rep.Verified || rep.Errors != 0 || rep.Allowed != 3*192 || rep.Denied == 0 {
				t.Fatalf("report: %s", text.String())
			}
			var page bytes.Buffer
			if err := rep.HTML(&page); err != nil || !strings.Contains(page.String(), "<svg") {
				t.Errorf("HTML report: %v", err)
			}
		})
	}
}

func TestRunStopsAtItsDuration(t *testing.T) {
	ctx := context.Background()
	url, _ := apiServer(t)
	cfg := loadgen.Config{URL: url, AdminToken: token, Orgs: 1, Concurrency: 4, Duration: 1500 * time.Millisecond, Rate: 200}
	orgs, err := loadgen.Provision(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep, err := loadgen.Run(ctx, cfg, orgs)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a 1.5s run took %v", d)
	}
	if rep.Requests < 100 || rep.Requests > 400 { // 200/s for 1.5 s
		t.Errorf("%d requests at 200/s for 1.5s", rep.Requests)
	}
}
