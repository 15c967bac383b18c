package faulttest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// Options is one run of the schedule.
type Options struct {
	Seed     uint64
	Duration time.Duration // of the load; faults stop quietEnd (8 s) before its end
	// Each, when > 0, is the fixed schedule: every kind of fault Each times, in an
	// order drawn from Seed. 0 draws faults at random for the whole Duration.
	Each     int
	Replicas int  // api replicas (default 3)
	Clock    bool // inject clock steps (the binaries must have QUOTA_FAULT_CLOCK)
	// RaceBinaries builds the api and the worker with -race too.
	RaceBinaries bool
	// FlushInterval is the worker's QUOTA_FLUSH_INTERVAL (default 250 ms).
	FlushInterval time.Duration
}

const org = "faults"

// quietEnd is the load without new faults at the end of a run: a restarted replica,
// worker or Redis is back and hydrated before the load stops.
const quietEnd = 8 * time.Second

type quietRedisLog struct{}

func (quietRedisLog) Printf(context.Context, string, ...any) {}

// The limits of the workload, by team (user limits are the team's user defaults:
// users are not registered).
var (
	monthTeamLimit = limitDef{window: "month", limit: 3000} // per 45 s of load: see teamLimit
	monthUserLimit = limitDef{window: "month", limit: 400}
	hotUserLimit   = limitDef{window: "month", limit: 3000}
	resvUserLimit  = limitDef{window: "month", limit: 5000}
	rateUserLimits = []limitDef{{window: "second", limit: 10}, {window: "minute", limit: 200}}
	burstUserLimit = limitDef{window: "second", limit: 10, burst: 30}
	orgLimit       = limitDef{window: "month", limit: 100_000_000}
	// gpuCapacity is the operator's capacity that team cap's gpu checks draw on, above
	// the org's own limits: the oracle holds every real second to it.
	gpuCapacity = capacityDef{id: "faults-gpu", metric: "gpu", window: time.Second, limit: 100}
)

func limitsJSON(ls ...limitDef) []map[string]any {
	return limitsOf("requests", ls...)
}

func limitsOf(metric string, ls ...limitDef) []map[string]any {
	out := []map[string]any{}
	for _, l := range ls {
		m := map[string]any{"metric": metric, "window": l.window, "limit": l.limit}
		if l.burst > 0 {
			m["burst"] = l.burst
		}
		out = append(out, m)
	}
	return out
}

