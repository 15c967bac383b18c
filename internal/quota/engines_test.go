package quota_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// privateRedis is a redis-server of the test's own, which the test may stop and
// restart on the same port.
type privateRedis struct {
	port int
	srv  *redisServer
	raw  *redis.Client
}

// MustPrivateRedis starts a private redis-server on a free loopback port; it is
// killed when the test ends.
func MustPrivateRedis(tb testing.TB) *privateRedis {
	tb.Helper()
	p := &privateRedis{}
	p.srv, p.port = startRedisServerAnyPort(tb)
	p.raw = redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", p.port), MaxRetries: -1})
	tb.Cleanup(func() { _ = p.raw.Close() })
	return p
}

func (p *privateRedis) URL() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", p.port) }

// Kill stops the server abruptly (SIGKILL), as a crash would.
func (p *privateRedis) Kill(tb testing.TB) {
	tb.Helper()
	p.srv.Kill()
}

// Restart starts a fresh (empty) server on the same port.
func (p *privateRedis) Restart(tb testing.TB) {
	tb.Helper()
	p.srv = startRedisServer(tb, p.port)
}

// keys lists the keys under prefix on client c.
func keys(tb testing.TB, c *redis.Client, prefix string) []string {
	tb.Helper()
	ks, err := c.Keys(context.Background(), prefix+":*").Result()
	if err != nil {
		tb.Fatal(err)
	}
	return ks
}

// MustEngines starts a router with its own key prefix and metrics registry; it is
// closed, and its keys on the shared Redis deleted, when the test ends.
func MustEngines(tb testing.TB, cfg quota.EnginesConfig) (*quota.Engines, *prometheus.Registry) {
	tb.Helper()
	if cfg.Engine.KeyPrefix == "" {
		cfg.Engine.KeyPrefix = testenv.ID(tb, "qr")
	}
	if cfg.DefaultURL == "" {
		cfg.DefaultURL = testenv.RedisURL(tb)
	}
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	r, err := quota.NewEngines(cfg)
	if err != nil {
		tb.Fatalf("NewEngines: %v", err)
	}
	tb.Cleanup(func() {
		_ = r.Close()
		c := testenv.Redis(tb)
		if ks := keys(tb, c, cfg.Engine.KeyPrefix); len(ks) > 0 {
			c.Del(context.Background(), ks...)
		}
	})
	return r, reg
}

// metricValue and histogramSum read reg; see testenv.MetricValue.
func metricValue(tb testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	tb.Helper()
	return testenv.MetricValue(tb, reg, name, labels)
}

func histogramSum(tb testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	tb.Helper()
	return testenv.HistogramSum(tb, reg, name, labels)
}

func p99(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)*99+99)/100-1]
}

