package quota_test

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// replicas starts n routers sharing one key prefix: n api replicas of one Redis.
func replicas(t *testing.T, n int) []*quota.Engines {
	t.Helper()
	prefix := testenv.ID(t, "qc")
	out := make([]*quota.Engines, n)
	for i := range out {
		// a loaded machine's Redis may take more than the default 100 ms
		out[i], _ = MustEngines(t, quota.EnginesConfig{Replicas: n, RedisTimeout: 2 * time.Second, Engine: quota.Config{KeyPrefix: prefix}})
	}
	return out
}

// capReq is a one-unit check of org drawing on capacity c with weight.
func capReq(org string, c quota.Capacity, weight int64) quota.Request {
	return quota.Request{Org: org, Metric: c.Metric, Cost: 1,
		Capacities: []quota.CapacityDraw{{Capacity: c, Member: org, Weight: weight}}}
}

// flood checks req from workers goroutines spread over rs until stop, pacing a
// refused worker by its retry (at most 5 ms), and returns the admissions (µs from
// base), sorted.
func flood(t *testing.T, rs []*quota.Engines, req quota.Request, workers int, base, stop time.Time) []admission {
	t.Helper()
	var mu sync.Mutex
	var adm []admission
	var wg sync.WaitGroup
	for w := range workers {
		r := rs[w%len(rs)]
		wg.Go(func() {
			for time.Now().Before(stop) {
				t0 := time.Now()
				res, _, err := r.Check(context.Background(), vocab.Route{}, req)
				if err != nil {
					t.Error(err)
					return
				}
				if !res.Allowed {
					time.Sleep(min(res.RetryAfter, 5*time.Millisecond))
					continue
				}
				t1 := time.Now()
				mu.Lock()
				adm = append(adm, admission{ms: t0.Sub(base).Microseconds(), end: t1.Sub(base).Microseconds(), cost: req.Cost})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.SortFunc(adm, func(a, b admission) int { return cmp.Compare(a.ms, b.ms) })
	return adm
}

// admittedIn sums the admissions sent in [from, to) (µs).
func admittedIn(adm []admission, from, to int64) int64 {
	var n int64
	for _, a := range adm {
		if a.ms >= from && a.ms < to {
			n += a.cost
		}
	}
	return n
}

func TestCapacityOneOrgAloneUsesItAndNoWindowPassesIt(t *testing.T) {
	rs := replicas(t, 2)
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Second, Limit: 300}
	base := time.Now()
	adm := flood(t, rs, capReq("acme", c, 1), 8, base, base.Add(4*time.Second))
	worst := worstCertainSpan(adm, time.Second.Microseconds())
	// the first window is the warm-up; three whole windows after it
	got := admittedIn(adm, time.Second.Microseconds(), 4*time.Second.Microseconds())
	t.Logf("one org alone: %d units in 3 windows (%.1f %% of the capacity), worst real span of a window %d of %d",
		got, 100*float64(got)/float64(3*c.Limit), worst, c.Limit)
	if worst > c.Limit {
		t.Errorf("a real span of one window admitted %d, over the capacity's %d", worst, c.Limit)
	}
	if got < 3*c.Limit*9/10 {
		t.Errorf("one org alone used %d of %d in 3 windows: under 90 %%", got, 3*c.Limit)
	}
}

func TestCapacityWeightsShareASaturatedWindow(t *testing.T) {
	rs := replicas(t, 2)
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Second, Limit: 200}
	base := time.Now()
	sec := time.Second.Microseconds()
	var a, b, cc []admission
	var wg sync.WaitGroup
	wg.Go(func() { a = flood(t, rs, capReq("free", c, 1), 4, base, base.Add(14*time.Second)) })
	wg.Go(func() { b = flood(t, rs, capReq("pro", c, 3), 4, base, base.Add(14*time.Second)) })
	// a third org of weight 4 joins at 11 s: shares 1/8, 3/8 and 4/8 from then on
	wg.Go(func() {
		time.Sleep(time.Until(base.Add(11 * time.Second)))
		cc = flood(t, rs, capReq("ent", c, 4), 4, base, base.Add(14*time.Second))
	})
	wg.Wait()
	share := func(adm []admission, from, to int64, all ...[]admission) float64 {
		var tot int64
		for _, x := range all {
			tot += admittedIn(x, from, to)
		}
		return 100 * float64(admittedIn(adm, from, to)) / float64(tot)
	}
	// ten windows after the first
	sa, sb := share(a, sec, 11*sec, a, b), share(b, sec, 11*sec, a, b)
	t.Logf("weights 1 and 3 over windows 2-11: %.1f %% and %.1f %% (want 25 and 75, +-5)", sa, sb)
	if sa < 20 || sa > 30 || sb < 70 || sb > 80 {
		t.Errorf("shares %.1f %% / %.1f %%, want 25 / 75 +-5", sa, sb)
	}
	// the joiner's second and third windows
	sa, sb, sc := share(a, 12*sec, 14*sec, a, b, cc), share(b, 12*sec, 14*sec, a, b, cc), share(cc, 12*sec, 14*sec, a, b, cc)
	t.Logf("after a third org of weight 4 joined, its windows 2-3: %.1f %%, %.1f %%, %.1f %% (want 12.5, 37.5, 50, +-5)", sa, sb, sc)
	if sc < 45 || sc > 55 || sb < 32.5 || sb > 42.5 || sa < 7.5 || sa > 17.5 {
		t.Errorf("shares %.1f / %.1f / %.1f %%, want 12.5 / 37.5 / 50 +-5", sa, sb, sc)
	}
	all := append(append(slices.Clone(a), b...), cc...)
	slices.SortFunc(all, func(x, y admission) int { return cmp.Compare(x.ms, y.ms) })
	if worst := worstCertainSpan(all, sec); worst > c.Limit {
		t.Errorf("a real span of one window admitted %d, over the capacity's %d", worst, c.Limit)
	}
}

// A check its own limits refuse gives its draw back, so nothing of the capacity is
// lost to it; a check the capacity refuses counts nothing at its own levels.
func TestCapacityIsAllOrNothingWithTheOrgsLimits(t *testing.T) {
	r := replicas(t, 1)[0]
	ctx := context.Background()
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Minute, Limit: 10}
	a := capReq("a", c, 1)
	a.Limits.Org = []vocab.Limit{lim(vocab.Minute, 5)}
	var admitted int
	for range 9 {
		res, _, err := r.Check(ctx, vocab.Route{}, a)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			admitted++
		} else if res.BlockedAt == nil || res.BlockedAt.Level != vocab.LevelOrg {
			t.Fatalf("refused by %+v, want the org's own limit", res.BlockedAt)
		}
	}
	if admitted != 5 {
		t.Fatalf("admitted %d of a's checks, want its limit 5", admitted)
	}
	// b gets the other five: a's four refused checks took nothing from the capacity,
	// and what a's grant held for them is back within a grant's life (250 ms)
	time.Sleep(300 * time.Millisecond)
	b := capReq("b", c, 1)
	for i := range 6 {
		res, _, err := r.Check(ctx, vocab.Route{}, b)
		if err != nil {
			t.Fatal(err)
		}
		if i < 5 && !res.Allowed {
			t.Fatalf("b's check %d refused by %+v: the capacity lost units to a's refused checks", i+1, res.BlockedAt)
		}
		if i == 5 {
			want := vocab.Blocked{Metric: "tokens", Level: vocab.LevelCapacity, ID: "gpu", Window: vocab.Minute}
			if res.Allowed || res.BlockedAt == nil || *res.BlockedAt != want || res.RetryAfter <= 0 {
				t.Fatalf("b's sixth check: %+v blocked at %+v, want refused at %+v with a retry", res, res.BlockedAt, want)
			}
		}
	}
	w, err := r.CapacityWindow(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if w.Used != 10 || !w.Saturated || len(w.Members) != 2 {
		t.Fatalf("window %+v, want 10 used by 2 members, saturated", w)
	}
	// a check the capacity refuses counts nothing at its levels
	b.Limits.Org = []vocab.Limit{lim(vocab.Month, 100)}
	res, _, err := r.Check(ctx, vocab.Route{}, b)
	if err != nil || res.Allowed {
		t.Fatalf("check past the capacity: %+v %v", res, err)
	}
	b.Cost = 0
	res, _, err = r.Check(ctx, vocab.Route{}, b)
	if err != nil || len(res.Levels) != 1 || res.Levels[0].Used != 5 {
		t.Fatalf("b's month after 5 admitted and 2 refused: %+v %v, want 5 used", res.Levels, err)
	}
}

// A check naming two capacities is refused whole when one is full, and gives the
// other its units back.
func TestCapacityTwoCapacitiesAllOrNothing(t *testing.T) {
	r := replicas(t, 1)[0]
	ctx := context.Background()
	x := quota.Capacity{ID: "x", Metric: "tokens", Window: vocab.Minute, Limit: 100}
	y := quota.Capacity{ID: "y", Metric: "requests", Window: vocab.Minute, Limit: 1}
	req := quota.Request{Org: "a", Metric: "tokens", Cost: 7, More: []quota.MetricCost{{Metric: "requests", Cost: 1}},
		Capacities: []quota.CapacityDraw{{Capacity: x, Member: "a", Weight: 1}, {Capacity: y, Member: "a", Weight: 1}}}
	for i, want := range []bool{true, false, false} {
		res, _, err := r.Check(ctx, vocab.Route{}, req)
		if err != nil || res.Allowed != want {
			t.Fatalf("check %d: %+v %v, want allowed %v", i+1, res, err, want)
		}
	}
	// the refused checks' draws on x are back within a grant's life (250 ms)
	time.Sleep(300 * time.Millisecond)
	if w, _ := r.CapacityWindow(ctx, x); w.Used != 7 {
		t.Fatalf("x holds %d after one check of 7 admitted and two refused: refused draws were kept", w.Used)
	}
}

// In Shadow mode a capacity's refusal is told (WouldBlock), the check admitted and
// not drawn.
func TestCapacityShadowModeTellsAndAdmits(t *testing.T) {
	r := replicas(t, 1)[0]
	ctx := context.Background()
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Minute, Limit: 2}
	req := capReq("a", c, 1)
	req.Mode = vocab.Shadow
	for i := range 4 {
		res, _, err := r.Check(ctx, vocab.Route{}, req)
		if err != nil || !res.Allowed {
			t.Fatalf("shadow check %d: %+v %v", i+1, res, err)
		}
		if (i >= 2) != (res.WouldBlock != nil) {
			t.Fatalf("shadow check %d would block at %+v", i+1, res.WouldBlock)
		}
		if i >= 2 && res.WouldBlock.Level != vocab.LevelCapacity {
			t.Fatalf("would block at %+v, want the capacity", res.WouldBlock)
		}
	}
	if w, _ := r.CapacityWindow(ctx, c); w.Used != 2 {
		t.Fatalf("capacity used %d, want 2: shadow checks past it are not drawn", w.Used)
	}
}