// Run runs one schedule and returns the oracle's Verdict; every process it starts is
// stopped when t ends.
func Run(t testing.TB, o Options) Verdict {
	t.Helper()
	if o.Replicas <= 0 {
		o.Replicas = 3
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = 250 * time.Millisecond
	}
	start0 := time.Now()
	// go-redis logs every failed dial of the lease watcher while Redis is down.
	redis.SetLogger(quietRedisLog{})
	logf := func(format string, args ...any) { t.Logf(format, args...) }
	kinds := []faultKind{killAPI, killWorker, restartRedis, cutRedis, dropReplies}
	if o.Clock {
		kinds = append(kinds, clockStep)
	}
	logf("fault schedule: seed %d, load %v, %d api replicas, flush every %v, faults %v (race binaries %v)",
		o.Seed, o.Duration, o.Replicas, o.FlushInterval, kinds, o.RaceBinaries)
	if !o.Clock {
		logf("fault schedule: no clock steps (the binaries have no QUOTA_FAULT_CLOCK hook, or FAULTS_CLOCK=off)")
	}

	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("the fault schedule needs redis-server (apt-get install redis-server)")
		}
		t.Skip("redis-server is not installed: the fault schedule needs a Redis of its own to kill")
	}
	ctx := context.Background()
	root := testenv.RepoRoot(t)
	apiBin, workerBin, err := buildBinaries(ctx, root, t.TempDir(), o.RaceBinaries)
	if err != nil {
		t.Fatal(err)
	}
	dbURL := testenv.PostgresURL(t)
	c, err := startCluster(clusterConfig{
		APIBin: apiBin, WorkerBin: workerBin, DatabaseURL: dbURL, Replicas: o.Replicas,
		FlushInterval: o.FlushInterval, Sweep: 200 * time.Millisecond, FaultClock: o.Clock,
		freePort: func() int { return testenv.FreePort(t) }, Logf: logf,
	})
	t.Cleanup(c.stop)
	// make faults interrupted (Ctrl-C, kill): stop every process first. The children
	// also die with this process (Pdeathsig) if it is killed -9 itself.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	t.Cleanup(func() { signal.Stop(sigs); close(sigs) })
	go func() {
		if s, ok := <-sigs; ok {
			fmt.Fprintf(os.Stderr, "fault schedule: %v: stopping every process\n", s)
			c.stop()
			os.Exit(1)
		}
	}()
	if err != nil {
		t.Fatalf("start: %v\n%s", err, c.logs())
	}
	key, period, err := setup(ctx, c, teamLimit(o.Duration))
	if err != nil {
		t.Fatalf("setup: %v\n%s", err, c.logs())
	}
	c.period = period
	logf("cluster up in %v: redis-server %s (proxy %s), worker, api %v; org %s, period %s",
		time.Since(start0).Round(time.Millisecond), c.redis.addr(), c.proxy.addr(), c.apiAddrs, org, period)

	watcher := newLeaseWatcher(c.redis.addr(), org)
	defer watcher.close()
	c.onPause = watcher.poll
	wctx, stopWatch := context.WithCancel(ctx)
	var watchDone sync.WaitGroup
	watchDone.Add(1)
	go func() { defer watchDone.Done(); watcher.run(wctx, 50*time.Millisecond) }()

	hist := &history{}
	client := newLoadClient(c.apiAddrs, key, org, hist)
	if err := client.knowCapacity(ctx, gpuCapacity); err != nil {
		t.Fatalf("before the load: %v\n%s", err, c.logs())
	}
	w := workload{monthUsers: 8, rateUsers: 3, burstUsers: 3, resvUsers: 4, capUsers: 2, hotPerReplica: 2, monthWorkers: 3, resvWorkers: 2, hotDenialsToMove: 30}
	loadCtx, stopLoad := context.WithTimeout(ctx, o.Duration)
	defer stopLoad()
	start := time.Now()
	hot, loadDone := runLoad(loadCtx, client, w, o.Seed)

	plan := planFaults(o.Seed, kinds, o.Each, o.Duration-quietEnd-2*time.Second, o.Replicas)
	faults := inject(loadCtx, c, plan, start, start.Add(o.Duration-quietEnd), logf)
	<-loadCtx.Done()
	loadDone.Wait()
	logf("load stopped after %v; %d checks, %d reservations; hot path reached user %s",
		time.Since(start).Round(time.Millisecond), len(hist.checks), len(hist.resvs), hotUser(hot.idx.Load()))
	for i, p := range c.apis { // a fault's restart that failed
		if !p.Running() {
			if err := c.restartAPI(i); err != nil {
				t.Errorf("api-%d could not be restarted: %v", i, err)
			}
		}
	}
	if !c.worker.Running() {
		if err := c.restartWorker(); err != nil {
			t.Errorf("the worker could not be restarted: %v", err)
		}
	}

	obs, stuck, err := quiesce(ctx, c, period, o.FlushInterval)
	stopWatch()
	watchDone.Wait()
	watcher.poll(ctx)
	if err != nil {
		t.Fatalf("after the load: %v\n%s", err, c.logs())
	}
	if stuck != "" {
		logf("after the load: %s\nworker log:\n%s", stuck, c.worker.Log.String())
	}
	limits := map[string][]limitDef{
		"requests|o": {orgLimit}, "tokens|o": {orgLimit}, "gpu|o": {orgLimit},
		"requests|t|month": {teamLimit(o.Duration)},
	}
	for _, ch := range hist.checks {
		f := ch.fields()[2]
		switch ch.team {
		case "month":
			limits[f] = []limitDef{monthUserLimit}
		case "hot":
			limits[f] = []limitDef{hotUserLimit}
		case "rate":
			limits[f] = rateUserLimits
		case "burst":
			limits[f] = []limitDef{burstUserLimit}
		}
	}
	for _, r := range hist.resvs {
		limits[pathFields("tokens", r.team, r.user)[2]] = []limitDef{resvUserLimit}
	}
	v := judge(oracleInput{hist: hist, faults: faults, leases: watcher.records(), obs: obs, limits: limits, capacity: gpuCapacity,
		flushInterval: o.FlushInterval, lossSlack: 250 * time.Millisecond, start: start, replicas: o.Replicas})
	if stuck != "" {
		v.violations = append(v.violations, stuck)
	}
	for _, p := range append(append([]*testenv.Proc(nil), c.apis...), c.worker) {
		if n := p.Log.RaceReports(); n > 0 {
			v.violations = append(v.violations, fmt.Sprintf("%s (the binaries are built with -race) reported %d data races:\n%s", p.Name, n, p.Log.String()))
		}
	}
	var kinds2 []string
	for _, f := range faults {
		kinds2 = append(kinds2, string(f.kind))
	}
	v.report = fmt.Sprintf("seed %d: %d faults injected (%s)\n%s", o.Seed, len(faults), strings.Join(kinds2, ", "), v.report)
	return v
}

