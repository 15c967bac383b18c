package alerttest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/parser"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/alerttest"
	"github.com/quotaplane/quotaplane/internal/demo"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// factor divides every duration of the rules (alerttest.ScaleRules), scraped and
// evaluated every second: for: 2m is 8 s, for: 1m is 4 s, for: 10m is 40 s; rate
// over [1m] is over 4 s, [5m] over 20 s. promtool's unit tests (make test-rules)
// cover the real durations.
const factor = 15

// scaled is d of the real rules as the test's Prometheus sees it.
func scaled(d time.Duration) time.Duration { return d / factor }

// need returns the path of a program, or skips the test (fails it under CI=true).
func need(t *testing.T, prog, install string) string {
	t.Helper()
	p, err := exec.LookPath(prog)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is missing: %s", prog, install)
		}
		t.Skipf("%s not found: skipping the real-Prometheus alert test (%s)", prog, install)
	}
	return p
}

func TestScaleRules(t *testing.T) {
	src := []byte(`groups:
  - name: g
    interval: 30s
    rules:
      - alert: A
        expr: sum(rate(x[5m])) > 0 and max_over_time(y[2m]) == 2 and x < time() - 3600 and max_over_time(z[30m:1m]) > 0
        for: 10m
        keep_firing_for: 1m
        labels: {severity: page}
`)
	out, err := alerttest.ScaleRules(src, 15)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"interval: 2s", "for: 40s", "keep_firing_for: 4s", "x[20s]", "y[8s]", "3600", "z[2m:4s]", "severity: page"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("scaled rules lack %q:\n%s", want, out)
		}
	}
}

// stack is what the alert test runs: a private redis-server, Postgres behind a gate
// that can refuse connections, the api and the worker, and Prometheus.
type stack struct {
	api, worker, redis, prom *testenv.Proc
	apiAddr, workerAddr      string
	metricsAddr              string // the api's QUOTA_METRICS_ADDR, which Prometheus scrapes
	redisPort                int
	gate                     *alerttest.Gate
	opToken, key             string
	p                        *alerttest.Prom
}

func (s *stack) logs() string {
	return fmt.Sprintf("api log:\n%s\nworker log:\n%s\nprometheus log:\n%s", s.api.Log, s.worker.Log, s.prom.Log)
}