// A fair-share org limit shares its window among teams by weight, the same way, and a
// refusal names the org's limit.
func TestCapacityFairShareTeamsByWeight(t *testing.T) {
	rs := replicas(t, 2)
	c := quota.Capacity{ID: "acme", FairShare: true, Metric: "tokens", Window: vocab.Second, Limit: 120}
	team := func(id string, w int64) quota.Request {
		return quota.Request{Org: "acme", Team: id, Metric: "tokens", Cost: 1,
			Limits:     quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Second, 120)}},
			Capacities: []quota.CapacityDraw{{Capacity: c, Member: id, Weight: w}}}
	}
	base := time.Now()
	sec := time.Second.Microseconds()
	var web, batch []admission
	var wg sync.WaitGroup
	wg.Go(func() { web = flood(t, rs, team("web", 1), 4, base, base.Add(6*time.Second)) })
	wg.Go(func() { batch = flood(t, rs, team("batch", 3), 4, base, base.Add(6*time.Second)) })
	wg.Wait()
	w, b := admittedIn(web, sec, 6*sec), admittedIn(batch, sec, 6*sec)
	sw := 100 * float64(w) / float64(w+b)
	t.Logf("teams of weights 1 and 3 sharing a fair-share org limit, windows 2-6: %.1f %% and %.1f %% (want 25 and 75, +-5)", sw, 100-sw)
	if sw < 20 || sw > 30 {
		t.Errorf("web got %.1f %%, want 25 +-5", sw)
	}
}