func TestEnginesRouting(t *testing.T) {
	t.Parallel()
	pro, dedicated := MustPrivateRedis(t), MustPrivateRedis(t)
	r, reg := MustEngines(t, quota.EnginesConfig{Pools: map[string]string{"pro": pro.URL()}})
	shared := testenv.Redis(t)
	ctx := context.Background()

	tests := []struct {
		name     string
		route    vocab.Route
		wantPool string
		server   *redis.Client
	}{
		{name: "pool class", route: vocab.Route{Pool: "pro"}, wantPool: "pro", server: pro.raw},
		{name: "dedicated url", route: vocab.Route{RedisURL: dedicated.URL()}, wantPool: quota.DedicatedPool, server: dedicated.raw},
		{name: "dedicated url wins over pool class", route: vocab.Route{Pool: "pro", RedisURL: dedicated.URL()}, wantPool: quota.DedicatedPool, server: dedicated.raw},
		{name: "unknown class goes to default", route: vocab.Route{Pool: "enterprise"}, wantPool: quota.DefaultPool, server: shared},
		{name: "no class goes to default", route: vocab.Route{}, wantPool: quota.DefaultPool, server: shared},
	}
	servers := map[string]*redis.Client{"pro": pro.raw, "dedicated": dedicated.raw, "shared": shared}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			org := testenv.ID(t, "org")
			tt.route.FailMode = vocab.FailClosed
			res, out, err := r.Check(ctx, tt.route, quota.Request{Org: org, Metric: "requests", Cost: 1,
				Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Minute, 10)}}})
			if err != nil {
				t.Fatal(err)
			}
			if !res.Allowed || out.Degraded || out.Pool != tt.wantPool {
				t.Errorf("got allowed %v, outcome %+v; want allowed, pool %q, not degraded", res.Allowed, out, tt.wantPool)
			}
			for name, srv := range servers {
				got := len(keysOfOrg(t, srv, org)) > 0
				if want := srv == tt.server; got != want {
					t.Errorf("keys of %s on %s server: %v, want %v", org, name, got, want)
				}
			}
		})
	}

	// A batch across three pools: one pipeline per pool.
	orgs := []string{testenv.ID(t, "org"), testenv.ID(t, "org"), testenv.ID(t, "org")}
	routes := []vocab.Route{{Pool: "pro"}, {RedisURL: dedicated.URL()}, {Pool: "pro"}, {}}
	reqs := []quota.Request{{Org: orgs[0], Metric: "requests"}, {Org: orgs[1], Metric: "requests"},
		{Org: orgs[0], Metric: "requests"}, {Org: orgs[2], Metric: "requests"}}
	// A new org's first pipeline finds no period marker and is sent again after
	// hydration; warm the org up so the batch below is exactly one round trip.
	if _, _, err := r.Check(ctx, vocab.Route{Pool: "pro"}, quota.Request{Org: orgs[0], Metric: "requests", Cost: 0}); err != nil {
		t.Fatal(err)
	}
	proPipelines := metricValue(t, reg, "quotaplane_redis_pipeline_size", map[string]string{"pool": "pro"})
	proCommands := histogramSum(t, reg, "quotaplane_redis_pipeline_size", map[string]string{"pool": "pro"})
	_, outs, errs := r.CheckBatch(ctx, routes, reqs)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	var pools []string
	for _, o := range outs {
		pools = append(pools, o.Pool)
	}
	if diff := cmp.Diff([]string{"pro", "dedicated", "pro", "default"}, pools); diff != "" {
		t.Errorf("batch pools (-want +got):\n%s", diff)
	}
	for i, srv := range []*redis.Client{pro.raw, dedicated.raw, shared} {
		if len(keysOfOrg(t, srv, orgs[i])) == 0 {
			t.Errorf("batch: no keys of %s on its server", orgs[i])
		}
	}
	if n := metricValue(t, reg, "quotaplane_redis_pipeline_size", map[string]string{"pool": "pro"}) - proPipelines; n != 1 {
		t.Errorf("pro pipelines for the batch: %v, want 1 (one pipeline for both checks)", n)
	}
	// Its size is two commands (it used to be observed after go-redis had emptied the
	// pipeline: always 0)
	if n := histogramSum(t, reg, "quotaplane_redis_pipeline_size", map[string]string{"pool": "pro"}) - proCommands; n != 2 {
		t.Errorf("pro pipeline size for the batch: %v, want 2", n)
	}

	// Invalid checks are refused before Redis and never trip the breaker.
	for range 20 {
		_, _, err := r.Check(ctx, vocab.Route{Pool: "pro"}, quota.Request{Org: "bad org", Metric: "requests"})
		if !errors.Is(err, quota.ErrInvalid) {
			t.Fatalf("invalid check: %v, want ErrInvalid", err)
		}
	}
	_, _, err := r.Check(ctx, vocab.Route{FailMode: "sometimes"}, quota.Request{Org: orgs[0], Metric: "requests"})
	if !errors.Is(err, quota.ErrInvalid) {
		t.Errorf("bad fail mode: %v, want ErrInvalid", err)
	}
	if s := r.PoolStates()["pro"]; s != "closed" {
		t.Errorf("pro breaker %s after invalid checks, want closed", s)
	}
	if v := metricValue(t, reg, "quotaplane_checks_total", map[string]string{"decision": "error", "degraded": "false"}); v != 21 {
		t.Errorf("checks_total{decision=error} = %v, want 21", v)
	}
	if v := metricValue(t, reg, "quotaplane_breaker_state", map[string]string{"pool": "dedicated"}); v != 0 {
		t.Errorf("breaker_state{pool=dedicated} = %v, want 0", v)
	}
}