// teamLimit is team month's month limit: 3,000 per 45 s of load, so it binds in a long
// run too (its users change every userEpoch).
func teamLimit(load time.Duration) limitDef {
	return limitDef{window: "month", limit: monthTeamLimit.limit * max(1, int64((load+44*time.Second)/(45*time.Second)))}
}

// setup creates the org: a plan that fails closed (a check without Redis answers 503,
// never an uncounted 200), five teams, and a check key.
func setup(ctx context.Context, c *cluster, monthTeam limitDef) (key, period string, err error) {
	steps := []struct {
		path string
		body any
	}{
		{"/v1/plans", map[string]any{"id": "faults", "name": "faults", "fail_mode": "closed",
			"limits": append(append(limitsOf("requests", orgLimit), limitsOf("tokens", orgLimit)...), limitsOf("gpu", orgLimit)...)}},
		{"/v1/capacities", map[string]any{"id": gpuCapacity.id, "metric": gpuCapacity.metric, "window": "second",
			"limit": gpuCapacity.limit}},
		{"/v1/orgs", map[string]any{"id": org, "name": "faults", "plan": "faults"}},
		{"/v1/orgs/" + org + "/teams", map[string]any{"id": "month", "name": "month",
			"limits": limitsJSON(monthTeam), "user_limits": limitsJSON(monthUserLimit)}},
		{"/v1/orgs/" + org + "/teams", map[string]any{"id": "hot", "name": "hot", "limits": []any{},
			"user_limits": limitsJSON(hotUserLimit)}},
		{"/v1/orgs/" + org + "/teams", map[string]any{"id": "rate", "name": "rate", "limits": []any{},
			"user_limits": limitsJSON(rateUserLimits...)}},
		{"/v1/orgs/" + org + "/teams", map[string]any{"id": "burst", "name": "burst", "limits": []any{},
			"user_limits": limitsJSON(burstUserLimit)}},
		{"/v1/orgs/" + org + "/teams", map[string]any{"id": "resv", "name": "resv", "limits": []any{},
			"user_limits": limitsOf("tokens", resvUserLimit)}},
		{"/v1/orgs/" + org + "/teams", map[string]any{"id": "cap", "name": "cap", "limits": []any{}}},
		{"/v1/orgs/" + org + "/teams", map[string]any{"id": "probe", "name": "probe", "limits": []any{},
			"user_limits": limitsOf("gpu", limitDef{window: "month", limit: 1})}},
	}
	for _, s := range steps {
		if err := c.operator(ctx, "POST", s.path, s.body, nil); err != nil {
			return "", "", fmt.Errorf("POST %s: %w", s.path, err)
		}
	}
	var k struct {
		Secret string `json:"secret"`
	}
	if err := c.operator(ctx, "POST", "/v1/orgs/"+org+"/api-keys", map[string]any{"name": "load", "scopes": []string{"check"}}, &k); err != nil {
		return "", "", err
	}
	var u struct {
		Period string `json:"period"`
	}
	if err := c.operator(ctx, "GET", "/v1/orgs/"+org+"/usage", nil, &u); err != nil {
		return "", "", err
	}
	return k.Secret, u.Period, nil
}