// The rule, step by step, on a minute of 8 with the saturation point at 6: below it
// anyone takes; above it a member past its share is refused once another wants more
// (it was refused), and the refusal names what refused it.
func TestCapacityFairShareSteps(t *testing.T) {
	r := replicas(t, 1)[0]
	ctx := context.Background()
	c := quota.Capacity{ID: "acme", FairShare: true, Metric: "tokens", Window: vocab.Minute, Limit: 8}
	team := func(id string, w int64) quota.Request {
		return quota.Request{Org: "acme", Team: id, Metric: "tokens", Cost: 1,
			Capacities: []quota.CapacityDraw{{Capacity: c, Member: id, Weight: w}}}
	}
	web, batch := team("web", 1), team("batch", 3)
	share := vocab.Blocked{Metric: "tokens", Level: vocab.LevelOrg, ID: "acme", Window: vocab.Minute, FairShare: true}
	full := share // the limit itself is full: still the org's limit, shared
	for i, step := range []struct {
		req  quota.Request
		want *vocab.Blocked
	}{
		{web, nil}, {web, nil}, {web, nil}, {web, nil}, {web, nil}, {web, nil}, // below the point: 6
		{batch, nil}, // batch is within its share (6 of 8)
		{web, nil},   // batch wants no more yet: web may use what it leaves, 7 of 8
		{batch, &full},
		{web, &share}, // batch wants more: web is held to its share, 2
		{batch, &full},
	} {
		res, _, err := r.Check(ctx, vocab.Route{}, step.req)
		if err != nil {
			t.Fatal(err)
		}
		if step.want == nil && !res.Allowed || step.want != nil && (res.Allowed || *res.BlockedAt != *step.want) {
			t.Fatalf("step %d (%s): allowed %v at %+v, want %+v", i+1, step.req.Team, res.Allowed, res.BlockedAt, step.want)
		}
	}
	w, err := r.CapacityWindow(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]quota.CapacityMember{}
	for _, m := range w.Members {
		got[m.ID] = m
	}
	if w.Used != 8 || got["web"].Used != 7 || got["web"].Share != 2 || got["batch"].Used != 1 || got["batch"].Share != 6 {
		t.Fatalf("window %+v, want web 7 of share 2, batch 1 of share 6", w)
	}
}
