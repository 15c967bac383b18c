package quota_test

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"math"
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

// Three replicas draw on two capacities at once with checks naming both (tokens and
// requests), from orgs of weights 1 to 4, some refused by their own limits, one in
// Shadow mode, some with their callers gone within a few ms: no real span of one
// window admits more than either limit.
func TestCapacityTwoCapacitiesThreeReplicasUnderRace(t *testing.T) {
	rs := replicas(t, 3)
	x := quota.Capacity{ID: "x", Metric: "tokens", Window: vocab.Second, Limit: 600}
	y := quota.Capacity{ID: "y", Metric: "requests", Window: vocab.Second, Limit: 60, Saturation: 1}
	base := time.Now()
	stop := base.Add(4 * time.Second)
	var mu sync.Mutex
	var tokens, requests []admission
	var cancelled, refused int
	var wg sync.WaitGroup
	for w := range 12 {
		org := fmt.Sprintf("o%d", w%4)
		r := rs[w%3]
		wg.Go(func() {
			n := int64(w)
			for time.Now().Before(stop) {
				n = n*6364136223846793005 + 1442695040888963407
				cost := 1 + int64(uint64(n)>>33)%30
				req := quota.Request{Org: org, Metric: "tokens", Cost: cost, More: []quota.MetricCost{{Metric: "requests", Cost: 1}},
					Capacities: []quota.CapacityDraw{{Capacity: x, Member: org, Weight: int64(1 + w%4)}, {Capacity: y, Member: org, Weight: int64(1 + w%4)}}}
				if org == "o1" {
					req.Limits.Org = []vocab.Limit{lim(vocab.Second, 100)}
				}
				if org == "o3" {
					req.Mode = vocab.Shadow
				}
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if uint64(n)>>60 == 0 { // one in 16: the caller leaves within 0-3 ms
					ctx, cancel = context.WithTimeout(ctx, time.Duration(uint64(n)>>40%3000)*time.Microsecond)
				}
				t0 := time.Now()
				res, _, err := r.Check(ctx, vocab.Route{}, req)
				t1 := time.Now()
				cancel()
				mu.Lock()
				switch {
				case err != nil:
					cancelled++
				case !res.Allowed:
					refused++
				case res.WouldBlock != nil && res.WouldBlock.Level == vocab.LevelCapacity:
					// shadow past a capacity: admitted, not drawn
				default:
					a := admission{ms: t0.Sub(base).Microseconds(), end: t1.Sub(base).Microseconds()}
					a.cost = cost
					tokens = append(tokens, a)
					a.cost = 1
					requests = append(requests, a)
				}
				mu.Unlock()
				if err == nil && !res.Allowed {
					time.Sleep(min(res.RetryAfter, 5*time.Millisecond))
				}
			}
		})
	}
	wg.Wait()
	for _, adm := range [][]admission{tokens, requests} {
		slices.SortFunc(adm, func(a, b admission) int { return cmp.Compare(a.ms, b.ms) })
	}
	sec := time.Second.Microseconds()
	wt, wr := worstCertainSpan(tokens, sec), worstCertainSpan(requests, sec)
	t.Logf("3 replicas, 2 capacities: %d tokens and %d requests admitted in windows 2-4 (of %d and %d), %d refused, %d callers gone; worst real spans %d of %d tokens, %d of %d requests",
		admittedIn(tokens, sec, 4*sec), admittedIn(requests, sec, 4*sec), 3*x.Limit, 3*y.Limit, refused, cancelled, wt, x.Limit, wr, y.Limit)
	if wt > x.Limit || wr > y.Limit {
		t.Errorf("a real span of one window admitted %d tokens (limit %d), %d requests (limit %d)", wt, x.Limit, wr, y.Limit)
	}
}

