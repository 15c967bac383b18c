package quota_test

import (
	"context"
	"fmt"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// benchRequests builds checks over a three-level cascade: 8 teams, 64 users, the org
// capped at limit per month, every user at a per-minute limit that never binds (so
// each check also reads and writes sliding-window counters).
func benchRequests(org string, limit int64) []quota.Request {
	reqs := make([]quota.Request, 64)
	for i := range reqs {
		reqs[i] = quota.Request{
			Org: org, Team: fmt.Sprintf("team-%d", i%8), User: fmt.Sprintf("user-%d", i),
			Metric: "requests", Cost: 1,
			Limits: quota.LevelLimits{
				Org:  []vocab.Limit{lim(vocab.Month, limit)},
				User: []vocab.Limit{lim(vocab.Minute, 1<<40)},
			},
		}
	}
	return reqs
}

// checkAdmission fails the benchmark if more (or fewer) checks were admitted than
// the org's limit allows, or if the counter disagrees.
func checkAdmission(b *testing.B, r *testRig, org string, admitted, limit int64) {
	b.Helper()
	want := min(int64(b.N), limit)
	if admitted != want {
		b.Fatalf("admitted %d of %d checks at a limit of %d, want exactly %d", admitted, b.N, limit, want)
	}
	if got := r.usage(b, org)[orgC("requests")]; got != admitted {
		b.Fatalf("org counter %d, admitted %d", got, admitted)
	}
}

// BenchmarkCheckParallel runs b.N checks from 64 goroutines through one engine (so
// they are coalesced into pipelines) and asserts that exactly the limit was admitted.
func BenchmarkCheckParallel(b *testing.B) {
	r := MustRig(b, "", quota.Config{})
	org := testenv.ID(b, "org")
	limit := int64(b.N/2 + 1)
	reqs := benchRequests(org, limit)
	r.MustCheck(b, quota.Request{Org: org, Metric: "warmup"}) // hydrate outside the timing
	var admitted, next atomic.Int64
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			res, err := r.e.Check(ctx, reqs[next.Add(1)%int64(len(reqs))])
			if err != nil {
				b.Error(err)
				return
			}
			if res.Allowed {
				admitted.Add(1)
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/check")
	checkAdmission(b, r, org, admitted.Load(), limit)
}

// BenchmarkCheckSerial is one caller doing one check at a time: a round trip each.
func BenchmarkCheckSerial(b *testing.B) {
	r := MustRig(b, "", quota.Config{})
	org := testenv.ID(b, "org")
	limit := int64(b.N/2 + 1)
	reqs := benchRequests(org, limit)
	r.MustCheck(b, quota.Request{Org: org, Metric: "warmup"})
	ctx := context.Background()
	var admitted int64
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		res, err := r.e.Check(ctx, reqs[i%len(reqs)])
		if err != nil {
			b.Fatal(err)
		}
		if res.Allowed {
			admitted++
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/check")
	checkAdmission(b, r, org, admitted, limit)
}

// BenchmarkReserveCommitParallel runs b.N reservations, each committed at once with
// part of its amount, from 64 goroutines through one engine: the cost of a
// reserve+commit pair beside BenchmarkCheckParallel's plain check (make bench prints
// both). It asserts the org's usage is exactly the sum committed.
func BenchmarkReserveCommitParallel(b *testing.B) {
	r := MustRig(b, "", quota.Config{})
	org := testenv.ID(b, "org")
	reqs := benchRequests(org, 1<<50)
	for i := range reqs {
		reqs[i].Cost = 10
	}
	r.MustCheck(b, quota.Request{Org: org, Metric: "warmup"})
	var next, committed atomic.Int64
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			i := next.Add(1)
			res, out, err := r.e.Reserve(ctx, reqs[i%int64(len(reqs))], quota.ReserveOptions{})
			if err != nil || !out.Allowed {
				b.Errorf("reserve: %v %+v", err, out)
				return
			}
			if _, err := r.e.Commit(ctx, org, 1, res.ID, i%11); err != nil {
				b.Error(err)
				return
			}
			committed.Add(i % 11)
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/pair")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
	if got := r.usage(b, org)[orgC("requests")]; got != committed.Load() {
		b.Fatalf("org usage %d, committed %d", got, committed.Load())
	}
}

// BenchmarkCheckWindows compares the cost of a check whose sliding window is counted
// by the two-bucket estimate (estimate) with one counted in sub-buckets (precise,
// Request.Precise) and with a token bucket in its place (bucket, vocab.Limit.Burst):
// BenchmarkCheckParallel's cascade (8 teams, 64 users, the org capped
// per month) with every user limited per second, so a run of a second or more meets
// every sub-bucket index (a precise check sums the previous bucket's sub-buckets
// before the current one: 0 to 19 a level). Besides ns/check it reports Redis's own
// time per EVALSHA (INFO commandstats, before and after) on a private redis-server
// when there is one (on the shared Redis, other clients' scripts would count too).
// make bench prints the ratio.
func BenchmarkCheckWindows(b *testing.B) {
	url := "" // the shared test Redis
	if _, err := exec.LookPath("redis-server"); err == nil {
		_, port := startRedisServerAnyPort(b)
		url = fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	}
	for _, kind := range []string{"estimate", "precise", "bucket"} {
		b.Run(kind, func(b *testing.B) { benchWindow(b, url, kind) })
	}
}

// benchWindow runs BenchmarkCheckWindows' checks with every user's second limited by
// kind: the two-bucket estimate, precise sub-buckets, or a token bucket (GCRA).
func benchWindow(b *testing.B, url, kind string) {
	r := MustRig(b, url, quota.Config{})
	org := testenv.ID(b, "org")
	limit := int64(b.N/2 + 1)
	reqs := benchRequests(org, limit)
	for i := range reqs {
		reqs[i].Precise = kind == "precise"
		reqs[i].Limits.User = []vocab.Limit{lim(vocab.Second, 1<<40)}
		if kind == "bucket" {
			reqs[i].Limits.User[0].Burst = 1 << 40
		}
	}
	r.MustCheck(b, quota.Request{Org: org, Metric: "warmup"})
	ctx := context.Background()
	calls0, usec0 := evalshaStats(b, r)
	var admitted, next atomic.Int64
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, err := r.e.Check(ctx, reqs[next.Add(1)%int64(len(reqs))])
			if err != nil {
				b.Error(err)
				return
			}
			if res.Allowed {
				admitted.Add(1)
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/check")
	if calls1, usec1 := evalshaStats(b, r); calls1 > calls0 {
		b.ReportMetric(float64(usec1-usec0)/float64(calls1-calls0), "redis-µs/check")
	}
	checkAdmission(b, r, org, admitted.Load(), limit)
}

// evalshaStats reads Redis's EVALSHA calls and microseconds so far.
func evalshaStats(b *testing.B, r *testRig) (calls, usec int64) {
	b.Helper()
	info, err := r.raw.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:"); ok {
			_, _ = fmt.Sscanf(rest, "calls=%d,usec=%d,", &calls, &usec)
		}
	}
	return calls, usec
}

// benchMetrics runs b.N decisions of requests and tokens from 64 goroutines through one
// engine: as one two-metric check (multi true), or as two one-metric checks, the
// tokens checked only when the request passed (multi false, what a caller does
// without several metrics: and its request is spent even when its tokens are refused).
// It reports ns/decision and Redis's own time per decision (INFO commandstats), so
// make bench shows what the second metric costs.
func benchMetrics(b *testing.B, multi bool) {
	r := MustRig(b, "", quota.Config{})
	org := testenv.ID(b, "org")
	reqs := benchRequests(org, 1<<40)
	toks := benchRequests(org, 1<<40)
	for i := range toks {
		toks[i].Metric, toks[i].Cost = "tokens", 700
		reqs[i].More = []quota.MetricCost{{Metric: "tokens", Cost: 700, Limits: toks[i].Limits}}
		if !multi {
			reqs[i].More = nil
		}
	}
	r.MustCheck(b, quota.Request{Org: org, Metric: "warmup"}) // hydrate outside the timing
	var next atomic.Int64
	usec0 := evalshaUsec(b, r)
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			i := next.Add(1) % int64(len(reqs))
			res, err := r.e.Check(ctx, reqs[i])
			if err == nil && !multi && res.Allowed {
				res, err = r.e.Check(ctx, toks[i])
			}
			if err != nil || !res.Allowed {
				b.Errorf("%v %+v", err, res.BlockedAt)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/decision")
	b.ReportMetric((evalshaUsec(b, r)-usec0)*1000/float64(b.N), "redis-ns/decision")
	u := r.usage(b, org)
	if u[orgC("requests")] != int64(b.N) || u[orgC("tokens")] != 700*int64(b.N) {
		b.Fatalf("counted %d requests, %d tokens for %d decisions", u[orgC("requests")], u[orgC("tokens")], b.N)
	}
}

// evalshaUsec is Redis's total time in EVALSHA so far (µs), from INFO commandstats.
func evalshaUsec(b *testing.B, r *testRig) float64 {
	info, err := r.raw.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:"); ok {
			for _, f := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(f, "usec="); ok {
					var n float64
					_, _ = fmt.Sscan(v, &n)
					return n
				}
			}
		}
	}
	return 0
}

