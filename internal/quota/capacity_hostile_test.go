package quota_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
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

// Checks costing more than a member's share are still admitted while the member is
// under its share: a capacity whose members all ask more than their share at once is
// not refused whole while it sits empty.
func TestCapacityCostsAboveTheShareAreAdmitted(t *testing.T) {
	rs := replicas(t, 2)
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Second, Limit: 10}
	base := time.Now()
	sec := time.Second.Microseconds()
	var mu sync.Mutex
	var all []admission
	var wg sync.WaitGroup
	for _, org := range []string{"a", "b", "c"} {
		wg.Go(func() {
			req := capReq(org, c, 1)
			req.Cost = 4
			adm := flood(t, rs, req, 2, base, base.Add(3*time.Second))
			mu.Lock()
			all = append(all, adm...)
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortFunc(all, func(x, y admission) int { return cmp.Compare(x.ms, y.ms) })
	got, worst := admittedIn(all, sec, 3*sec), worstCertainSpan(all, sec)
	t.Logf("3 orgs of weight 1 asking 4 at a time of 10 a second: %d in windows 2-3 (at most 16), worst real span %d", got, worst)
	if got < 12 {
		t.Errorf("admitted %d of 16 in 2 windows: the capacity sat idle", got)
	}
	if worst > c.Limit {
		t.Errorf("a real span of one window admitted %d, over the capacity's %d", worst, c.Limit)
	}
}

// Many members of weight 1 on a limit smaller than their number (a share of half a
// unit): the capacity admits its limit, and a member under its share is admitted when
// units come free, so few members go without over four windows.
func TestCapacityManyMembersSharesUnderOneUnit(t *testing.T) {
	rs := replicas(t, 3)
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Second, Limit: 20}
	base := time.Now()
	sec := time.Second.Microseconds()
	var mu sync.Mutex
	var all []admission
	var counts []int64
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			adm := flood(t, rs[i%3:i%3+1], capReq(fmt.Sprintf("m%d", i), c, 1), 1, base, base.Add(5*time.Second))
			mu.Lock()
			all = append(all, adm...)
			counts = append(counts, admittedIn(adm, sec, 5*sec))
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortFunc(all, func(x, y admission) int { return cmp.Compare(x.ms, y.ms) })
	slices.Sort(counts)
	got, worst := admittedIn(all, sec, 5*sec), worstCertainSpan(all, sec)
	none := len(counts) - len(slices.DeleteFunc(slices.Clone(counts), func(n int64) bool { return n == 0 }))
	t.Logf("40 members of weight 1 on 20 a second, windows 2-5: %d admitted (at most 80), %d members none, each member's %v, worst real span %d",
		got, none, counts, worst)
	if got < 64 || none > 6 {
		t.Errorf("admitted %d of 80 in 4 windows, %d of 40 members none", got, none)
	}
	if worst > c.Limit {
		t.Errorf("a real span of one window admitted %d, over the capacity's %d", worst, c.Limit)
	}
}

// The view of a capacity with 512 active members reads each once: one member's share
// computed per member, each reading them all, held Redis 1.2 s.
func TestCapacityViewOfManyMembersReadsEachOnce(t *testing.T) {
	r := replicas(t, 1)[0]
	ctx := context.Background()
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Hour, Limit: 1 << 40}
	cs := make([]quota.Check, 512)
	var W int64
	for i := range cs {
		cs[i] = quota.Check{Request: capReq(fmt.Sprintf("m%d", i), c, int64(1+i%7))}
		W += int64(1 + i%7)
	}
	r.Decide(ctx, cs)
	for _, ch := range cs {
		if ch.Err != nil || !ch.Result.Allowed {
			t.Fatalf("%+v %v", ch.Result, ch.Err)
		}
	}
	t0 := time.Now()
	w, err := r.CapacityWindow(ctx, c)
	took := time.Since(t0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("view of %d members: %v", len(w.Members), took)
	if len(w.Members) != 512 || w.Used != 512 {
		t.Fatalf("view of %d members, %d used, want 512 and 512", len(w.Members), w.Used)
	}
	for _, m := range w.Members {
		if m.Used != 1 || m.Share < c.Limit*m.Weight/W {
			t.Fatalf("member %+v: want 1 used and at least its weight's part %d", m, c.Limit*m.Weight/W)
		}
	}
	if took > 400*time.Millisecond {
		t.Errorf("the view took %v", took)
	}
}

// A reservation draws its amount on its capacities, all or nothing with its own
// limits, as a check does: one past the capacity is refused naming it, and one its own
// limits refuse gives its draw back.
func TestCapacityReservationDrawsItsAmount(t *testing.T) {
	r := replicas(t, 1)[0]
	ctx := context.Background()
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Minute, Limit: 10}
	req := capReq("a", c, 1)
	req.Cost = 8
	if rsv, res, err := r.Reserve(ctx, vocab.Route{}, req, quota.ReserveOptions{}); err != nil || !res.Allowed || rsv.Amount != 8 {
		t.Fatalf("reservation of 8 of 10: %+v %+v %v", rsv, res, err)
	}
	req.Cost = 5
	rsv, res, err := r.Reserve(ctx, vocab.Route{}, req, quota.ReserveOptions{})
	want := vocab.Blocked{Metric: "tokens", Level: vocab.LevelCapacity, ID: "gpu", Window: vocab.Minute}
	if err != nil || res.Allowed || res.BlockedAt == nil || *res.BlockedAt != want || res.RetryAfter <= 0 || rsv.ID != "" {
		t.Fatalf("reservation of 5 more: %+v %+v at %+v %v, want refused at %+v", rsv, res, res.BlockedAt, err, want)
	}
	b := capReq("b", c, 1)
	b.Cost = 2
	b.Limits.Org = []vocab.Limit{lim(vocab.Minute, 1)}
	if _, res, err := r.Reserve(ctx, vocab.Route{}, b, quota.ReserveOptions{}); err != nil || res.Allowed {
		t.Fatalf("b's reservation of 2 past its limit of 1: %+v %v", res, err)
	}
	time.Sleep(300 * time.Millisecond) // a grant's life: what b's grant held is back
	if w, err := r.CapacityWindow(ctx, c); err != nil || w.Used != 8 {
		t.Fatalf("window %+v %v, want the 8 reserved", w, err)
	}
}