// A check whose caller leaves while its draw waits on a busy Redis fails with the
// caller's error, and the grant Redis then counts (its reply lost) stays counted until
// it leaves the window: at most a grant, limit / (16 x replicas) or the cost.
func TestCapacityCallerGoneMidDrawLosesAtMostAGrant(t *testing.T) {
	p := MustPrivateRedis(t)
	r, _ := MustEngines(t, quota.EnginesConfig{DefaultURL: p.URL(), RedisTimeout: time.Second})
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Hour, Limit: 1600}
	req := capReq("a", c, 1)
	var admitted int64
	for range 200 { // a rate, so the next grant is the largest: 1600 / 16
		if res, _, err := r.Check(context.Background(), vocab.Route{}, req); err != nil || !res.Allowed {
			t.Fatalf("%+v %v", res, err)
		}
		admitted++
	}
	time.Sleep(300 * time.Millisecond) // the grant ends and gives back what it holds
	busy := busyRedis(t, p, 400*time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, _, err := r.Check(ctx, vocab.Route{}, req)
	cancel()
	busy.Wait()
	if err == nil {
		t.Fatal("a check whose caller left: no error")
	}
	time.Sleep(300 * time.Millisecond)
	w, err := r.CapacityWindow(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	lost := w.Used - admitted
	t.Logf("caller gone mid-draw: the window counts %d, %d admitted: %d lost (at most %d)", w.Used, admitted, lost, c.Limit/16)
	if lost < 0 || lost > c.Limit/16 {
		t.Errorf("lost %d units to a draw whose caller left, want 0 to %d", lost, c.Limit/16)
	}
	if res, _, err := r.Check(context.Background(), vocab.Route{}, req); err != nil || !res.Allowed {
		t.Fatalf("the member's next check: %+v %v", res, err)
	}
}

// A replica closed with live grants loses them (at most limit / (16 x replicas) per
// member, counted until they leave the window), and its grants' timers ending after
// it closed do nothing.
func TestCapacityReplicaClosedWithLiveGrants(t *testing.T) {
	rs := replicas(t, 2)
	ctx := context.Background()
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Minute, Limit: 3200}
	var admitted int64
	t0 := time.Now()
	for time.Since(t0) < 200*time.Millisecond {
		res, _, err := rs[0].Check(ctx, vocab.Route{}, capReq("a", c, 1))
		if err != nil || !res.Allowed {
			t.Fatalf("%+v %v", res, err)
		}
		admitted++
	}
	if err := rs[0].Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := rs[0].Check(ctx, vocab.Route{}, capReq("a", c, 1)); err == nil {
		t.Fatal("a closed replica checked")
	}
	time.Sleep(300 * time.Millisecond) // the closed replica's grant timers fire
	w, err := rs[1].CapacityWindow(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	lost := w.Used - admitted
	t.Logf("replica closed after %d admitted: the window counts %d, %d lost (at most %d)", admitted, w.Used, lost, c.Limit/32)
	if lost < 0 || lost > c.Limit/32 {
		t.Errorf("lost %d, want 0 to %d", lost, c.Limit/32)
	}
}

// Redis losing a capacity's state (FLUSHALL, scripts too) mid-run does not fail a
// check, and the real spans across the loss admit at most one limit more.
func TestCapacityRedisFlushedMidRun(t *testing.T) {
	p := MustPrivateRedis(t)
	prefix := testenv.ID(t, "qc")
	var rs []*quota.Engines
	for range 2 {
		r, _ := MustEngines(t, quota.EnginesConfig{DefaultURL: p.URL(), Replicas: 2, RedisTimeout: 2 * time.Second, Engine: quota.Config{KeyPrefix: prefix}})
		rs = append(rs, r)
	}
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Second, Limit: 200}
	base := time.Now()
	go func() {
		time.Sleep(1500 * time.Millisecond)
		p.raw.FlushAll(context.Background())
		p.raw.ScriptFlush(context.Background())
	}()
	var mu sync.Mutex
	var all []admission
	var wg sync.WaitGroup
	for _, org := range []string{"a", "b"} {
		wg.Go(func() {
			adm := flood(t, rs, capReq(org, c, 1), 4, base, base.Add(3*time.Second))
			mu.Lock()
			all = append(all, adm...)
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortFunc(all, func(x, y admission) int { return cmp.Compare(x.ms, y.ms) })
	sec := time.Second.Microseconds()
	worst := worstCertainSpan(all, sec)
	t.Logf("flushed at 1.5 s: worst real span %d of %d (at most %d across the loss); windows 1 and 3: %d, %d",
		worst, c.Limit, 2*c.Limit, admittedIn(all, 0, sec), admittedIn(all, 2*sec, 3*sec))
	if worst > 2*c.Limit {
		t.Errorf("a real span of one window admitted %d across the loss, over 2 x %d", worst, c.Limit)
	}
}

// Numbers at vocab.MaxUnits: counts, room and shares stay exact (Lua doubles hold
// them below 2^53), a refusal's retry is within a window and a sub-bucket, and a cost
// above the limit never fits.
func TestCapacityHostileNumbers(t *testing.T) {
	r := replicas(t, 1)[0]
	ctx := context.Background()
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Minute, Limit: vocab.MaxUnits, Saturation: 0.001}
	check := func(org string, w, cost int64) vocab.Result {
		t.Helper()
		req := capReq(org, c, w)
		req.Cost = cost
		res, _, err := r.Check(ctx, vocab.Route{}, req)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := check("a", 1000, vocab.MaxUnits-1); !res.Allowed {
		t.Fatalf("a alone, MaxUnits - 1 of MaxUnits: %+v", res)
	}
	res := check("b", 1, 2)
	t.Logf("b's 2 with 1 left: allowed %v, retry %v", res.Allowed, res.RetryAfter)
	if res.Allowed || res.RetryAfter <= 0 || res.RetryAfter > time.Minute*21/20 {
		t.Fatalf("b's 2 with 1 left: %+v, want refused with a retry in (0, 63 s]", res)
	}
	if res := check("b", 1, 1); !res.Allowed {
		t.Fatalf("b's 1 with 1 left: %+v", res)
	}
	if res := check("a", 1000, 1); res.Allowed {
		t.Fatalf("a's 1 with none left: %+v", res)
	}
	w, err := r.CapacityWindow(ctx, c)
	if err != nil || w.Used != vocab.MaxUnits || len(w.Members) != 2 {
		t.Fatalf("window %+v %v, want MaxUnits used by 2", w, err)
	}
	for _, m := range w.Members {
		if m.Share < 0 || m.Share > vocab.MaxUnits || m.ID == "b" && m.Used != 1 || m.ID == "a" && m.Used != vocab.MaxUnits-1 {
			t.Fatalf("member %+v", m)
		}
	}
	c.Limit--
	if res := check("c", 1, vocab.MaxUnits); res.Allowed || res.RetryAfter != time.Minute {
		t.Fatalf("MaxUnits on a limit of MaxUnits - 1: %+v, want refused with a window's retry", res)
	}
}

// Weights 1000 and 1: one member of weight 1000 beside 20 of weight 1 on a capacity of
// 1,000 a second gets about 1000/1020 of it, each of the others about one unit a
// window (a share of 0.98), and no window passes the limit.
func TestCapacityWeights1000And1ManyMembers(t *testing.T) {
	rs := replicas(t, 2)
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Second, Limit: 1000}
	base := time.Now()
	sec := time.Second.Microseconds()
	var mu sync.Mutex
	var heavy, all []admission
	var wg sync.WaitGroup
	wg.Go(func() {
		adm := flood(t, rs, capReq("big", c, 1000), 4, base, base.Add(3*time.Second))
		mu.Lock()
		heavy = adm
		all = append(all, adm...)
		mu.Unlock()
	})
	for i := range 20 {
		wg.Go(func() {
			adm := flood(t, rs[i%2:i%2+1], capReq(fmt.Sprintf("s%d", i), c, 1), 1, base, base.Add(3*time.Second))
			mu.Lock()
			all = append(all, adm...)
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortFunc(all, func(x, y admission) int { return cmp.Compare(x.ms, y.ms) })
	h, tot, worst := admittedIn(heavy, sec, 3*sec), admittedIn(all, sec, 3*sec), worstCertainSpan(all, sec)
	t.Logf("weight 1000 beside 20 of weight 1, windows 2-3: %d of %d admitted (%.1f %%, want about 98), the others %d; worst real span %d of %d",
		h, tot, 100*float64(h)/float64(tot), tot-h, worst, c.Limit)
	if float64(h) < 0.9*float64(tot) || tot-h < 20 || tot-h > 200 {
		t.Errorf("weight 1000 got %d of %d, the 20 of weight 1 %d", h, tot, tot-h)
	}
	if worst > c.Limit {
		t.Errorf("a real span of one window admitted %d, over the capacity's %d", worst, c.Limit)
	}
}

// Saturation at its extremes: at 0.001 shares hold nearly always, and an org alone
// still uses the whole capacity; at 1 they hold only once the window is full or
// contended, and weights 1 and 3 still get 25 and 75 %.
func TestCapacitySaturationExtremes(t *testing.T) {
	sec := time.Second.Microseconds()
	t.Run("0.001 alone", func(t *testing.T) {
		rs := replicas(t, 2)
		c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Second, Limit: 300, Saturation: 0.001}
		base := time.Now()
		adm := flood(t, rs, capReq("a", c, 1), 6, base, base.Add(3*time.Second))
		got, worst := admittedIn(adm, sec, 3*sec), worstCertainSpan(adm, sec)
		t.Logf("saturation 0.001, one org alone: %d of %d in windows 2-3, worst real span %d", got, 2*c.Limit, worst)
		if got < 2*c.Limit*9/10 || worst > c.Limit {
			t.Errorf("got %d of %d, worst span %d", got, 2*c.Limit, worst)
		}
	})
	t.Run("1 weights 1 and 3", func(t *testing.T) {
		rs := replicas(t, 2)
		c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Second, Limit: 200, Saturation: 1}
		base := time.Now()
		var a, b []admission
		var wg sync.WaitGroup
		wg.Go(func() { a = flood(t, rs, capReq("free", c, 1), 4, base, base.Add(4*time.Second)) })
		wg.Go(func() { b = flood(t, rs, capReq("pro", c, 3), 4, base, base.Add(4*time.Second)) })
		wg.Wait()
		na, nb := admittedIn(a, sec, 4*sec), admittedIn(b, sec, 4*sec)
		sa := 100 * float64(na) / float64(na+nb)
		all := append(slices.Clone(a), b...)
		slices.SortFunc(all, func(x, y admission) int { return cmp.Compare(x.ms, y.ms) })
		worst := worstCertainSpan(all, sec)
		t.Logf("saturation 1, weights 1 and 3, windows 2-4: %.1f %% and %.1f %% of %d, worst real span %d", sa, 100-sa, na+nb, worst)
		if sa < 20 || sa > 30 || worst > c.Limit {
			t.Errorf("weight 1 got %.1f %%, want 25 +-5; worst span %d", sa, worst)
		}
	})
}

// A fair-share org limit beside an operator's capacity on the same metric: a check
// draws on both, the teams share the org's limit, the orgs the operator's, and a
// check the org's limit refuses gives the operator's capacity its units back.
func TestCapacityFairShareBesideAnOperators(t *testing.T) {
	r := replicas(t, 1)[0]
	ctx := context.Background()
	op := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Minute, Limit: 100}
	fs := quota.Capacity{ID: "acme", FairShare: true, Metric: "tokens", Window: vocab.Minute, Limit: 10}
	req := func(org, team string, cost int64) quota.Request {
		ds := []quota.CapacityDraw{{Capacity: op, Member: org, Weight: 1}}
		if org == "acme" {
			ds = append(ds, quota.CapacityDraw{Capacity: fs, Member: team, Weight: 1})
		}
		return quota.Request{Org: org, Team: team, Metric: "tokens", Cost: cost, Capacities: ds}
	}
	for i, s := range []struct {
		org, team string
		cost      int64
		allow     bool
		level     vocab.Level
	}{
		{"acme", "web", 6, true, ""},
		{"acme", "batch", 4, true, ""},
		{"acme", "web", 1, false, vocab.LevelOrg}, // the org's limit, shared: full
		{"other", "x", 90, true, ""},              // the operator's: 100 - 10, once acme's grant ended
		{"other", "x", 1, false, vocab.LevelCapacity},
	} {
		if s.org == "other" && s.cost == 90 {
			time.Sleep(300 * time.Millisecond) // a grant's life: acme's grant gives back what it holds
		}
		res, _, err := r.Check(ctx, vocab.Route{}, req(s.org, s.team, s.cost))
		if err != nil || res.Allowed != s.allow || !s.allow && res.BlockedAt.Level != s.level {
			t.Fatalf("step %d %+v: %+v at %+v %v", i+1, s, res, res.BlockedAt, err)
		}
	}
	w, err := r.CapacityWindow(ctx, op)
	if err != nil || w.Used != 100 {
		t.Fatalf("operator's window %+v %v, want 100: the check the org's limit refused kept its units", w, err)
	}
}

// A refusal answered in process tells the same retry as the one Redis gave, less the
// time since: not the in-process spell's end.
func TestCapacityRefusalInProcessTellsTheRetry(t *testing.T) {
	r := replicas(t, 1)[0]
	ctx := context.Background()
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Minute, Limit: 10}
	req := capReq("a", c, 1)
	req.Cost = 10
	if res, _, err := r.Check(ctx, vocab.Route{}, req); err != nil || !res.Allowed {
		t.Fatalf("%+v %v", res, err)
	}
	req.Cost = 1
	var retries []time.Duration
	for range 3 {
		res, _, err := r.Check(ctx, vocab.Route{}, req)
		if err != nil || res.Allowed {
			t.Fatalf("%+v %v", res, err)
		}
		retries = append(retries, res.RetryAfter)
	}
	t.Logf("retries of a full minute: %v", retries)
	for _, d := range retries {
		if d < 50*time.Second || d > time.Minute*21/20 {
			t.Errorf("retry %v of a minute filled just now, want 57-63 s", d)
		}
	}
}

// A capacity whose window changes (PATCH, or deleted and made again under its id)
// counts the new window in a state of its own: the old window's sub-bucket indexes
// (a second's are 1,200 times a minute's) would be read as the new window's future:
// what the new window counts at them, and its members' activity, would never leave it.
func TestCapacityWindowChangeCountsApart(t *testing.T) {
	prefix := testenv.ID(t, "qc")
	r, _ := MustEngines(t, quota.EnginesConfig{RedisTimeout: 2 * time.Second, Engine: quota.Config{KeyPrefix: prefix}})
	ctx := context.Background()
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Second, Limit: 10}
	a := capReq("a", c, 1)
	a.Cost = 5
	if res, _, err := r.Check(ctx, vocab.Route{}, a); err != nil || !res.Allowed {
		t.Fatalf("%+v %v", res, err)
	}
	c.Window = vocab.Minute
	b := capReq("b", c, 1)
	b.Cost = 5
	if _, _, err := r.Check(ctx, vocab.Route{}, b); err != nil {
		t.Fatal(err)
	}
	raw := testenv.Redis(t)
	now, err := raw.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	k := float64(now.UnixMilli() / 3000) // the minute's sub-bucket
	found := false
	for _, key := range keys(t, raw, prefix) {
		if !strings.HasSuffix(key, "|a") {
			continue
		}
		score, err := raw.ZScore(ctx, key, "b").Result()
		if err != nil {
			continue // the second's state: b never drew on it
		}
		found = true
		tv, err := raw.HGet(ctx, strings.TrimSuffix(key, "|a")+"|m", "t").Result()
		if err != nil || len(tv) < 8 {
			t.Fatalf("the minute's counts: %q %v", tv, err)
		}
		last := math.Float64frombits(binary.LittleEndian.Uint64([]byte(tv[:8])))
		t.Logf("the minute's sub-bucket %.0f; its state's counts last at %.0f, b active at %.0f", k, last, score)
		if last > k+1 || score > k+1 {
			t.Errorf("the minute's counts are at sub-bucket %.0f, b active at %.0f, past the minute's %.0f: they never leave it",
				last, score, k)
		}
	}
	if !found {
		t.Fatal("no state holds b's draw")
	}
}