// quiesce waits until every reservation and lease has been settled (those left to
// expire by the worker's sweep) and the worker's flush has persisted the counters,
// then reads Redis, the usage API and the billing export.
//
// Reservations still held 30 s after the load (the longest TTL is 5 s) are a finding,
// not an end: stuck says how many and what the sweep sees, and the oracle still
// compares everything (their units are in the held column).
func quiesce(ctx context.Context, c *cluster, period string, flush time.Duration) (obs observed, stuck string, err error) {
	rdb := redis.NewClient(&redis.Options{Addr: c.redis.addr()})
	defer rdb.Close()
	p := "q:{" + org + "}|"
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := rdb.ZCard(ctx, p+"x").Result()
		if err == nil && n == 0 {
			break
		}
		if time.Now().After(deadline) {
			if err != nil {
				return obs, "", err
			}
			first, _ := rdb.ZRangeWithScores(ctx, p+"x", 0, 2).Result()
			var ids []string
			for _, z := range first {
				ids = append(ids, fmt.Sprintf("%v (expires %s)", z.Member, time.UnixMilli(int64(z.Score)).UTC().Format("15:04:05.000")))
			}
			sweep, _ := rdb.SMembers(ctx, "q:{|reservations}").Result()
			stuck = fmt.Sprintf("%d reservations or leases still held 30 s after the load, first %s; the sweep's set of orgs (q:{|reservations}) holds %q",
				n, strings.Join(ids, ", "), sweep)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The export lags Redis by up to one flush: wait until it agrees or gives up.
	deadline = time.Now().Add(20 * time.Second)
	for {
		obs, err = observe(ctx, c, rdb, period)
		if err != nil {
			return obs, stuck, err
		}
		agree := len(obs.redis) > 0
		for f, n := range obs.redis {
			if obs.export[f] != n {
				agree = false
			}
		}
		if agree || time.Now().After(deadline) {
			return obs, stuck, nil
		}
		time.Sleep(2 * flush)
	}
}

func observe(ctx context.Context, c *cluster, rdb *redis.Client, period string) (observed, error) {
	obs := observed{redis: map[string]int64{}, held: map[string]int64{}, usage: map[string]int64{}, export: map[string]int64{}}
	p := "q:{" + org + "}|"
	month, err := rdb.HGetAll(ctx, p+"m|"+period).Result()
	if err != nil {
		return obs, err
	}
	held, err := rdb.HGetAll(ctx, p+"h|"+period).Result()
	if err != nil {
		return obs, err
	}
	for f, v := range month {
		if strings.HasPrefix(f, "|") { // the period marker
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		h, _ := strconv.ParseInt(held[f], 10, 64)
		obs.redis[f] = n - h
		if h != 0 {
			obs.held[f] = h
		}
	}
	var usage struct {
		Metrics []struct {
			Metric string `json:"metric"`
			Org    struct {
				Used int64 `json:"used"`
			} `json:"org"`
			Teams []struct {
				ID   string `json:"id"`
				Used int64  `json:"used"`
			} `json:"teams"`
			Users []struct {
				ID   string `json:"id"`
				Team string `json:"team"`
				Used int64  `json:"used"`
			} `json:"users"`
		} `json:"metrics"`
	}
	if err := c.operator(ctx, "GET", "/v1/orgs/"+org+"/usage?period="+period, nil, &usage); err != nil {
		return obs, fmt.Errorf("usage: %w", err)
	}
	for _, m := range usage.Metrics {
		obs.usage[m.Metric+"|o"] = m.Org.Used
		for _, t := range m.Teams {
			obs.usage[m.Metric+"|t|"+t.ID] = t.Used
		}
		for _, u := range m.Users {
			obs.usage[m.Metric+"|u|"+u.Team+"|"+u.ID] = u.Used
		}
	}
	var raw []byte
	if err := c.operator(ctx, "GET", "/v1/orgs/"+org+"/billing/export?format=json&period="+period, nil, &raw); err != nil {
		return obs, fmt.Errorf("export: %w", err)
	}
	var rows []struct {
		Team   string `json:"team"`
		User   string `json:"user"`
		Metric string `json:"metric"`
		Units  int64  `json:"units"`
	}
	if err := json.Unmarshal(raw, &rows); err != nil {
		return obs, fmt.Errorf("export: %w: %.200s", err, raw)
	}
	for _, r := range rows {
		switch {
		case r.Team == "" && r.User == "":
			obs.export[r.Metric+"|o"] = r.Units
		case r.User == "":
			// A team's own units (checks without a user): none in this workload; the
			// team's total is the sum of its users' rows.
			obs.export[r.Metric+"|t|"+r.Team] += r.Units
		default:
			obs.export[r.Metric+"|u|"+r.Team+"|"+r.User] = r.Units
			obs.export[r.Metric+"|t|"+r.Team] += r.Units
		}
	}
	return obs, nil
}
