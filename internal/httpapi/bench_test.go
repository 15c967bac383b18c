package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/quotaplane/quotaplane/internal/httpapi"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// benchServer is the api over real loopback HTTP with a three-level cascade:
// org "acme" (month + minute limits), team "eng", users with default limits.
func benchServer(b *testing.B) (url, key string) {
	b.Helper()
	return benchServerTraced(b, nil)
}

// benchServerTraced is benchServer with its spans given to tp (nil: tracing off).
func benchServerTraced(b *testing.B, tp trace.TracerProvider) (url, key string) {
	b.Helper()
	return benchServerWith(b, tp, quota.LeaseConfig{})
}

// benchServerWith is benchServerTraced with the engine's leases configured.
func benchServerWith(b *testing.B, tp trace.TracerProvider, leases quota.LeaseConfig) (url, key string) {
	b.Helper()
	h, key := benchHandler(b, tp, leases)
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)
	return srv.URL, key
}

// benchHandler is the api's handler of benchServerWith, without a server.
func benchHandler(b *testing.B, tp trace.TracerProvider, leases quota.LeaseConfig) (http.Handler, string) {
	b.Helper()
	ctx := context.Background()
	svc := tenants.NewService(testenv.Postgres(b), tenants.WithPasswordCost(64, 1))
	seed := tenants.Actor{Name: "bench"}
	big := int64(1) << 50
	if _, err := svc.CreatePlan(ctx, seed, tenants.PlanInput{ID: "p", Name: "P", FailMode: vocab.FailOpen,
		Limits: []vocab.Limit{lim("requests", vocab.Month, big), lim("requests", vocab.Minute, big)}}); err != nil {
		b.Fatal(err)
	}
	if _, err := svc.CreateOrg(ctx, seed, tenants.OrgInput{ID: "acme", Name: "Acme", PlanID: "p"}); err != nil {
		b.Fatal(err)
	}
	if _, err := svc.CreateTeam(ctx, seed, "acme", tenants.TeamInput{ID: "eng", Name: "Eng",
		Limits:     []vocab.Limit{lim("requests", vocab.Month, big/2), lim("requests", vocab.Minute, big/2)},
		UserLimits: []vocab.Limit{lim("requests", vocab.Month, big/4), lim("requests", vocab.Minute, big/4)}}); err != nil {
		b.Fatal(err)
	}
	_, key, err := svc.CreateAPIKey(ctx, seed, "acme", tenants.APIKeyInput{Name: "k", Scopes: []tenants.Scope{tenants.ScopeCheck}})
	if err != nil {
		b.Fatal(err)
	}
	// A second, not the api's 100 ms: on a busy two-core machine a pipeline of 50
	// batches of 100 can take longer, and this measures throughput, not the fail mode.
	router, err := quota.NewEngines(quota.EnginesConfig{DefaultURL: testenv.RedisURL(b), MaxInFlightPerOrg: 50 * httpapi.MaxBatch,
		RedisTimeout: time.Second, Engine: quota.Config{KeyPrefix: testenv.ID(b, "bench"), TracerProvider: tp, Leases: leases}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = router.Close() })
	h, err := httpapi.NewHandler(httpapi.Deps{Tenants: svc, Checker: router, Redis: testenv.Redis(b),
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), TracerProvider: tp})
	if err != nil {
		b.Fatal(err)
	}
	return h, key
}

