package quota_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// maxInSpan is the most stamps (monotonic readings) within any span of d.
func maxInSpan(stamps []time.Duration, d time.Duration) int {
	slices.Sort(stamps)
	best, i := 0, 0
	for j := range stamps {
		for stamps[j]-stamps[i] >= d {
			i++
		}
		best = max(best, j-i+1)
	}
	return best
}

// Two engines on the same Redis share a 100/second limit; one engine's wall clock is
// stepped by +2 s or -2 s after its Redis TIME sample (NTP, a resumed VM). A step
// changes no decision: the most admitted in any real second stays within the
// two-bucket estimate's own bound (under twice the limit, 201 with the floor), as
// without a step. Before, Engine.Now was the local wall clock plus an offset sampled
// every 30 s, so the stepped engine counted in buckets 2 s away from the other's and
// the two admitted some 400 in a real second.
func TestClockStepChangesNoAdmission(t *testing.T) {
	const limit = 100
	for _, step := range []time.Duration{0, 2 * time.Second, -2 * time.Second} {
		t.Run(step.String(), func(t *testing.T) {
			clk := quota.NewStepClock()
			var cfg quota.Config
			clk.Use(&cfg)
			cfg.ClockSync = time.Hour // no sample after the step within the test
			a := MustRig(t, "", quota.Config{})
			cfg.KeyPrefix = a.prefix
			b := MustRig(t, "", cfg)
			clk.Step(step)
			if d := a.e.Now().Sub(b.e.Now()).Abs(); d > 50*time.Millisecond {
				t.Errorf("after a %v step the engines' clocks differ by %v", step, d)
			}
			req := quota.Request{Org: testenv.ID(t, "org"), Metric: "requests", Cost: 1,
				Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Second, limit)}}}
			origin := time.Now()
			stop := origin.Add(3 * time.Second)
			var mu sync.Mutex
			var admitted []time.Duration
			var wg sync.WaitGroup
			for _, e := range []*quota.Engine{a.e, b.e, a.e, b.e} {
				wg.Go(func() {
					for time.Now().Before(stop) {
						at := time.Since(origin) // when the check's time is read
						res, err := e.Check(context.Background(), req)
						if err != nil {
							t.Error(err)
							return
						}
						if res.Allowed {
							mu.Lock()
							admitted = append(admitted, at)
							mu.Unlock()
						}
						time.Sleep(time.Millisecond)
					}
				})
			}
			wg.Wait()
			worst := maxInSpan(admitted, time.Second)
			t.Logf("step %v: %d admitted in 3 s, at most %d in a real second", step, len(admitted), worst)
			if worst > 2*limit+1 {
				t.Errorf("step %v: %d admitted in a real second, above the two-bucket bound %d", step, worst, 2*limit+1)
			}
			// 3 s touch at most four one-second buckets, none of which counts over the limit.
			if total := len(admitted); total > 4*limit+1 {
				t.Errorf("step %v: %d admitted in 3 s of a %d/s limit", step, total, limit)
			}
		})
	}
}

// A stepped wall clock moves no period boundary, no reservation's expiry and no
// bucket: the engine's Now, its period and a reservation's expires_at stay where Redis
// time puts them, and the sweep expires nothing early or late. Time passing (Add)
// still moves them all.
func TestClockStepMovesNoExpiryOrPeriod(t *testing.T) {
	t.Parallel()
	clk := testenv.NewClock(time.Now())
	r := MustRig(t, "", quota.Config{Clock: clk.Now, Monotonic: clk.Monotonic, ClockSync: time.Hour})
	ctx := context.Background()
	org := testenv.ID(t, "org")
	before, period := r.e.Now(), r.e.Period(1)
	// Not near the end of a period: 40 days' steps must stay inside it.
	if period.End.Sub(before) < time.Hour {
		clk.Add(2 * time.Hour)
		before, period = r.e.Now(), r.e.Period(1)
	}

	res, out, err := r.e.Reserve(ctx, quota.Request{Org: org, Team: "eng", User: "ann", Metric: "tokens", Cost: 5,
		Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 100)}}}, quota.ReserveOptions{TTL: 10 * time.Second})
	if err != nil || !out.Allowed {
		t.Fatalf("reserve: %+v %v", out, err)
	}
	for _, step := range []time.Duration{40 * 24 * time.Hour, -80 * 24 * time.Hour, time.Hour} {
		clk.Step(step)
		if d := r.e.Now().Sub(before); d < 0 || d > time.Second {
			t.Errorf("a %v step moved Now by %v", step, d)
		}
		if p := r.e.Period(1); p != period {
			t.Errorf("a %v step moved the period: %+v, was %+v", step, p, period)
		}
		expired, err := r.e.ExpireDue(ctx, org)
		if err != nil || len(expired) != 0 {
			t.Errorf("after a %v step the sweep expired %d reservations (%v), want none within its 10 s", step, len(expired), err)
		}
		got, err := r.e.Reservation(ctx, org, 1, res.ID)
		if err != nil || got.State != vocab.Held || !got.ExpiresAt.Equal(res.ExpiresAt) {
			t.Errorf("after a %v step the reservation is %+v (%v), want held until %v", step, got, err, res.ExpiresAt)
		}
	}
	// A reservation made on the stepped clock expires 10 s of Redis time later.
	res2, _, err := r.e.Reserve(ctx, quota.Request{Org: org, Team: "eng", User: "ann", Metric: "tokens", Cost: 5,
		Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 100)}}}, quota.ReserveOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if d := res2.ExpiresAt.Sub(res.ExpiresAt); d < 0 || d > time.Second {
		t.Errorf("a reservation made on the stepped clock expires %v after one made before the steps, want within 1 s", d)
	}

	clk.Add(11 * time.Second) // time passes: both expire
	expired, err := r.e.ExpireDue(ctx, org)
	if err != nil || len(expired) != 2 {
		t.Errorf("11 s later the sweep expired %d reservations (%v), want 2", len(expired), err)
	}
	if d := r.e.Now().Sub(before); d < 11*time.Second || d > 12*time.Second {
		t.Errorf("after 11 s passed Now moved by %v", d)
	}
}

