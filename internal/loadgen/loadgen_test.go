package loadgen_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/httpapi"
	"github.com/quotaplane/quotaplane/internal/ledger"
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

// apiServer serves the HTTP API, with usage read live from the engine, and the gRPC
// rate limit service; it returns the base URL and the gRPC address.
func apiServer(t *testing.T) (string, string) {
	t.Helper()
	pool := testenv.Postgres(t)
	svc := tenants.NewService(pool, tenants.WithPasswordCost(64, 1))
	cache := tenants.NewCache(svc, tenants.CacheOptions{})
	router, err := quota.NewEngines(quota.EnginesConfig{DefaultURL: testenv.RedisURL(t), RedisTimeout: testRedisTimeout, Engine: quota.Config{KeyPrefix: testenv.ID(t, "lg")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = router.Close() })
	quiet := slog.New(slog.NewJSONHandler(io.Discard, nil))
	h, err := httpapi.NewHandler(httpapi.Deps{Tenants: svc, Cache: cache, Checker: router, Redis: testenv.Redis(t), AdminToken: token,
		Logger:  quiet,
		Billing: &billing.Service{Store: billing.NewStore(pool), Tenants: svc, Counters: ledger.EngineCounters(router), Logger: quiet}})
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

// The multi-metric and pairs modes against the real api. An api without the contract
// section a mode needs (API.md "Several metrics in one decision", "Concurrency
// limits") refuses it: the run says so at once, as a RefusedError naming the section,
// and counts nothing. An api with it admits exactly the limits: multi-metric checks
// stop where either metric binds (3 x 192 checks of 1 request and 10 tokens), and
// pairs never hold more at once than a level's concurrent limit and leave nothing
// held.
func TestRunModes(t *testing.T) {
	for _, mode := range []string{loadgen.ModeMulti, loadgen.ModePairs} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			url, _ := apiServer(t)
			cfg := loadgen.Config{URL: url, AdminToken: token, Prefix: "t" + mode, Orgs: 3, Teams: 2, Users: 3,
				UserMonth: 50, Concurrency: 8, Requests: 1500, Duration: 20 * time.Second, Mode: mode, Tokens: 10,
				OrgConcurrent: 4, TeamConcurrent: 3, UserConcurrent: 1, Hold: 2 * time.Millisecond}
			start := time.Now()
			orgs, err := loadgen.Provision(ctx, cfg)
			var rep loadgen.Report
			if err == nil {
				rep, err = loadgen.Run(ctx, cfg, orgs)
			}
			var refused *loadgen.RefusedError
			if errors.As(err, &refused) {
				t.Logf("this api does not take -mode %s: %v", mode, err)
				section := map[string]string{loadgen.ModeMulti: "Several metrics in one decision", loadgen.ModePairs: "Concurrency limits"}[mode]
				if refused.Mode != mode || refused.Status != http.StatusBadRequest || !strings.Contains(err.Error(), section) {
					t.Fatalf("refusal %+v: want mode %s, 400, naming %q", refused, mode, section)
				}
				if d := time.Since(start); d > 10*time.Second {
					t.Errorf("a refused run took %v: it must end at the first refusal, not at -duration", d)
				}
				if orgs != nil && (rep.Allowed != 0 || !strings.Contains(rep.Refused, section)) {
					t.Errorf("refused run: %d allowed, refused %q", rep.Allowed, rep.Refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var text bytes.Buffer
			rep.Text(&text)
			t.Log("\n" + text.String())
			if rep.Mode != mode || !rep.Verified || rep.Errors != 0 || rep.Denied == 0 || !strings.Contains(text.String(), "usage API checked for 3 orgs") {
				t.Fatalf("report: %s", text.String())
			}
			switch mode {
			case loadgen.ModeMulti:
				if rep.Allowed != 3*192 {
					t.Fatalf("%d multi-metric checks allowed, want 3 x 192: %s", rep.Allowed, text.String())
				}
			case loadgen.ModePairs:
				if rep.Allowed == 0 || rep.PairsPS <= 0 || rep.MaxInFlight["user"] != 1 || rep.MaxInFlight["org"] > 4 {
					t.Fatalf("pairs: %d held, %.0f/s, in flight %v: %s", rep.Allowed, rep.PairsPS, rep.MaxInFlight, text.String())
				}
			}
		})
	}
}

// The Zipf mode runs its three phases against the real api, each for its duration:
// the plain HTTP figure, the Go client, and the Go client with leases and batching,
// which decides the hottest paths in its process and carries several checks a
// request; nothing is admitted past a limit, and the api counted what was allowed.
func TestRunZipf(t *testing.T) {
	ctx := context.Background()
	url, _ := apiServer(t)
	cfg := loadgen.Config{URL: url, AdminToken: token, Prefix: "tz", Orgs: 1, Teams: 1, Users: 10000,
		UserMonth: 1_000_000_000, TeamMonth: 1_000_000_000_000, OrgMonth: 1_000_000_000_000, Concurrency: 16,
		Duration: time.Second, Mode: loadgen.ModeZipf}
	orgs, err := loadgen.Provision(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := loadgen.RunZipf(ctx, cfg, orgs, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	rep.Text(&text)
	t.Log("\n" + text.String())
	if len(rep.Phases) != 3 || !rep.Verified || !strings.Contains(text.String(), "usage API checked for 1 orgs") {
		t.Fatalf("report: %s", text.String())
	}
	for _, p := range rep.Phases {
		if p.Errors != 0 || p.Checks == 0 || p.Seconds < 0.9 || p.Seconds > 3 {
			t.Errorf("phase %s: %+v", p.Name, p)
		}
	}
	if lb := rep.Phases[2]; lb.Leased == 0 || lb.Requests*2 > lb.Checks || lb.VsHTTP <= 0 {
		t.Errorf("leases + batching: %d of %d checks leased in %d requests", lb.Leased, lb.Checks, lb.Requests)
	}
}

// -mode rlqs against the real api: proxies on the rate limit quota service admit from
// their assignments, fewer server messages than requests admitted, then
// ShouldRateLimit's phase runs verified. The server's CPU is read from Prometheus text.
func TestRunRLQS(t *testing.T) {
	ctx := context.Background()
	url, grpcAddr := apiServer(t)
	cfg := loadgen.Config{URL: url, AdminToken: token, Prefix: "q", Orgs: 2, Teams: 2, Users: 10, UserMonth: 1_000_000,
		Concurrency: 4, Duration: 1500 * time.Millisecond, Rate: 4000, GRPCAddr: grpcAddr, Mode: loadgen.ModeRLQS}
	orgs, err := loadgen.Provision(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := loadgen.RunRLQS(ctx, cfg, loadgen.RLQSConfig{Proxies: 2, Buckets: 20, Interval: 200 * time.Millisecond}, orgs)
	var text bytes.Buffer
	rep.Text(&text)
	t.Log("\n" + text.String())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Admitted < 1000 || rep.PerMessage() < 2 || len(rep.Faults)+len(rep.StreamErrs) > 0 || !rep.RLS.Verified || rep.RLS.Allowed == 0 {
		t.Errorf("report: %s", text.String())
	}
	cpu, err := loadgen.CPUSeconds(strings.NewReader("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\n"))
	if err != nil || cpu != 12.5 {
		t.Errorf("CPU seconds %v, %v; want 12.5", cpu, err)
	}
}