// drive sends b.N requests from 50 concurrent connections (as wrk -c50 would) and
// reports requests/s, checks/s and latency percentiles.
func drive(b *testing.B, method, url, key string, body func(i int64) []byte, checksPerRequest int) {
	b.Helper()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 64}}
	var n atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	b.SetParallelism(max(1, 50/runtime.GOMAXPROCS(0))) // about 50 client goroutines, as wrk -c50
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		local := make([]time.Duration, 0, 1024)
		for pb.Next() {
			i := n.Add(1)
			var rd io.Reader
			if body != nil {
				rd = bytes.NewReader(body(i))
			}
			req, _ := http.NewRequest(method, url, rd)
			if key != "" {
				req.Header.Set("Authorization", "Bearer "+key)
			}
			t0 := time.Now()
			resp, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			var out bytes.Buffer
			_, _ = io.Copy(&out, resp.Body)
			resp.Body.Close()
			// A batch answers 200 even when some of its checks were refused (overloaded,
			// unavailable): only decided checks count.
			if n := bytes.Count(out.Bytes(), []byte(`"allowed":`)); checksPerRequest > 1 && n != checksPerRequest {
				b.Errorf("%d of %d checks decided: %.300s", n, checksPerRequest, out.Bytes())
				return
			}
			local = append(local, time.Since(t0))
			if resp.StatusCode != 200 {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
		mu.Lock()
		lat = append(lat, local...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	if len(lat) == 0 {
		return
	}
	pct := func(p float64) float64 { return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) }
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(len(lat)*checksPerRequest)/elapsed.Seconds(), "checks/s")
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

// BenchmarkHealthzHTTP is the baseline: the same server and client doing nothing.
func BenchmarkHealthzHTTP(b *testing.B) {
	url, _ := benchServer(b)
	drive(b, "GET", url+"/healthz", "", nil, 1)
}

// BenchmarkCheckHTTP: one three-level, two-window check per request, over 1,000 users.
func BenchmarkCheckHTTP(b *testing.B) {
	url, key := benchServer(b)
	drive(b, "POST", url+"/v1/check", key, func(i int64) []byte {
		return fmt.Appendf(nil, `{"org":"acme","team":"eng","user":"u%d"}`, i%1000)
	}, 1)
}

// BenchmarkCheckHotHTTP: every check on one user, leases on (the api's default):
// answered in process from leases.
func BenchmarkCheckHotHTTP(b *testing.B) {
	url, key := benchServerWith(b, nil, quota.LeaseConfig{Enabled: true})
	drive(b, "POST", url+"/v1/check", key, func(int64) []byte {
		return []byte(`{"org":"acme","team":"eng","user":"hot"}`)
	}, 1)
}

// BenchmarkCheckHotNoLeaseHTTP is BenchmarkCheckHotHTTP with leases off: a Redis
// round trip per check.
func BenchmarkCheckHotNoLeaseHTTP(b *testing.B) {
	url, key := benchServer(b)
	drive(b, "POST", url+"/v1/check", key, func(int64) []byte {
		return []byte(`{"org":"acme","team":"eng","user":"hot"}`)
	}, 1)
}

// BenchmarkCheckBatchHTTP: 100 checks per request, one pipeline each.
func BenchmarkCheckBatchHTTP(b *testing.B) {
	url, key := benchServer(b)
	var checks []map[string]string
	for u := range 100 {
		checks = append(checks, map[string]string{"org": "acme", "team": "eng", "user": fmt.Sprintf("u%d", u)})
	}
	payload, _ := json.Marshal(map[string]any{"checks": checks})
	drive(b, "POST", url+"/v1/check/batch", key, func(int64) []byte { return payload }, 100)
}

// benchMoneyServer is benchServer's cascade with requests and tokens limited at every
// level, and, when priced, a rate card (tokens at 2.50 USD per million) and spend
// budgets at every level: the same check then counts spend too, as a third metric of
// the same script run.
func benchMoneyServer(b *testing.B, priced bool) (url, key string) {
	b.Helper()
	ctx := context.Background()
	svc := tenants.NewService(testenv.Postgres(b), tenants.WithPasswordCost(64, 1))
	seed := tenants.Actor{Name: "bench"}
	big := int64(1) << 50
	levels := func(d int64) []vocab.Limit {
		ls := []vocab.Limit{lim("requests", vocab.Month, big/d), lim("tokens", vocab.Month, big/d)}
		if priced {
			ls = append(ls, lim("spend", vocab.Month, big/d))
		}
		return ls
	}
	plan := tenants.PlanInput{ID: "p", Name: "P", FailMode: vocab.FailOpen, Limits: levels(1)}
	if priced {
		plan.Currency, plan.Rates = "USD", []tenants.Rate{{Metric: "tokens", Price: "2.50", Per: 1_000_000}}
	}
	if _, err := svc.CreatePlan(ctx, seed, plan); err != nil {
		b.Fatal(err)
	}
	if _, err := svc.CreateOrg(ctx, seed, tenants.OrgInput{ID: "acme", Name: "Acme", PlanID: "p"}); err != nil {
		b.Fatal(err)
	}
	if _, err := svc.CreateTeam(ctx, seed, "acme", tenants.TeamInput{ID: "eng", Name: "Eng", Limits: levels(2), UserLimits: levels(4)}); err != nil {
		b.Fatal(err)
	}
	_, key, err := svc.CreateAPIKey(ctx, seed, "acme", tenants.APIKeyInput{Name: "k", Scopes: []tenants.Scope{tenants.ScopeCheck}})
	if err != nil {
		b.Fatal(err)
	}
	router, err := quota.NewEngines(quota.EnginesConfig{DefaultURL: testenv.RedisURL(b), MaxInFlightPerOrg: 50 * httpapi.MaxBatch,
		RedisTimeout: time.Second, Engine: quota.Config{KeyPrefix: testenv.ID(b, "bench")}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = router.Close() })
	h, err := httpapi.NewHandler(httpapi.Deps{Tenants: svc, Checker: router, Redis: testenv.Redis(b),
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)
	return srv.URL, key
}

// benchCosts is a requests+tokens check of one of 1,000 users.
func benchCosts(i int64) []byte {
	return fmt.Appendf(nil, `{"org":"acme","team":"eng","user":"u%d","costs":{"requests":1,"tokens":1000}}`, i%1000)
}

// BenchmarkCheckUnpricedHTTP: a requests+tokens check of three levels, no rates.
func BenchmarkCheckUnpricedHTTP(b *testing.B) {
	url, key := benchMoneyServer(b, false)
	drive(b, "POST", url+"/v1/check", key, benchCosts, 1)
}

// BenchmarkCheckPricedHTTP: the same check with tokens priced, spend counted and
// budgeted at every level: its cost beside BenchmarkCheckUnpricedHTTP's is pricing's.
func BenchmarkCheckPricedHTTP(b *testing.B) {
	url, key := benchMoneyServer(b, true)
	drive(b, "POST", url+"/v1/check", key, benchCosts, 1)
}