// keysOfOrg lists every key holding org's hash tag on srv, whatever the prefix.
func keysOfOrg(tb testing.TB, srv *redis.Client, org string) []string {
	tb.Helper()
	ks, err := srv.Keys(context.Background(), "*{"+org+"}*").Result()
	if err != nil {
		tb.Fatal(err)
	}
	return ks
}

func TestEnginesInflightBound(t *testing.T) {
	t.Parallel()
	slow := testenv.ID(t, "slow")
	entered, release := make(chan struct{}, 8), make(chan struct{})
	hyd := quota.HydratorFunc(func(ctx context.Context, org string, _ vocab.Period) (map[quota.Counter]int64, error) {
		if org == slow {
			entered <- struct{}{}
			<-release
		}
		return nil, nil
	})
	r, reg := MustEngines(t, quota.EnginesConfig{MaxInFlightPerOrg: 2, Engine: quota.Config{Hydrator: hyd}})
	ctx := context.Background()
	route := vocab.Route{FailMode: vocab.FailOpen}
	req := quota.Request{Org: slow, Metric: "requests", Cost: 1}

	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Go(func() {
			_, _, err := r.Check(ctx, route, req)
			errs <- err
		})
	}
	<-entered // both checks wait on the one hydration
	for deadline := time.Now().Add(5 * time.Second); metricValue(t, reg, "quotaplane_inflight", map[string]string{"pool": "default"}) != 2; {
		if time.Now().After(deadline) {
			t.Fatal("the two checks never were in flight together")
		}
		time.Sleep(time.Millisecond)
	}

	start := time.Now()
	_, out, err := r.Check(ctx, route, req)
	if !errors.Is(err, quota.ErrOverloaded) || out.Degraded {
		t.Errorf("third check: %v, %+v; want ErrOverloaded, not degraded", err, out)
	}
	if d := time.Since(start); d > 50*time.Millisecond {
		t.Errorf("ErrOverloaded took %v, want immediate", d)
	}
	_, _, batchErrs := r.CheckBatch(ctx, []vocab.Route{route}, []quota.Request{req})
	if !errors.Is(batchErrs[0], quota.ErrOverloaded) {
		t.Errorf("batch item over the bound: %v, want ErrOverloaded", batchErrs[0])
	}
	other := quota.Request{Org: testenv.ID(t, "org"), Metric: "requests", Cost: 1}
	if _, _, err := r.Check(ctx, route, other); err != nil {
		t.Errorf("another org's check while %s is at its bound: %v", slow, err)
	}

	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("bounded check: %v", err)
		}
	}
	res, _, err := r.Check(ctx, route, req)
	if err != nil {
		t.Fatalf("check after the others finished: %v", err)
	}
	// Only the two admitted checks and this one were counted.
	if got := res.Levels; len(got) != 0 {
		t.Errorf("levels %+v, want none (no limits)", got)
	}
	if v := metricValue(t, reg, "quotaplane_checks_total", map[string]string{"decision": "error"}); v != 2 {
		t.Errorf("checks_total{decision=error} = %v, want 2", v)
	}
	u := monthUsage(t, slow)
	if u != 3 {
		t.Errorf("org counter of %s = %d, want 3: overloaded checks count nothing", slow, u)
	}
}

