package quota_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// TestEnginesFailModes kills the Redis of a pool and checks, for each fail mode, that
// the breaker opens within a second, that every answer is the mode's degraded answer
// and fast, and that the breaker closes by itself once Redis is back.
func TestEnginesFailModes(t *testing.T) {
	t.Parallel()
	for _, mode := range []vocab.FailMode{vocab.FailOpen, vocab.FailClosed, vocab.FailLocal} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			srv := MustPrivateRedis(t)
			r, reg := MustEngines(t, quota.EnginesConfig{DefaultURL: srv.URL(), Replicas: 2})
			ctx := context.Background()
			route := vocab.Route{FailMode: mode}
			// Day, not minute: the local limiter's fixed window must not roll over mid-test.
			limits := quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Day, 40)}, User: []vocab.Limit{lim(vocab.Minute, 1000)}}
			request := func(org string) quota.Request {
				return quota.Request{Org: org, Team: "eng", User: "u", Metric: "requests", Cost: 1, Limits: limits}
			}

			warm := request(testenv.ID(t, "org"))
			res, out, err := r.Check(ctx, route, warm)
			if err != nil || out.Degraded || !res.Allowed || res.Levels[0].Used != 1 {
				t.Fatalf("healthy check: %+v, %+v, %v", res, out, err)
			}

			srv.Kill(t)
			outage := time.Now()
			for r.PoolStates()[quota.DefaultPool] != "open" {
				if time.Since(outage) > 3*time.Second {
					t.Fatalf("breaker still %s 3s into the outage", r.PoolStates()[quota.DefaultPool])
				}
				if _, out, _ := r.Check(ctx, route, warm); !out.Degraded {
					t.Fatalf("answer during the outage not degraded: %+v", out)
				}
				time.Sleep(5 * time.Millisecond)
			}
			opened := time.Since(outage)
			t.Logf("%s: breaker open %v after the outage", mode, opened)
			if opened > time.Second {
				t.Errorf("breaker opened after %v, want within 1s", opened)
			}

			// 200 checks over ~1.4s: past the open timeout, so half-open probes against
			// the dead Redis are among them.
			req := request(testenv.ID(t, "org"))
			lat := make([]time.Duration, 0, 200)
			allowed, denied := 0, 0
			for i := range 200 {
				t0 := time.Now()
				res, out, err := r.Check(ctx, route, req)
				lat = append(lat, time.Since(t0))
				if !out.Degraded || out.Pool != quota.DefaultPool {
					t.Fatalf("check %d: outcome %+v, want degraded on pool default", i, out)
				}
				switch mode {
				case vocab.FailOpen:
					want := []vocab.LevelStatus{
						{Level: vocab.LevelOrg, ID: req.Org, Window: vocab.Day, Limit: 40, Used: 0, Remaining: 40},
						{Level: vocab.LevelUser, ID: "u", Window: vocab.Minute, Limit: 1000, Used: 0, Remaining: 1000},
					}
					for i := range res.Levels {
						res.Levels[i].ResetAt = time.Time{}
					}
					if err != nil || !res.Allowed || res.BlockedAt != nil {
						t.Fatalf("check %d: %+v, %v; want allowed", i, res, err)
					}
					if diff := cmp.Diff(want, res.Levels); diff != "" {
						t.Fatalf("check %d levels (-want +got):\n%s", i, diff)
					}
				case vocab.FailClosed:
					if !errors.Is(err, quota.ErrUnavailable) {
						t.Fatalf("check %d: %v, want ErrUnavailable", i, err)
					}
				case vocab.FailLocal:
					if err != nil {
						t.Fatalf("check %d: %v", i, err)
					}
					if res.Allowed {
						allowed++
						continue
					}
					denied++
					want := &vocab.Blocked{Metric: req.Metric, Level: vocab.LevelOrg, ID: req.Org, Window: vocab.Day}
					if diff := cmp.Diff(want, res.BlockedAt); diff != "" || res.RetryAfter <= 0 {
						t.Fatalf("check %d blocked at (-want +got):\n%s retry after %v", i, diff, res.RetryAfter)
					}
					if l := res.Levels[0]; l.Limit != 20 || l.Used != 20 || l.Remaining != 0 {
						t.Fatalf("check %d org level %+v, want share 20 used 20", i, l)
					}
				}
				time.Sleep(7 * time.Millisecond)
			}
			if mode == vocab.FailLocal && (allowed != 20 || denied != 180) {
				t.Errorf("local: %d allowed, %d denied; want 20 (limit 40 / 2 replicas) and 180", allowed, denied)
			}
			p := p99(lat)
			t.Logf("%s: p99 of 200 degraded answers %v (max %v)", mode, p, maxDur(lat))
			if p > 100*time.Millisecond {
				t.Errorf("p99 of degraded answers %v, want under 100ms", p)
			}

			if mode == vocab.FailLocal {
				// Shadow counts and allows over the share, reporting what would block.
				sh := request(testenv.ID(t, "org"))
				sh.Mode, sh.Cost = vocab.Shadow, 25
				res, _, err := r.Check(ctx, route, sh)
				if err != nil || !res.Allowed || res.WouldBlock == nil || res.WouldBlock.Level != vocab.LevelOrg {
					t.Errorf("local shadow over the share: %+v, %v; want allowed with WouldBlock at org", res, err)
				}
			}

			// A batch is degraded the same way.
			_, outs, errs := r.CheckBatch(ctx, []vocab.Route{route, route}, []quota.Request{request(testenv.ID(t, "org")), request(testenv.ID(t, "org"))})
			for i := range outs {
				if !outs[i].Degraded || (mode == vocab.FailClosed) != errors.Is(errs[i], quota.ErrUnavailable) {
					t.Errorf("batch item %d during outage: %+v, %v", i, outs[i], errs[i])
				}
			}

			if v := metricValue(t, reg, "quotaplane_checks_total", map[string]string{"degraded": "true"}); v <= 0 { // the series exist at 0 from the start
				t.Error("no degraded checks in quotaplane_checks_total")
			}
			if v := metricValue(t, reg, "quotaplane_breaker_state", map[string]string{"pool": "default"}); v < 1 {
				t.Errorf("breaker_state{pool=default} = %v during the outage, want 1 or 2", v)
			}

			srv.Restart(t)
			back := time.Now()
			probe := request(testenv.ID(t, "org"))
			for {
				_, out, err := r.Check(ctx, route, probe)
				if err == nil && !out.Degraded && r.PoolStates()[quota.DefaultPool] == "closed" {
					break
				}
				if time.Since(back) > 5*time.Second {
					t.Fatalf("breaker %s 5s after Redis came back (last: %+v, %v)", r.PoolStates()[quota.DefaultPool], out, err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("%s: breaker closed %v after Redis came back", mode, time.Since(back))

			// Exact again: Redis decides.
			exact := quota.Request{Org: testenv.ID(t, "org"), Metric: "requests", Cost: 1,
				Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Minute, 2)}}}
			for i, wantAllowed := range []bool{true, true, false} {
				res, out, err := r.Check(ctx, route, exact)
				if err != nil || out.Degraded || res.Allowed != wantAllowed || res.Levels[0].Used != 2-boolInt(i < 1) {
					t.Errorf("check %d after recovery: %+v, %+v, %v; want allowed %v, exact usage", i, res, out, err, wantAllowed)
				}
			}
			if v := metricValue(t, reg, "quotaplane_breaker_state", map[string]string{"pool": "default"}); v != 0 {
				t.Errorf("breaker_state{pool=default} = %v after recovery, want 0", v)
			}
		})
	}
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func maxDur(d []time.Duration) time.Duration {
	var m time.Duration
	for _, x := range d {
		m = max(m, x)
	}
	return m
}

