package quota_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

func bucket(w vocab.Window, rate, burst int64) vocab.Limit {
	return vocab.Limit{Window: w, Limit: rate, Burst: burst}
}

// userBucket is a user-level check of cost units under the given user limits.
func userBucket(org string, cost int64, user ...vocab.Limit) quota.Request {
	return quota.Request{Org: org, Team: "eng", User: "alice", Metric: "requests", Cost: cost,
		Limits: quota.LevelLimits{User: user}}
}

// levelOf returns the result's level of the given level and window.
func levelOf(tb testing.TB, res vocab.Result, lv vocab.Level, w vocab.Window) vocab.LevelStatus {
	tb.Helper()
	for _, l := range res.Levels {
		if l.Level == lv && l.Window == w {
			return l
		}
	}
	tb.Fatalf("no %s %s level in %+v", lv, w, res.Levels)
	return vocab.LevelStatus{}
}

// A user at 10/s burst 30 gets exactly 30 of 60 concurrent checks, then the rate: 10
// in the next second (not a reset to 30, not a fixed window), and a refusal's
// Retry-After is when the cost fits on the engine's clock, to the millisecond.
func TestBucketBurstThenRate(t *testing.T) {
	t.Parallel()
	clk := newClock()
	r := MustRig(t, "", quota.BucketsOnEngineClock(quota.Config{Clock: clk.Now}))
	org := testenv.ID(t, "o")
	b := bucket(vocab.Second, 10, 30)
	ctx := context.Background()

	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 60 {
		wg.Go(func() {
			res, err := r.e.Check(ctx, userBucket(org, 1, b))
			if err != nil {
				t.Error(err)
				return
			}
			if res.Allowed {
				admitted.Add(1)
			} else if res.RetryAfter != 100*time.Millisecond {
				t.Errorf("retry after a full burst = %v, want 100ms (one token at 10/s)", res.RetryAfter)
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != 30 {
		t.Fatalf("admitted %d of 60 concurrent checks at burst 30, want 30", n)
	}
	res := r.MustCheck(t, userBucket(org, 0, b))
	lv := levelOf(t, res, vocab.LevelUser, vocab.Second)
	if lv.Burst != 30 || lv.Limit != 10 || lv.Remaining != 0 || lv.Used != 30 {
		t.Errorf("empty bucket's level = %+v", lv)
	}
	if want := r.e.Now().Add(3 * time.Second); !lv.ResetAt.Equal(want.Truncate(time.Millisecond)) && !lv.ResetAt.Equal(want.Truncate(time.Millisecond).Add(time.Millisecond)) {
		t.Errorf("empty bucket full again at %v, want %v (30 tokens at 10/s)", lv.ResetAt, want)
	}

	// 250 ms later: two whole tokens (2.5), and the third fits 50 ms on.
	clk.Add(250 * time.Millisecond)
	for i := range 3 {
		res := r.MustCheck(t, userBucket(org, 1, b))
		if res.Allowed != (i < 2) {
			t.Fatalf("check %d at +250ms: allowed %v, want %v", i, res.Allowed, i < 2)
		}
		if !res.Allowed && res.RetryAfter != 50*time.Millisecond {
			t.Errorf("retry at +250ms = %v, want 50ms", res.RetryAfter)
		}
	}
	// The next second gives the rate: 10, whatever the burst.
	clk.Add(time.Second - 250*time.Millisecond + 250*time.Millisecond)
	n := 0
	for range 60 {
		if r.MustCheck(t, userBucket(org, 1, b)).Allowed {
			n++
		}
	}
	if n != 10 {
		t.Errorf("admitted %d in the next second, want 10 (the rate)", n)
	}
	// A quiet caller finds the bucket full again, never above its burst.
	clk.Add(10 * time.Second)
	res = r.MustCheck(t, userBucket(org, 0, b))
	if lv := levelOf(t, res, vocab.LevelUser, vocab.Second); lv.Remaining != 30 || lv.Used != 0 {
		t.Errorf("a bucket left 10 s = %+v, want 30 tokens", lv)
	}
	n = 0
	for range 40 {
		if r.MustCheck(t, userBucket(org, 1, b)).Allowed {
			n++
		}
	}
	if n != 30 {
		t.Errorf("a refilled bucket admitted %d, want its burst 30", n)
	}
}

// A cost above the burst can never fit: denied without a retry; a bucket of rate 0
// admits nothing. Neither counts anything.
func TestBucketNeverFits(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	org := testenv.ID(t, "o")
	res := r.MustCheck(t, userBucket(org, 31, bucket(vocab.Minute, 600, 30)))
	if res.Allowed || res.RetryAfter != 0 || res.BlockedAt == nil || res.BlockedAt.Window != vocab.Minute {
		t.Errorf("a cost above the burst: %+v, want denied without retry", res)
	}
	res = r.MustCheck(t, userBucket(org, 1, bucket(vocab.Hour, 0, 5)))
	if res.Allowed || res.RetryAfter != 0 {
		t.Errorf("a bucket of rate 0: %+v, want denied without retry", res)
	}
	if lv := levelOf(t, r.MustCheck(t, userBucket(org, 0, bucket(vocab.Minute, 600, 30))), vocab.LevelUser, vocab.Minute); lv.Remaining != 30 {
		t.Errorf("a denied cost took tokens: %+v", lv)
	}
}

// A check refused by a team bucket moves no other counter, and one refused by a user's
// month limit takes no token: all or nothing across a bucket and a month, with many
// users racing for the team's bucket.
func TestBucketAllOrNothing(t *testing.T) {
	t.Parallel()
	clk := newClock()
	r := MustRig(t, "", quota.BucketsOnEngineClock(quota.Config{Clock: clk.Now}))
	org := testenv.ID(t, "o")
	team := bucket(vocab.Minute, 60, 20)
	limits := func(month int64) quota.LevelLimits {
		return quota.LevelLimits{Team: []vocab.Limit{team}, User: []vocab.Limit{lim(vocab.Month, month)}}
	}
	req := func(user string, cost, month int64) quota.Request {
		return quota.Request{Org: org, Team: "eng", User: user, Metric: "requests", Cost: cost, Limits: limits(month)}
	}
	// 8 users, each with a month of 5, race 40 checks of 1 for the team's 20 tokens.
	var admitted atomic.Int64
	var wg sync.WaitGroup
	perUser := make([]atomic.Int64, 8)
	for i := range 40 {
		wg.Go(func() {
			res, err := r.e.Check(context.Background(), req(string(rune('a'+i%8)), 1, 5))
			if err != nil {
				t.Error(err)
				return
			}
			if res.Allowed {
				admitted.Add(1)
				perUser[i%8].Add(1)
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != 20 {
		t.Fatalf("admitted %d, want the team's burst 20", n)
	}
	usage := r.usage(t, org)
	for i := range perUser {
		u := string(rune('a' + i))
		if got, want := usage[quota.Counter{Level: vocab.LevelUser, Team: "eng", User: u, Metric: "requests"}], perUser[i].Load(); got != want {
			t.Errorf("user %s's month = %d, admitted %d: a refused check moved a counter", u, got, want)
		}
	}
	// Refused by the user's month (5 used of 5): the team's bucket keeps its tokens.
	clk.Add(10 * time.Second) // 10 tokens back
	used := perUser[0].Load()
	res := r.MustCheck(t, req("a", 5-used+1, 5))
	if res.Allowed || res.BlockedAt.Window != vocab.Month {
		t.Fatalf("a check over the user's month: %+v", res)
	}
	if lv := levelOf(t, r.MustCheck(t, req("z", 0, 5)), vocab.LevelTeam, vocab.Minute); lv.Remaining != 10 {
		t.Errorf("team bucket after a month refusal: %d tokens, want 10", lv.Remaining)
	}
	// Refused by the team's bucket: the user's month does not move.
	before := r.usage(t, org)[quota.Counter{Level: vocab.LevelUser, Team: "eng", User: "y", Metric: "requests"}]
	if res := r.MustCheck(t, req("y", 11, 100)); res.Allowed || res.BlockedAt.Level != vocab.LevelTeam {
		t.Fatalf("a check over the team's bucket: %+v", res)
	}
	if after := r.usage(t, org)[quota.Counter{Level: vocab.LevelUser, Team: "eng", User: "y", Metric: "requests"}]; after != before {
		t.Errorf("a bucket refusal moved the user's month from %d to %d", before, after)
	}
}

// A reservation takes tokens like a check; settling gives the unused ones back, never
// past the burst; an excess takes more.
func TestBucketReservationGivesTokensBack(t *testing.T) {
	t.Parallel()
	clk := newClock()
	r := MustRig(t, "", quota.BucketsOnEngineClock(quota.Config{Clock: clk.Now}))
	org := testenv.ID(t, "o")
	b := bucket(vocab.Hour, 3600, 100) // a token a second
	ctx := context.Background()
	tokens := func() int64 {
		t.Helper()
		return levelOf(t, r.MustCheck(t, userBucket(org, 0, b)), vocab.LevelUser, vocab.Hour).Remaining
	}
	res := r.mustReserve(t, userBucket(org, 60, b), quota.ReserveOptions{})
	if got := tokens(); got != 40 {
		t.Fatalf("tokens after reserving 60 of 100: %d", got)
	}
	if _, err := r.e.Commit(ctx, org, 0, res.ID, 20); err != nil {
		t.Fatal(err)
	}
	if got := tokens(); got != 80 {
		t.Errorf("tokens after committing 20 of 60: %d, want 80", got)
	}
	// 30 s later (30 tokens back, so 100: full), a release gives back what it held,
	// and the bucket stays at its burst.
	res = r.mustReserve(t, userBucket(org, 10, b), quota.ReserveOptions{})
	clk.Add(30 * time.Second)
	if _, err := r.e.Release(ctx, org, 0, res.ID); err != nil {
		t.Fatal(err)
	}
	if got := tokens(); got != 100 {
		t.Errorf("tokens after a release into a full bucket: %d, want the burst 100", got)
	}
	// Used above the amount takes the excess.
	res = r.mustReserve(t, userBucket(org, 10, b), quota.ReserveOptions{})
	if _, err := r.e.Commit(ctx, org, 0, res.ID, 25); err != nil {
		t.Fatal(err)
	}
	if got := tokens(); got != 75 {
		t.Errorf("tokens after committing 25 of 10: %d, want 75", got)
	}
}

// In shadow mode a bucket past empty counts as empty, never below, and says would-block.
func TestBucketShadow(t *testing.T) {
	t.Parallel()
	clk := newClock()
	r := MustRig(t, "", quota.BucketsOnEngineClock(quota.Config{Clock: clk.Now}))
	org := testenv.ID(t, "o")
	b := bucket(vocab.Second, 10, 10)
	req := userBucket(org, 25, b)
	req.Mode = vocab.Shadow
	res := r.MustCheck(t, req)
	if !res.Allowed || res.WouldBlock == nil {
		t.Fatalf("shadow over a bucket: %+v", res)
	}
	clk.Add(time.Second)
	if lv := levelOf(t, r.MustCheck(t, userBucket(org, 0, b)), vocab.LevelUser, vocab.Second); lv.Remaining != 10 {
		t.Errorf("a second after a shadow check of 25 at burst 10: %d tokens, want 10 (emptied, not below)", lv.Remaining)
	}
}

// The decision stored under an idempotency key, and its replay, carry the bucket.
func TestBucketIdempotentReply(t *testing.T) {
	t.Parallel()
	clk := newClock()
	r := MustRig(t, "", quota.BucketsOnEngineClock(quota.Config{Clock: clk.Now}))
	org := testenv.ID(t, "o")
	b := bucket(vocab.Minute, 60, 30)
	req := userBucket(org, 12, b)
	req.IdempotencyKey = "bucket-key-1"
	first := r.MustCheck(t, req)
	clk.Add(time.Second)
	again := r.MustCheck(t, req)
	for _, res := range []vocab.Result{first, again} {
		lv := levelOf(t, res, vocab.LevelUser, vocab.Minute)
		if !res.Allowed || lv.Burst != 30 || lv.Remaining != 18 || lv.Used != 12 {
			t.Errorf("idempotent bucket decision = %+v (%+v)", lv, res)
		}
	}
	if !again.Replayed {
		t.Errorf("second check not a replay")
	}
	if lv := levelOf(t, r.MustCheck(t, userBucket(org, 0, b)), vocab.LevelUser, vocab.Minute); lv.Remaining != 19 {
		t.Errorf("tokens after the replay: %d, want 19 (18 + one a second)", lv.Remaining)
	}
}

// Over any real span, a bucket admits at most burst + rate x span: random arrivals of
// random costs at millisecond times, checked against every span between two admissions.
func TestBucketRealSpan(t *testing.T) {
	t.Parallel()
	clk := newClock()
	r := MustRig(t, "", quota.BucketsOnEngineClock(quota.Config{Clock: clk.Now}))
	org := testenv.ID(t, "o")
	const rate, burst = 7, 20 // per second: T = 142857.14 us, not whole
	b := bucket(vocab.Second, rate, burst)
	rng := rand.New(rand.NewPCG(7, 40))
	type adm struct{ us, cost int64 }
	var got []adm
	var elapsed int64
	for range 3000 {
		step := rng.Int64N(60)
		if rng.IntN(50) == 0 {
			step = rng.Int64N(4000) // a quiet spell: the bucket refills
		}
		clk.Add(time.Duration(step) * time.Millisecond)
		elapsed += step * 1000
		cost := 1 + rng.Int64N(4)
		if r.MustCheck(t, userBucket(org, cost, b)).Allowed {
			got = append(got, adm{elapsed, cost})
		}
	}
	if len(got) < 500 {
		t.Fatalf("only %d admissions: the schedule does not press the bucket", len(got))
	}
	worst := 0.0
	for i := range got {
		var sum int64
		for j := i; j < len(got); j++ {
			sum += got[j].cost
			allowed := burst + rate*float64(got[j].us-got[i].us)/1e6
			if float64(sum) > allowed {
				t.Fatalf("admitted %d in [%d us, %d us], above burst + rate x span = %.3f", sum, got[i].us, got[j].us, allowed)
			}
			worst = max(worst, float64(sum)/allowed)
		}
	}
	if worst < 0.95 {
		t.Errorf("the busiest span used %.2f of its bound: the bucket under-admits", worst)
	}
}

// A hot path limited by a bucket is decided in Redis, never from a lease (lease.go's
// leasable), and real traffic on two replicas stays within burst + rate x span.
func TestBucketHotPathNotLeased(t *testing.T) {
	const rate, burst = 2000, 1000
	var taken atomic.Int64
	rigs := leaseRigs(t, 2, 250*time.Millisecond, func(ev quota.LeaseEvent) {
		if ev.Kind == quota.LeaseTaken {
			taken.Add(1)
		}
	})
	org := testenv.ID(t, "org")
	req := quota.Request{Org: org, Team: "eng", User: "u", Metric: "requests", Cost: 1,
		Limits: quota.LevelLimits{User: []vocab.Limit{bucket(vocab.Second, rate, burst)}}}
	adm, leased := hammer(t, rigs, req, 8, 1500*time.Millisecond)
	if leased > 0 || taken.Load() > 0 {
		t.Errorf("%d admissions from %d leases on a bucket's path", leased, taken.Load())
	}
	for _, span := range []int64{1_000, 100_000, 1_000_000} { // µs
		bound := burst + rate*span/1_000_000
		if got := worstCertainSpan(adm, span); got > bound {
			t.Errorf("admitted %d in a real span of %d µs, above burst + rate x span = %d", got, span, bound)
		}
	}
	if n := total(adm); n < burst {
		t.Errorf("admitted %d in 1.5 s at burst %d", n, burst)
	}
}

// Several metrics, each with a bucket, decide all or nothing, each counter taking its
// own cost; a multi-metric reservation with a concurrent slot gives its tokens and its
// slot back per metric.
func TestBucketSeveralMetricsAndConcurrency(t *testing.T) {
	t.Parallel()
	clk := newClock()
	r := MustRig(t, "", quota.BucketsOnEngineClock(quota.Config{Clock: clk.Now}))
	org := testenv.ID(t, "o")
	reqs, toks := bucket(vocab.Minute, 60, 10), bucket(vocab.Minute, 6000, 1000)
	two := func(nreq, ntok int64) quota.Request {
		q := userBucket(org, nreq, reqs)
		q.More = []quota.MetricCost{{Metric: "tokens", Cost: ntok, Limits: quota.LevelLimits{User: []vocab.Limit{toks}}}}
		return q
	}
	tokens := func() (int64, int64) {
		t.Helper()
		res := r.MustCheck(t, two(0, 0))
		var a, b int64
		for _, l := range res.Levels {
			if l.Metric == "requests" {
				a = l.Remaining
			} else {
				b = l.Remaining
			}
		}
		return a, b
	}
	if res := r.MustCheck(t, two(1, 900)); !res.Allowed {
		t.Fatalf("first call: %+v", res)
	}
	// tokens refuse the second: requests keep their token too
	if res := r.MustCheck(t, two(1, 200)); res.Allowed || res.BlockedAt.Metric != "tokens" {
		t.Fatalf("a call over the tokens' bucket: %+v", res)
	}
	if a, b := tokens(); a != 9 || b != 100 {
		t.Errorf("after one call and a refusal: %d requests, %d tokens in the buckets, want 9 and 100", a, b)
	}
	// A reservation of a slot and 80 tokens, with a concurrent limit on requests.
	clk.Add(time.Minute) // both full again
	q := two(1, 800)
	q.Limits.User = append(q.Limits.User, lim(vocab.Concurrent, 1))
	res := r.mustReserve(t, q, quota.ReserveOptions{})
	if a, b := tokens(); a != 9 || b != 200 {
		t.Errorf("while reserved: %d requests, %d tokens, want 9 and 200", a, b)
	}
	if _, err := r.e.CommitUsed(context.Background(), org, 0, res.ID, map[string]int64{"requests": 1, "tokens": 300}); err != nil {
		t.Fatal(err)
	}
	if a, b := tokens(); a != 9 || b != 700 {
		t.Errorf("after committing 300 of 800 tokens: %d requests, %d tokens, want 9 and 700", a, b)
	}
	if held, err := r.e.InFlight(context.Background(), org); err != nil || len(held) != 0 {
		t.Errorf("in flight after the commit: %v %v", held, err)
	}
}

// A bucket is decided on the Redis TIME of its script, one clock whichever replica
// asks: two engines whose own clocks disagree (one runs 3x fast, so its now races
// ahead) still keep burst + rate x span over every real span. The control run decides
// the same traffic on the engines' own clocks, which over-admits: the skew this test
// makes is one that matters.
func TestBucketOneClockAcrossSkewedReplicas(t *testing.T) {
	const rate, burst = 100, 20 // a token every 10 ms
	run := func(engineClock bool) (worst, bound float64, n int64) {
		prefix := testenv.ID(t, "qs")
		base := time.Now()
		fast := func() time.Time { return base.Add(3 * time.Since(base)) }
		var rigs []*testRig
		for _, clk := range []func() time.Time{time.Now, fast} {
			cfg := quota.Config{KeyPrefix: prefix, Clock: clk}
			if engineClock {
				cfg = quota.BucketsOnEngineClock(cfg)
			}
			rigs = append(rigs, MustRig(t, "", cfg))
		}
		org := testenv.ID(t, "org")
		req := userBucket(org, 1, bucket(vocab.Second, rate, burst))
		adm, _ := hammer(t, rigs, req, 6, 1200*time.Millisecond)
		// every span from a call's start to a later call's end, counting the calls wholly
		// inside it: its excess over burst + rate x span
		worst = -1e9
		for i := range adm {
			var sum int64
			for j := i; j < len(adm); j++ {
				if adm[j].end < adm[i].ms {
					continue
				}
				span := adm[j].end - adm[i].ms
				sum = 0
				for k := i; k <= j; k++ {
					if adm[k].end <= adm[j].end {
						sum += adm[k].cost
					}
				}
				b := burst + rate*float64(span)/1e6
				if d := float64(sum) - b; d > worst {
					worst, bound = d, b
				}
			}
		}
		return worst, bound, total(adm)
	}
	over, bound, n := run(false)
	t.Logf("on Redis TIME: %d admitted in 1.2 s at %d/s burst %d; the worst span is %.2f over its bound %.2f", n, rate, burst, over, bound)
	if over > 0 {
		t.Errorf("a bucket on Redis TIME admitted %.2f above burst + rate x span (%.2f) with skewed replicas", over, bound)
	}
	cover, cbound, cn := run(true)
	t.Logf("control, on the engines' clocks: %d admitted; the worst span is %.2f over its bound %.2f", cn, cover, cbound)
	if cover <= 0 {
		t.Errorf("the control on the engines' skewed clocks kept the bound: the test does not make a skew that matters")
	}
}

// A bucket whose rate changes (a plan upgraded, a throttle) owes the same units at the
// new rate: emptied at 1 a day, burst 10, then raised to 100 a second, it is full
// again 100 ms later, not in 10 days; lowered back, the units taken since are owed at
// a day each.
func TestBucketRateChangeKeepsUnitsOwed(t *testing.T) {
	t.Parallel()
	clk := newClock()
	r := MustRig(t, "", quota.BucketsOnEngineClock(quota.Config{Clock: clk.Now}))
	org := testenv.ID(t, "o")
	slow, fast := bucket(vocab.Day, 1, 10), bucket(vocab.Day, 8_640_000, 10) // 100 a second
	if res := r.MustCheck(t, userBucket(org, 10, slow)); !res.Allowed {
		t.Fatalf("the burst: %+v", res)
	}
	if res := r.MustCheck(t, userBucket(org, 1, fast)); res.Allowed || res.RetryAfter != 10*time.Millisecond {
		t.Errorf("at once after the upgrade: %+v, want denied, retry 10ms (one unit at 100/s)", res)
	}
	clk.Add(100 * time.Millisecond)
	if lv := levelOf(t, r.MustCheck(t, userBucket(org, 4, fast)), vocab.LevelUser, vocab.Day); lv.Remaining != 6 {
		t.Errorf("100 ms after the upgrade and 4 taken: %d tokens, want 6", lv.Remaining)
	}
	// Back to 1 a day: the 4 units owed are 4 days.
	res := r.MustCheck(t, userBucket(org, 7, slow))
	if res.Allowed || res.RetryAfter != 24*time.Hour {
		t.Errorf("7 of the 6 left at 1 a day: %+v, want denied, retry 1 day", res)
	}
}