func waitHTTP(t *testing.T, u string, within time.Duration, s *stack) {
	t.Helper()
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(within)
	for {
		res, err := c.Get(u)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is not ready after %v (%v)\n%s", u, within, err, s.logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *stack) startRedis(t *testing.T) {
	t.Helper()
	if err := s.redis.Start(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", s.redisPort), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server does not answer:\n%s", s.redis.Log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func start(t *testing.T) *stack {
	t.Helper()
	promBin := need(t, "prometheus", "apt-get install prometheus (Debian's package; the service is not started)")
	need(t, "redis-server", "apt-get install redis-server")
	root := testenv.RepoRoot(t)
	dir := t.TempDir()
	for _, b := range []struct{ name, pkg string }{{"quotaplane-api", "./cmd/api"}, {"quotaplane-worker", "./cmd/worker"}} {
		build := exec.Command("go", "build", "-o", filepath.Join(dir, b.name), b.pkg)
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	dbURL := testenv.PostgresURL(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	gate, err := alerttest.NewGate(fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gate.Close)
	u.Host = gate.Addr()

	s := &stack{gate: gate, redisPort: testenv.FreePort(t), opToken: "alerts-operator-token-" + strconv.Itoa(os.Getpid()),
		apiAddr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), workerAddr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		metricsAddr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))}
	s.redis = &testenv.Proc{Name: "redis-server", Path: "redis-server", Args: []string{"--port", strconv.Itoa(s.redisPort),
		"--bind", "127.0.0.1", "--save", "", "--appendonly", "no"}}
	t.Cleanup(func() { s.redis.Stop(5 * time.Second) })
	s.startRedis(t)

	env := append(testenv.CleanEnviron(), "DATABASE_URL="+u.String(),
		fmt.Sprintf("REDIS_URL=redis://127.0.0.1:%d/0", s.redisPort),
		"QUOTA_ADMIN_TOKEN="+s.opToken, "QUOTA_WEBHOOK_SECRET=alerts-webhook-secret-0123456789",
		"QUOTA_HTTP_ADDR="+s.apiAddr, "QUOTA_WORKER_HTTP_ADDR="+s.workerAddr, "QUOTA_GRPC_ADDR=off", "QUOTA_METRICS_ADDR="+s.metricsAddr,
		"QUOTA_FLUSH_INTERVAL=200ms", "QUOTA_LOG_LEVEL=warn", "QUOTA_STARTUP_TIMEOUT=20s",
		"QUOTA_ADMIN_RATE_LIMIT=off",
		// A machine busy with make test's builds can stall Redis past the 100 ms
		// default: stray degraded answers before the fault.
		"QUOTA_REDIS_TIMEOUT=1s")
	state := filepath.Join(dir, "state")
	seed := exec.Command(filepath.Join(dir, "quotaplane-api"), "demo", "--state-dir", state)
	seed.Env = env
	if out, err := seed.CombinedOutput(); err != nil {
		t.Fatalf("quotaplane-api demo: %v\n%s", err, out)
	}
	key, err := os.ReadFile(filepath.Join(state, "demo-org-key"))
	if err != nil {
		t.Fatal(err)
	}
	s.key = strings.TrimSpace(string(key))

	s.worker = &testenv.Proc{Name: "worker", Path: filepath.Join(dir, "quotaplane-worker"), Env: env}
	s.api = &testenv.Proc{Name: "api", Path: filepath.Join(dir, "quotaplane-api"), Env: env}
	promAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	s.prom = &testenv.Proc{Name: "prometheus", Path: promBin, Args: []string{
		"--config.file=" + filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path=" + filepath.Join(dir, "tsdb"),
		"--web.listen-address=" + promAddr, "--log.level=warn"}}
	t.Cleanup(func() { s.prom.Stop(10 * time.Second); s.api.Stop(20 * time.Second); s.worker.Stop(20 * time.Second) })
	for _, p := range []*testenv.Proc{s.worker, s.api} {
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
	}
	waitHTTP(t, "http://"+s.apiAddr+"/readyz", 60*time.Second, s)
	waitHTTP(t, "http://"+s.workerAddr+"/metrics", 30*time.Second, s)

	rules, err := os.ReadFile(filepath.Join(root, "deploy/prometheus/quotaplane.rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	scaledRules, err := alerttest.ScaleRules(rules, factor)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "quotaplane.rules.yml"), scaledRules, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 900ms
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: quotaplane-api
    static_configs: [{targets: [%q]}]
  - job_name: quotaplane-worker
    static_configs: [{targets: [%q]}]
`, filepath.Join(dir, "quotaplane.rules.yml"), s.metricsAddr, s.workerAddr)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.prom.Start(); err != nil {
		t.Fatal(err)
	}
	waitHTTP(t, "http://"+promAddr+"/-/ready", 30*time.Second, s)
	s.p = alerttest.NewProm("http://" + promAddr)
	return s
}

// load sends checks of the demo org (plan demo-pro, fail mode open) at a bounded
// rate, spread over users and both teams so no minute limit denies them (but one in
// 40, too costly for a month limit), and admin
// reads (GET /v1/orgs, which Postgres answers) at 2/s, until ctx ends.
type load struct {
	checks, degraded, checkErrs, admin, admin5xx atomic.Int64
}

func (l *load) run(ctx context.Context, s *stack, wg *sync.WaitGroup) {
	client := &http.Client{Timeout: 3 * time.Second}
	do := func(method, path, token, body string) (int, []byte) {
		req, _ := http.NewRequestWithContext(ctx, method, "http://"+s.apiAddr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		res, err := client.Do(req)
		if err != nil {
			return 0, nil
		}
		defer res.Body.Close()
		var b [4096]byte
		n, _ := res.Body.Read(b[:])
		return res.StatusCode, b[:n]
	}
	wg.Add(2)
	go func() { // 8 checks/s
		defer wg.Done()
		tick := time.NewTicker(125 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			team := []string{"eng", "sales"}[i%2]
			body := fmt.Sprintf(`{"org":%q,"team":%q,"user":"u%d"}`, demo.OrgID, team, i%50)
			if i%40 == 0 { // 2.5 % denied (above the user's month limit): the denial panels have data, no rejection alert fires
				body = fmt.Sprintf(`{"org":%q,"team":"sales","user":"big","cost":100000}`, demo.OrgID)
			}
			code, answer := do(http.MethodPost, "/v1/check", s.key, body)
			l.checks.Add(1)
			switch {
			case code != http.StatusOK && code != http.StatusTooManyRequests:
				l.checkErrs.Add(1)
			case strings.Contains(string(answer), `"degraded":true`):
				l.degraded.Add(1)
			}
		}
	}()
	go func() { // 2 admin reads/s
		defer wg.Done()
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			code, _ := do(http.MethodGet, "/v1/orgs", s.opToken, "")
			l.admin.Add(1)
			if code >= 500 {
				l.admin5xx.Add(1)
			}
		}
	}()
}

// do sends one request to the api and returns its status.
func do(t *testing.T, s *stack, method, path, token, body string) int {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+s.apiAddr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// watcher polls Prometheus's alerts every 250 ms and logs each change of state.
type watcher struct {
	t     *testing.T
	p     *alerttest.Prom
	t0    time.Time
	mu    sync.Mutex
	state map[string]string
	err   error
}

func (w *watcher) run(ctx context.Context, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			alerts, err := w.p.Alerts(ctx)
			if err == nil {
				now := alerttest.States(alerts)
				w.mu.Lock()
				for n, st := range now {
					if w.state[n] != st {
						w.t.Logf("%6.1fs  %s %s", time.Since(w.t0).Seconds(), n, st)
					}
				}
				for n := range w.state {
					if _, ok := now[n]; !ok {
						w.t.Logf("%6.1fs  %s resolved", time.Since(w.t0).Seconds(), n)
					}
				}
				w.state, w.err = now, nil
				w.mu.Unlock()
			} else {
				w.mu.Lock()
				w.err = err
				w.mu.Unlock()
			}
			time.Sleep(250 * time.Millisecond)
		}
	}()
}

func (w *watcher) get(name string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state[name]
}

// until waits for the alert's state to be want ("" for inactive or resolved),
// within, and returns the time since from.
func (w *watcher) until(name, want string, from time.Time, within time.Duration, s *stack) time.Duration {
	w.t.Helper()
	deadline := from.Add(within)
	for w.get(name) != want {
		if time.Now().After(deadline) {
			w.mu.Lock()
			st, err := alerttest.Names(w.state), w.err
			w.mu.Unlock()
			if want == "" {
				want = "resolved"
			}
			w.t.Fatalf("%s is not %s %v after the fault or recovery (alerts now: %v, last error %v)\n%s", name, want, within, st, err, s.logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(from)
}

// bound fails the test when d is outside [lo, hi].
func bound(t *testing.T, what string, d, lo, hi time.Duration) {
	t.Helper()
	t.Logf("%s after %.1fs (bound %v to %v)", what, d.Seconds(), lo, hi)
	if d < lo || d > hi {
		t.Errorf("%s after %v: outside [%v, %v]", what, d.Round(100*time.Millisecond), lo, hi)
	}
}

// TestAlertsFireAndResolve runs the shipped rules in a real Prometheus (Debian's,
// scraping every 1 s, durations divided by factor) against a real api and worker under
// a bounded load, with faults injected one at a time. The bounds are in the test's
// (scaled) time; each is the rule's scaled for: (an alert cannot fire sooner) to that
// plus the scaled window, scrapes and evaluations, and slack for a busy CI machine.
func TestAlertsFireAndResolve(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Prometheus, the api and the worker for about 2.5 minutes")
	}
	t0 := time.Now()
	s := start(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var l load
	l.run(ctx, s, &wg)
	w := &watcher{t: t, p: s.p, t0: t0, state: map[string]string{}}
	w.run(ctx, &wg)

	// Both targets up, the rules loaded.
	deadline := time.Now().Add(30 * time.Second)
	for {
		up, err := s.p.Query(ctx, `sum by (job) (up) == 1`)
		if err == nil && len(up) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Prometheus does not see both targets up: %v %v\n%s", up, err, s.logs())
		}
		time.Sleep(200 * time.Millisecond)
	}
	groups, err := s.p.RuleGroups(ctx)
	if err != nil || groups["quotaplane.alerts"] < 10 || groups["quotaplane.recording"] < 5 {
		t.Fatalf("the rules are not loaded: %v %v\n%s", groups, err, s.logs())
	}
	// A quiet start: the alerts under test are inactive once the load flows (the
	// api's and the worker's first scrapes are in).
	time.Sleep(3 * time.Second)
	for _, a := range []string{"QuotaplaneAPIDown", "QuotaplaneWorkerDown", "QuotaplaneFailModeAnswering", "QuotaplaneBreakerOpen",
		"QuotaplaneFlushFailing", "QuotaplaneHTTPErrors", "QuotaplaneCheckErrors"} {
		if st := w.get(a); st != "" {
			t.Fatalf("%s is %s before any fault\n%s", a, st, s.logs())
		}
	}
	t.Logf("%.1fs: stack up, load flowing (%d checks so far)", time.Since(t0).Seconds(), l.checks.Load())

	// A user at 100 % of its month limit (its own: 100 a month), never checked again:
	// after Redis is restarted empty (fault 2) only the ledger knows it, and a worker
	// started after that must export it (fault 4).
	if code := do(t, s, http.MethodPost, "/v1/orgs/"+demo.OrgID+"/teams/sales/users", s.opToken,
		`{"id":"full","limits":[{"metric":"requests","window":"month","limit":100}]}`); code != http.StatusCreated {
		t.Fatalf("registering user full answered %d", code)
	}
	if code := do(t, s, http.MethodPost, "/v1/check", s.key, fmt.Sprintf(`{"org":%q,"team":"sales","user":"full","cost":100}`, demo.OrgID)); code != http.StatusOK {
		t.Fatalf("the check that fills user full answered %d", code)
	}

	// 1. The worker stopped: up{job="quotaplane-worker"} == 0.
	stop := time.Now()
	s.worker.Stop(10 * time.Second)
	d := w.until("QuotaplaneWorkerDown", "firing", stop, 40*time.Second, s)
	bound(t, "QuotaplaneWorkerDown fired", d, scaled(2*time.Minute), scaled(2*time.Minute)+12*time.Second)
	back := time.Now()
	if err := s.worker.Start(); err != nil {
		t.Fatal(err)
	}
	d = w.until("QuotaplaneWorkerDown", "", back, 30*time.Second, s)
	bound(t, "QuotaplaneWorkerDown resolved", d, 0, 10*time.Second)

	// 2. The api's Redis stopped: the demo plan fails open, its checks answered
	// degraded; then started again (empty).
	stop = time.Now()
	degraded0 := l.degraded.Load()
	s.redis.Stop(5 * time.Second)
	d = w.until("QuotaplaneFailModeAnswering", "firing", stop, 40*time.Second, s)
	bound(t, "QuotaplaneFailModeAnswering fired", d, scaled(time.Minute), scaled(time.Minute)+scaled(time.Minute)+12*time.Second)
	alerts, err := s.p.Alerts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range alerts {
		if a.Labels["alertname"] == "QuotaplaneFailModeAnswering" && a.Labels["plan"] != demo.PlanID {
			t.Errorf("QuotaplaneFailModeAnswering for plan %q, want only %q", a.Labels["plan"], demo.PlanID)
		}
	}
	// Down for at least 12 s (3 minutes in production), so the breaker alert (open
	// at any scrape of the last 8 s, for 4 s) has its chance.
	time.Sleep(time.Until(stop.Add(12 * time.Second)))
	breaker := w.get("QuotaplaneBreakerOpen")
	back = time.Now()
	s.startRedis(t)
	if n := l.degraded.Load() - degraded0; n == 0 {
		t.Errorf("no check was answered degraded while Redis was down")
	}
	d = w.until("QuotaplaneFailModeAnswering", "", back, 40*time.Second, s)
	bound(t, "QuotaplaneFailModeAnswering resolved", d, 0, scaled(time.Minute)+20*time.Second)
	t.Logf("QuotaplaneBreakerOpen was %q when Redis came back", breaker)
	if breaker != "firing" {
		t.Errorf("QuotaplaneBreakerOpen was %q after 12 s of Redis down (8 s of window, 4 s for:), want firing", breaker)
	}
	w.until("QuotaplaneBreakerOpen", "", back, 40*time.Second, s)

	// 3. Postgres refusing connections (the api's and the worker's): every flush
	// fails at listing the orgs, the admin reads answer 5xx; checks go on (cached
	// limits). FlushFailing may still be pending from the Redis outage: wait until it
	// is not.
	w.until("QuotaplaneFlushFailing", "", time.Now(), scaled(5*time.Minute)+20*time.Second, s)
	w.until("QuotaplaneHTTPErrors", "", time.Now(), 30*time.Second, s)
	stop = time.Now()
	admin5xx0, checkErrs0 := l.admin5xx.Load(), l.checkErrs.Load()
	s.gate.Refuse()
	dHTTP := w.until("QuotaplaneHTTPErrors", "firing", stop, 60*time.Second, s)
	bound(t, "QuotaplaneHTTPErrors fired", dHTTP, scaled(2*time.Minute), scaled(2*time.Minute)+scaled(2*time.Minute)+15*time.Second)
	d = w.until("QuotaplaneFlushFailing", "firing", stop, 90*time.Second, s)
	bound(t, "QuotaplaneFlushFailing fired", d, scaled(10*time.Minute), scaled(10*time.Minute)+15*time.Second)
	back = time.Now()
	s.gate.Allow()
	if n := l.admin5xx.Load() - admin5xx0; n == 0 {
		t.Errorf("no admin read answered 5xx while Postgres refused connections")
	}
	t.Logf("while Postgres refused connections: %d admin reads answered 5xx, %d checks answered an error",
		l.admin5xx.Load()-admin5xx0, l.checkErrs.Load()-checkErrs0)
	dHTTP = w.until("QuotaplaneHTTPErrors", "", back, 60*time.Second, s)
	bound(t, "QuotaplaneHTTPErrors resolved", dHTTP, 0, scaled(2*time.Minute)+15*time.Second)
	d = w.until("QuotaplaneFlushFailing", "", back, 60*time.Second, s)
	bound(t, "QuotaplaneFlushFailing resolved", d, 0, scaled(5*time.Minute)+15*time.Second)

	// 4. The worker restarted after the Redis restart: the user at 100 %, whose
	// counter Redis no longer holds, is exported from the ledger at once.
	s.worker.Stop(10 * time.Second)
	time.Sleep(2 * time.Second) // a failed scrape: the old process's series go stale
	back = time.Now()
	if err := s.worker.Start(); err != nil {
		t.Fatal(err)
	}
	for {
		res, err := s.p.Query(ctx, fmt.Sprintf(`quotaplane_worker_month_utilization_ratio{org=%q, level="user", metric="requests"} == 1`, demo.OrgID))
		if err == nil && len(res) == 1 {
			t.Logf("the user at 100 %% is exported %.1fs after the worker's restart", time.Since(back).Seconds())
			break
		}
		if time.Since(back) > 20*time.Second {
			t.Fatalf("no utilization of 1 for the demo org's user level 20 s after the worker restarted: %v %v\n%s", res, err, s.logs())
		}
		time.Sleep(250 * time.Millisecond)
	}

	t.Logf("load: %d checks (%d degraded, %d errors), %d admin reads (%d 5xx)",
		l.checks.Load(), l.degraded.Load(), l.checkErrs.Load(), l.admin.Load(), l.admin5xx.Load())

	// Every dashboard expression returns data over the run.
	checkDashboard(t, ctx, s.p, t0)
	t.Logf("%.1fs in all", time.Since(t0).Seconds())
}

// mayBeEmpty are metric families a dashboard panel may find empty in this run, as in
// deploy/deploy_test.go's exportedOnlySometimes.
var mayBeEmpty = map[string]string{
	"quotaplane_redis_resends_total":   "only on a Redis Cluster (make test-cluster)",
	"quotaplane_cache_evictions_total": "only once a cache is over its size bound",
	"quotaplane_capacity_draws_total":  "only once a check draws on a capacity (an operator's, or an org limit marked fair_share)",
	"quotaplane_capacity_used_units":   "only once a check draws on a capacity",
	"quotaplane_capacity_limit_units":  "only once a check draws on a capacity",
}

// dashboardVars are the values the test gives the dashboard's variables: what
// Grafana sends with "All" selected ($job: both jobs; $namespace: its allValue .*,
// which also matches the absent label of a Prometheus outside Kubernetes), and a
// rate interval of 4 scrapes plus one, as Grafana computes it for a 1 s scrape.
var dashboardVars = strings.NewReplacer(
	"${job}", "quotaplane-api|quotaplane-worker", "$job", "quotaplane-api|quotaplane-worker",
	"${namespace}", ".*", "$namespace", ".*",
	"${__rate_interval}", "5s", "$__rate_interval", "5s")

// checkDashboard evaluates every expression of deploy/grafana's dashboards over the
// run (a range query from t0, step 2 s) and fails for each that returns no series.
func checkDashboard(t *testing.T, ctx context.Context, p *alerttest.Prom, t0 time.Time) {
	t.Helper()
	root := testenv.RepoRoot(t)
	files, err := filepath.Glob(filepath.Join(root, "deploy/grafana/*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboard in deploy/grafana: %v", err)
	}
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var dash any
		if err := json.Unmarshal(b, &dash); err != nil {
			t.Fatal(err)
		}
		for _, q := range dashboardExprs(dash, "") {
			n++
			expr := dashboardVars.Replace(q.expr)
			if strings.Contains(expr, "$") {
				t.Errorf("panel %q: %q has a variable the test does not substitute", q.panel, q.expr)
				continue
			}
			if skip := emptyAllowed(expr); skip != "" {
				t.Logf("panel %q may be empty: %s", q.panel, skip)
				continue
			}
			res, err := p.QueryRange(ctx, expr, t0, time.Now(), 2*time.Second)
			if err != nil {
				t.Errorf("panel %q: %q: %v", q.panel, expr, err)
				continue
			}
			if len(res) == 0 {
				t.Errorf("panel %q: %q returns no data over the run", q.panel, expr)
				continue
			}
			if check := panelChecks[q.panel]; check != nil {
				if err := check(res); err != nil {
					t.Errorf("panel %q: %q: %v", q.panel, expr, err)
				}
			}
		}
	}
	t.Logf("%d dashboard expressions evaluated", n)
	checkVariables(t, ctx, p, files)
	if n < 25 {
		t.Errorf("found %d dashboard expressions, want every panel's", n)
	}
}

// panelChecks are what the dashboard's panels must show in this run.
var panelChecks = map[string]func([]alerttest.Series) error{
	// Every pipeline holds at least one check: neither the mean nor the floored
	// p99 reads below 1 (the p99 read 0.99 by interpolation).
	"Redis pipeline sizes": func(res []alerttest.Series) error {
		for _, s := range res {
			for _, v := range s.Values {
				if f := value(v); f < 1 {
					return fmt.Errorf("reads %v, below the smallest pipeline (1)", f)
				}
			}
		}
		return nil
	},
	// No period is due in a fresh database: 0, not "No data".
	"Oldest unclosed period": func(res []alerttest.Series) error {
		last := res[0].Values[len(res[0].Values)-1]
		if f := value(last); len(res) != 1 || f != 0 {
			return fmt.Errorf("reads %v (%d series) with nothing due, want 0", f, len(res))
		}
		return nil
	},
	"Targets up": func(res []alerttest.Series) error {
		if len(res) != 2 {
			return fmt.Errorf("%d series, want the api's and the worker's", len(res))
		}
		return nil
	},
	// The admin reads answered 5xx while Postgres refused connections.
	"HTTP 5xx ratio by route": func(res []alerttest.Series) error {
		for _, s := range res {
			for _, v := range s.Values {
				if s.Metric["route"] == "/v1/orgs" && value(v) > 0.5 {
					return nil
				}
			}
		}
		return fmt.Errorf("never above 50 %% for /v1/orgs, whose reads all failed during the database outage: %v", res)
	},
}

func value(point []any) float64 {
	s, _ := point[1].(string)
	f, _ := strconv.ParseFloat(s, 64)
	return f
}

func emptyAllowed(expr string) string {
	e, err := parser.ParseExpr(expr)
	if err != nil {
		return ""
	}
	why := ""
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok && mayBeEmpty[vs.Name] != "" {
			why = vs.Name + " is exported " + mayBeEmpty[vs.Name]
		}
		return nil
	})
	return why
}

type dashQuery struct{ panel, expr string }

// dashboardExprs returns every "expr" of a dashboard with its panel's title, and each
// query variable's query.
func dashboardExprs(v any, title string) []dashQuery {
	var out []dashQuery
	switch v := v.(type) {
	case map[string]any:
		if s, ok := v["title"].(string); ok {
			title = s
		}
		if e, ok := v["expr"].(string); ok {
			out = append(out, dashQuery{title, e})
		}
		for _, c := range v {
			out = append(out, dashboardExprs(c, title)...)
		}
	case []any:
		for _, c := range v {
			out = append(out, dashboardExprs(c, title)...)
		}
	}
	return out
}

// labelValues is a Grafana query variable's label_values(selector, label).
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)

// checkVariables evaluates each query variable's selector: the job variable must
// list both jobs; namespace may be empty (a Prometheus outside Kubernetes has no
// namespace label, and the variable's All, .*, matches its absence).
func checkVariables(t *testing.T, ctx context.Context, p *alerttest.Prom, files []string) {
	t.Helper()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var dash struct {
			Templating struct {
				List []struct {
					Name, Type, Definition string
				} `json:"list"`
			} `json:"templating"`
		}
		if err := json.Unmarshal(b, &dash); err != nil {
			t.Fatal(err)
		}
		vars := map[string]bool{}
		for _, v := range dash.Templating.List {
			vars[v.Name] = true
			if v.Type != "query" {
				continue
			}
			m := labelValues.FindStringSubmatch(v.Definition)
			if m == nil {
				t.Errorf("variable %s: %q is not label_values(selector, label)", v.Name, v.Definition)
				continue
			}
			res, err := p.Query(ctx, fmt.Sprintf("count by (%s) (%s)", m[2], dashboardVars.Replace(m[1])))
			if err != nil {
				t.Errorf("variable %s: %v", v.Name, err)
				continue
			}
			var values []string
			for _, r := range res {
				if r.Metric[m[2]] != "" {
					values = append(values, r.Metric[m[2]])
				}
			}
			sort.Strings(values)
			t.Logf("variable %s: %v", v.Name, values)
			if v.Name == "job" && strings.Join(values, ",") != "quotaplane-api,quotaplane-worker" {
				t.Errorf("variable job lists %v, want quotaplane-api and quotaplane-worker", values)
			}
		}
		for _, want := range []string{"datasource", "job", "namespace"} {
			if !vars[want] {
				t.Errorf("%s has no variable %s", f, want)
			}
		}
	}
}
