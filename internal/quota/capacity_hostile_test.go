package quota_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// busyRedis keeps redis p busy running a script for d, from a goroutine: commands sent
// meanwhile wait in their sockets and run once it ends, after their callers timed out.
func busyRedis(t *testing.T, p *privateRedis, d time.Duration) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	wg.Go(func() {
		script := `local t0 = redis.call('TIME') local s0 = t0[1] * 1e6 + t0[2]
while true do local t = redis.call('TIME') if t[1] * 1e6 + t[2] - s0 >= tonumber(ARGV[1]) then return 1 end end`
		if err := p.raw.Eval(context.Background(), script, nil, d.Microseconds()).Err(); err != nil {
			t.Error(err)
		}
	})
	return &wg
}

// A give-back whose reply is lost (the call timed out, Redis ran it afterwards) is not
// given again: units given back twice would free units other checks were admitted
// with, and the window would admit past its limit.
func TestCapacityGiveBackWhoseReplyIsLostIsNotGivenTwice(t *testing.T) {
	p := MustPrivateRedis(t)
	r, _ := MustEngines(t, quota.EnginesConfig{DefaultURL: p.URL(), RedisTimeout: 150 * time.Millisecond})
	ctx := context.Background()
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Hour, Limit: 10}
	// a's check of 5 draws 5 and is refused by a's own limit: its grant holds the 5
	a := capReq("a", c, 1)
	a.Cost = 5
	a.Limits.Org = []vocab.Limit{lim(vocab.Hour, 4)}
	if res, _, err := r.Check(ctx, vocab.Route{}, a); err != nil || res.Allowed {
		t.Fatalf("a's check of 5 past its limit of 4: %+v %v", res, err)
	}
	// the grant ends within 250 ms and gives its 5 back, on a Redis busy for 600 ms:
	// the call times out, Redis runs it after
	busyRedis(t, p, 600*time.Millisecond).Wait()
	time.Sleep(100 * time.Millisecond)
	admitted := int64(0)
	b := capReq("b", c, 1)
	b.Cost = 10
	if res, _, err := r.Check(ctx, vocab.Route{}, b); err != nil {
		t.Fatal(err)
	} else if res.Allowed {
		admitted += 10
	}
	a.Cost, a.Limits = 1, quota.LevelLimits{}
	for range 6 {
		res, _, err := r.Check(ctx, vocab.Route{}, a)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			admitted++
		}
	}
	w, err := r.CapacityWindow(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("admitted %d of a limit of %d; the window counts %d", admitted, c.Limit, w.Used)
	if admitted > c.Limit {
		t.Errorf("admitted %d in one window of a capacity of %d: units given back twice", admitted, c.Limit)
	}
}

// Every key a draw writes expires: a capacity drawn on once (its counts), or whose
// last draw was its first refusal (the refusal's record).
func TestCapacityKeysOfOneDrawExpire(t *testing.T) {
	prefix := testenv.ID(t, "qc")
	r, _ := MustEngines(t, quota.EnginesConfig{RedisTimeout: 2 * time.Second, Engine: quota.Config{KeyPrefix: prefix}})
	ctx := context.Background()
	once := quota.Capacity{ID: "once", Metric: "tokens", Window: vocab.Second, Limit: 1}
	full := quota.Capacity{ID: "full", Metric: "tokens", Window: vocab.Second, Limit: 1}
	for _, c := range []quota.Capacity{once, full, full} {
		if _, _, err := r.Check(ctx, vocab.Route{}, capReq("a", c, 1)); err != nil {
			t.Fatal(err)
		}
	}
	raw := testenv.Redis(t)
	n := 0
	for _, k := range keys(t, raw, prefix) {
		if !strings.Contains(k, "{cap|") {
			continue
		}
		n++
		if ttl, err := raw.PTTL(ctx, k).Result(); err != nil || ttl < 0 {
			t.Errorf("key %s: TTL %v %v, want one", k, ttl, err)
		}
	}
	if n < 9 {
		t.Fatalf("%d capacity keys, want 4 of once and 5 of full", n)
	}
}

// A check costing more than the capacity's limit can never be admitted: it is refused
// with a retry of at most a window, and it does not make others share: an org below
// the saturation point still gets what is there.
func TestCapacityCostAboveTheLimitDoesNotContend(t *testing.T) {
	r := replicas(t, 1)[0]
	ctx := context.Background()
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Minute, Limit: 100}
	a := capReq("a", c, 1)
	a.Cost = 10
	for i := range 6 {
		if res, _, err := r.Check(ctx, vocab.Route{}, a); err != nil || !res.Allowed {
			t.Fatalf("a's check %d: %+v %v", i+1, res, err)
		}
	}
	m := capReq("m", c, 1)
	m.Cost = 1000
	res, _, err := r.Check(ctx, vocab.Route{}, m)
	if err != nil || res.Allowed {
		t.Fatalf("m's check of 1000 on a capacity of 100: %+v %v", res, err)
	}
	t.Logf("m's check of 1000 on 100: retry %v", res.RetryAfter)
	if res.RetryAfter <= 0 || res.RetryAfter > time.Minute {
		t.Errorf("retry %v, want (0, 1m]", res.RetryAfter)
	}
	if res, _, err := r.Check(ctx, vocab.Route{}, a); err != nil || !res.Allowed {
		t.Fatalf("a at 60 of 100 after m's impossible check: %+v at %+v %v", res, res.BlockedAt, err)
	}
}

// A member whose check was refused for its cost is not refused in process a smaller
// check that fits.
func TestCapacitySmallerCheckAfterARefusedLargerOneFits(t *testing.T) {
	r := replicas(t, 1)[0]
	ctx := context.Background()
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Minute, Limit: 100}
	a := capReq("a", c, 1)
	for _, s := range []struct {
		cost  int64
		allow bool
	}{{60, true}, {50, false}, {10, true}, {30, true}, {1, false}} {
		a.Cost = s.cost
		res, _, err := r.Check(ctx, vocab.Route{}, a)
		if err != nil || res.Allowed != s.allow {
			t.Fatalf("a's check of %d: allowed %v at %+v %v, want %v", s.cost, res.Allowed, res.BlockedAt, err, s.allow)
		}
	}
}
