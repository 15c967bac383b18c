package quota_test

import (
	"context"
	"sync"
	"testing"
	"time"

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