// Give-backs that reach Redis sub-buckets after the ones they were counted in: an org
// whose own limit refuses most of its checks draws and gives back all the time, on
// two replicas, beside an org that takes all it can. The window never passes the
// limit (a give-back never frees units admitted), the refused org holds in the
// capacity no more than its admitted units and its grants, and what it leaves is the
// other's: refused by the capacity once it is full, it would be held wanting its
// weight's share (150 of 200) for a window, the other held to 50, though its own limit
// lets it use 20, were it not content again once its own limit refuses it and it is
// given all it asks (held wanting: 56-75 % of the capacity used, the other's windows
// alternating between about 170 and 50).
func TestCapacityGiveBacksAcrossSubBuckets(t *testing.T) {
	rs := replicas(t, 2)
	ctx := context.Background()
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Second, Limit: 200}
	base := time.Now()
	sec := time.Second.Microseconds()
	var mu sync.Mutex
	var all, capped []admission
	var wg sync.WaitGroup
	refusedReq := capReq("r", c, 3)
	refusedReq.Limits.Org = []vocab.Limit{lim(vocab.Second, 20)}
	for _, req := range []quota.Request{refusedReq, capReq("b", c, 1)} {
		wg.Go(func() {
			adm := flood(t, rs, req, 4, base, base.Add(4*time.Second))
			mu.Lock()
			all = append(all, adm...)
			if req.Org == "r" {
				capped = adm
			}
			mu.Unlock()
		})
	}
	held := int64(0)
	wg.Go(func() {
		for range 6 {
			time.Sleep(600 * time.Millisecond)
			w, err := rs[0].CapacityWindow(ctx, c)
			if err != nil {
				t.Error(err)
				return
			}
			for _, m := range w.Members {
				if m.ID == "r" {
					mu.Lock()
					held = max(held, m.Used)
					mu.Unlock()
				}
			}
		}
	})
	wg.Wait()
	slices.SortFunc(all, func(x, y admission) int { return cmp.Compare(x.ms, y.ms) })
	got, worst := admittedIn(all, sec, 4*sec), worstCertainSpan(all, sec)
	t.Logf("an org refused by its own limit (20) beside one taking all: %d of %d in windows 2-4, %d of them the capped org's; worst real span %d of %d; the capped org held at most %d",
		got, 3*c.Limit, admittedIn(capped, sec, 4*sec), worst, c.Limit, held)
	if worst > c.Limit {
		t.Errorf("a real span of one window admitted %d, over the capacity's %d", worst, c.Limit)
	}
	// its 20 admitted a window (and a few of a window before), two grants of 6
	if held > 20+20+2*c.Limit/32 {
		t.Errorf("the refused org held %d of the capacity: its refused checks' draws did not come back", held)
	}
	if got < 3*c.Limit*85/100 || admittedIn(capped, sec, 4*sec) < 3*20*3/4 {
		t.Errorf("admitted %d of %d, %d of them the capped org's (its limit 3 x 20)", got, 3*c.Limit, admittedIn(capped, sec, 4*sec))
	}
}