// BenchmarkCheckTwoMetrics is a decision of requests and tokens as one two-metric check.
func BenchmarkCheckTwoMetrics(b *testing.B) { benchMetrics(b, true) }

// BenchmarkCheckTwoMetricsApart is the same decision as two one-metric checks.
func BenchmarkCheckTwoMetricsApart(b *testing.B) { benchMetrics(b, false) }

// BenchmarkCheckCapacity runs the same checks through a router without a capacity,
// with one every check draws on (one org: its grants answer most checks in process),
// and with one drawn on by 1,000 orgs (each org's grants smaller, so more draws go to
// Redis). It reports ns/check and Redis's time per check (every EVALSHA, capacity.lua's
// included) on a private redis-server when there is one; make bench prints the
// ratios.
func BenchmarkCheckCapacity(b *testing.B) {
	url := "" // the shared test Redis
	if _, err := exec.LookPath("redis-server"); err == nil {
		_, port := startRedisServerAnyPort(b)
		url = fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	}
	for _, kind := range []string{"none", "one-org", "1000-orgs"} {
		b.Run(kind, func(b *testing.B) { benchCapacity(b, url, kind) })
	}
}

func benchCapacity(b *testing.B, url, kind string) {
	r, _ := MustEngines(b, quota.EnginesConfig{DefaultURL: url})
	rig := MustRig(b, url, quota.Config{}) // for INFO only
	org := testenv.ID(b, "org")
	reqs := benchRequests(org, 1<<40)
	if kind == "1000-orgs" {
		all := make([]quota.Request, 0, 1000)
		for i := range 1000 {
			q := reqs[i%len(reqs)]
			q.Org = fmt.Sprintf("%s-%d", org, i)
			all = append(all, q)
		}
		reqs = all
	}
	c := quota.Capacity{ID: "gpu", Metric: "requests", Window: vocab.Minute, Limit: 1 << 40}
	for i := range reqs {
		if kind != "none" {
			reqs[i].Capacities = []quota.CapacityDraw{{Capacity: c, Member: reqs[i].Org, Weight: 1}}
		}
	}
	ctx := context.Background()
	for i := range reqs { // hydrate every org outside the timing
		if _, _, err := r.Check(ctx, vocab.Route{}, quota.Request{Org: reqs[i].Org, Metric: "warmup"}); err != nil {
			b.Fatal(err)
		}
	}
	calls0, usec0 := evalshaStats(b, rig)
	var next atomic.Int64
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, _, err := r.Check(ctx, vocab.Route{}, reqs[next.Add(1)%int64(len(reqs))])
			if err != nil || !res.Allowed {
				b.Errorf("check: %+v %v", res.BlockedAt, err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/check")
	if calls1, usec1 := evalshaStats(b, rig); calls1 > calls0 {
		b.ReportMetric(float64(usec1-usec0)/float64(b.N), "redis-µs/check")
		b.ReportMetric(float64(calls1-calls0)/float64(b.N), "scripts/check")
	}
}