// monthUsage reads org's month counter of metric "requests" on the shared Redis.
func monthUsage(tb testing.TB, org string) int64 {
	tb.Helper()
	ctx := context.Background()
	c := testenv.Redis(tb)
	ks := keysOfOrg(tb, c, org)
	for _, k := range ks {
		if strings.Contains(k, "|m|") {
			n, err := c.HGet(ctx, k, "requests|o").Int64()
			if err != nil {
				tb.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// TestEnginesNoisyNeighbour hammers one tenant on pool a and measures another
// tenant's latency on pool b, alone and under that load. Not parallel: it measures
// latency, so it runs alone.
func TestEnginesNoisyNeighbour(t *testing.T) {
	a, b := MustPrivateRedis(t), MustPrivateRedis(t)
	r, reg := MustEngines(t, quota.EnginesConfig{
		Pools:             map[string]string{"a": a.URL(), "b": b.URL()},
		MaxInFlightPerOrg: 16,
		// What is measured is isolation by the in-flight bound, not Redis timeouts: on
		// a loaded machine the default 100 ms failed the noisy tenant's checks.
		RedisTimeout: 2 * time.Second,
	})
	ctx := context.Background()
	noisy, quiet := testenv.ID(t, "noisy"), testenv.ID(t, "quiet")
	quietReq := quota.Request{Org: quiet, Team: "eng", User: "u1", Metric: "requests", Cost: 1,
		Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Minute, 1_000_000)}}}
	measure := func() time.Duration {
		lat := make([]time.Duration, 0, 300)
		for range 300 {
			t0 := time.Now()
			_, out, err := r.Check(ctx, vocab.Route{Pool: "b", FailMode: vocab.FailClosed}, quietReq)
			lat = append(lat, time.Since(t0))
			if err != nil || out.Degraded {
				t.Fatalf("quiet check: %v, %+v", err, out)
			}
		}
		return p99(lat)
	}
	measure() // warm up connections and hydration
	base := measure()

	// hammer runs 64 goroutines checking the noisy tenant on pool as fast as they can
	// (backing off 1ms when overloaded) while the quiet tenant is measured.
	hammer := func(pool string) (p time.Duration, checks, overloaded int64) {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var done, over atomic.Int64
		for range 64 {
			wg.Go(func() {
				req := quota.Request{Org: noisy, Metric: "requests", Cost: 1,
					Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Second, 100)}}}
				for {
					select {
					case <-stop:
						return
					default:
					}
					_, _, err := r.Check(ctx, vocab.Route{Pool: pool, FailMode: vocab.FailClosed}, req)
					switch {
					case errors.Is(err, quota.ErrOverloaded):
						over.Add(1)
						time.Sleep(time.Millisecond) // a client backing off
					case err != nil:
						t.Errorf("noisy check: %v", err)
						return
					default:
						done.Add(1)
					}
				}
			})
		}
		time.Sleep(200 * time.Millisecond)
		p = measure()
		close(stop)
		wg.Wait()
		return p, done.Load(), over.Load()
	}
	loaded, checks, overloaded := hammer("a")
	t.Logf("quiet tenant p99 on pool b: baseline %v, with pool a saturated %v (%.1fx); noisy tenant: %d checks, %d ErrOverloaded",
		base, loaded, float64(loaded)/float64(base), checks, overloaded)
	if overloaded == 0 {
		t.Error("the noisy tenant never hit its in-flight bound")
	}
	if limit := max(10*base, 20*time.Millisecond); loaded > limit {
		t.Errorf("quiet tenant p99 %v under load exceeds %v (10x baseline %v, at least 20ms)", loaded, limit, base)
	}
	// For comparison only: the same load on the quiet tenant's own pool.
	same, checks, overloaded := hammer("b")
	t.Logf("for comparison, noisy tenant on the same pool b: quiet p99 %v (%.1fx); noisy tenant: %d checks, %d ErrOverloaded",
		same, float64(same)/float64(base), checks, overloaded)
	if v := metricValue(t, reg, "quotaplane_checks_total", map[string]string{"decision": "denied", "blocked_level": "org"}); v <= 0 {
		t.Errorf("checks_total{decision=denied,blocked_level=org} = %v, want > 0", v)
	}
}

func TestNewEnginesConfigErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  quota.EnginesConfig
	}{
		{name: "no default", cfg: quota.EnginesConfig{Pools: map[string]string{"pro": "redis://r"}}},
		{name: "bad default url", cfg: quota.EnginesConfig{DefaultURL: "http://:pw@r"}},
		{name: "bad pool url", cfg: quota.EnginesConfig{DefaultURL: "redis://r", Pools: map[string]string{"pro": "nope"}}},
		{name: "reserved class", cfg: quota.EnginesConfig{DefaultURL: "redis://r", Pools: map[string]string{"dedicated": "redis://r"}}},
		{name: "bad key prefix", cfg: quota.EnginesConfig{DefaultURL: "redis://r", Engine: quota.Config{KeyPrefix: "a{b"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := quota.NewEngines(tt.cfg); !errors.Is(err, quota.ErrInvalid) {
				t.Errorf("NewEngines: %v, want ErrInvalid", err)
			}
		})
	}
	// The default pool may come from Pools.
	r, err := quota.NewEngines(quota.EnginesConfig{Pools: map[string]string{"default": "redis://127.0.0.1:1"}})
	if err != nil {
		t.Fatalf("default from Pools: %v", err)
	}
	_ = r.Close()
}