// A capacity's Redis that does not answer is met behind its breaker, as an org's is:
// checks naming the capacity are answered by their fail mode (open: admitted,
// degraded) at once, not each after a timeout with its member's other checks queued
// behind it.
func TestCapacityDrawsBehindTheBreaker(t *testing.T) {
	p := MustPrivateRedis(t)
	r, _ := MustEngines(t, quota.EnginesConfig{DefaultURL: p.URL()})
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Second, Limit: 1000}
	route := vocab.Route{FailMode: vocab.FailOpen}
	if res, _, err := r.Check(context.Background(), route, capReq("a", c, 1)); err != nil || !res.Allowed {
		t.Fatalf("%+v %v", res, err)
	}
	busy := busyRedis(t, p, 3*time.Second)
	defer busy.Wait()
	time.Sleep(20 * time.Millisecond)
	t0 := time.Now()
	var mu sync.Mutex
	var n, degraded int
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for time.Since(t0) < 2*time.Second {
				res, out, err := r.Check(context.Background(), route, capReq("a", c, 1))
				mu.Lock()
				n++
				if err == nil && res.Allowed && out.Degraded {
					degraded++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("a hung Redis for 2 s, 8 callers of one org naming a capacity: %d checks answered, %d admitted degraded", n, degraded)
	if n < 2000 || degraded < n*9/10 {
		t.Errorf("%d checks answered in 2 s, %d admitted degraded", n, degraded)
	}
}