// TestEnginesHungRedis freezes Redis (SIGSTOP) instead of killing it: connections stay
// open and nothing answers, so only the client timeouts notice.
func TestEnginesHungRedis(t *testing.T) {
	t.Parallel()
	srv := MustPrivateRedis(t)
	r, _ := MustEngines(t, quota.EnginesConfig{DefaultURL: srv.URL()})
	ctx := context.Background()
	route := vocab.Route{FailMode: vocab.FailOpen}
	req := quota.Request{Org: testenv.ID(t, "org"), Metric: "requests", Cost: 1}
	if _, out, err := r.Check(ctx, route, req); err != nil || out.Degraded {
		t.Fatalf("healthy check: %+v, %v", out, err)
	}

	if err := srv.srv.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = srv.srv.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	defer resume()
	hang := time.Now()
	var slowest time.Duration
	for r.PoolStates()[quota.DefaultPool] != "open" {
		if time.Since(hang) > 3*time.Second {
			t.Fatalf("breaker still %s 3s into the hang", r.PoolStates()[quota.DefaultPool])
		}
		t0 := time.Now()
		res, out, err := r.Check(ctx, route, req)
		slowest = max(slowest, time.Since(t0))
		if err != nil || !out.Degraded || !res.Allowed {
			t.Fatalf("check during the hang: %+v, %+v, %v; want allowed, degraded", res, out, err)
		}
	}
	opened := time.Since(hang)
	t.Logf("hung Redis: breaker open after %v; slowest answer before that %v (RedisTimeout 100ms)", opened, slowest)
	if opened > time.Second {
		t.Errorf("breaker opened after %v, want within 1s", opened)
	}
	lat := make([]time.Duration, 0, 200)
	for range 200 {
		t0 := time.Now()
		if _, out, err := r.Check(ctx, route, req); err != nil || !out.Degraded {
			t.Fatalf("check while open: %+v, %v", out, err)
		}
		lat = append(lat, time.Since(t0))
		time.Sleep(7 * time.Millisecond)
	}
	t.Logf("hung Redis: p99 of 200 degraded answers %v (max %v; includes half-open probes that time out)", p99(lat), maxDur(lat))
	if p := p99(lat); p > 150*time.Millisecond {
		t.Errorf("p99 of degraded answers %v, want under 150ms (probes wait RedisTimeout)", p)
	}

	resume()
	back := time.Now()
	for {
		_, out, err := r.Check(ctx, route, req)
		if err == nil && !out.Degraded && r.PoolStates()[quota.DefaultPool] == "closed" {
			break
		}
		if time.Since(back) > 5*time.Second {
			t.Fatalf("breaker %s 5s after Redis resumed", r.PoolStates()[quota.DefaultPool])
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("hung Redis: breaker closed %v after Redis resumed", time.Since(back))
}