// A lease ends on the engine's clock: a stepped wall clock neither ends it early (a new
// lease taken, the old one's units held twice) nor keeps it past its end; time passing
// ends it.
func TestClockStepMovesNoLeaseEnd(t *testing.T) {
	t.Parallel()
	clk := testenv.NewClock(time.Now()) // stands still unless moved
	var mu sync.Mutex
	events := map[quota.LeaseEventKind]int{}
	r := MustRig(t, "", quota.Config{KeyPrefix: testenv.ID(t, "ql"), Clock: clk.Now, Monotonic: clk.Monotonic, ClockSync: time.Hour,
		Leases: quota.LeaseConfig{Enabled: true, Max: 5 * time.Second, OnLease: func(ev quota.LeaseEvent) {
			mu.Lock()
			events[ev.Kind]++
			mu.Unlock()
		}}})
	count := func(k quota.LeaseEventKind) int { mu.Lock(); defer mu.Unlock(); return events[k] }
	req := quota.Request{Org: testenv.ID(t, "org"), Team: "eng", User: "erin", Metric: "tokens", Cost: 1,
		Limits: quota.LevelLimits{User: []vocab.Limit{lim(vocab.Month, 1_000_000)}}}
	leased := false
	for range 200 {
		if leased = r.MustCheck(t, req).Leased; leased {
			break
		}
	}
	if !leased {
		t.Fatal("the hot path was never leased: nothing to test")
	}
	taken, missed := count(quota.LeaseTaken), count(quota.LeaseMiss)
	for _, step := range []time.Duration{time.Hour, -2 * time.Hour, 2 * time.Second} {
		clk.Step(step)
		for range 3 {
			if res := r.MustCheck(t, req); !res.Leased {
				t.Errorf("after a %v step a check was not answered from the lease: %+v", step, res)
			}
		}
	}
	if n, m := count(quota.LeaseTaken)-taken, count(quota.LeaseMiss)-missed; n != 0 || m != 0 {
		t.Errorf("the steps made %d leases taken and %d misses, want none: the lease had not ended", n, m)
	}
	clk.Add(6 * time.Second) // past the lease's end
	if res := r.MustCheck(t, req); res.Leased && count(quota.LeaseTaken) == taken {
		t.Error("6 s later the ended lease still answered")
	}
}

// BenchmarkEngineNow is the engine's clock on the check path: an atomic load of the
// last sample and a monotonic reading; no lock, no allocation.
func BenchmarkEngineNow(b *testing.B) {
	r := MustRig(b, "", quota.Config{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = r.e.Now()
		}
	})
}

// BenchmarkRedisTime is the round trip of one Redis TIME, what a sample's error is
// half of.
func BenchmarkRedisTime(b *testing.B) {
	r := MustRig(b, "", quota.Config{})
	ctx := context.Background()
	for b.Loop() {
		if err := r.rdb.Time(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

// A sample whose round trip leaves it less certain than the kept one has become is not
// kept: one slow TIME reply (here 1 s) does not move the clock by half of it. Once the
// kept sample is old enough for its drift to outweigh that (500 ppm of 2,000 s is 1 s),
// a sample as slow is kept.
func TestSlowClockSampleNotKept(t *testing.T) {
	t.Parallel()
	clk := testenv.NewClock(time.Now()) // stands still: the first sample's round trip is 0
	var slow atomic.Bool
	var n atomic.Int64
	read := func() time.Time {
		if slow.Load() { // each reading 1 s after the one before: a 1-s round trip
			return clk.Now().Add(time.Duration(n.Add(1)-1) * time.Second)
		}
		return clk.Now()
	}
	r := MustRig(t, "", quota.Config{Clock: read, ClockSync: time.Hour})
	ctx := context.Background()
	resample := func() time.Duration {
		t.Helper()
		before := r.e.Now()
		n.Store(0)
		slow.Store(true)
		err := quota.SyncClock(ctx, r.e)
		slow.Store(false)
		if err != nil {
			t.Fatal(err)
		}
		return r.e.Now().Sub(before)
	}
	// Kept, the slow sample would move Now by about -0.5 s (its middle is 0.5 s after
	// the first reading); not kept, by the real time the call took.
	if d := resample(); d < -100*time.Millisecond || d > 100*time.Millisecond {
		t.Errorf("a sample with a 1-s round trip moved Now by %v, want it not kept", d)
	}
	clk.Add(2100 * time.Second)
	if d := resample(); d > -400*time.Millisecond {
		t.Errorf("after 2,100 s a sample with a 1-s round trip moved Now by %v, want it kept (about -0.5 s)", d)
	}
}
