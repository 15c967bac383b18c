package quota_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
)

// leaseRigs starts n engines with leases on one Redis key prefix: n replicas.
func leaseRigs(t *testing.T, n int, max time.Duration, events func(quota.LeaseEvent)) []*testRig {
	t.Helper()
	prefix := testenv.ID(t, "ql")
	var rigs []*testRig
	for range n {
		rigs = append(rigs, MustRig(t, "", quota.Config{KeyPrefix: prefix, Leases: quota.LeaseConfig{
			Enabled: true, Max: max, Threshold: 50, Replicas: n, OnLease: events},
			OnReservation: func(ev quota.ReservationEvent) {
				t.Errorf("a lease reported as a reservation %s: leases have metrics of their own", ev.State)
			}}))
	}
	return rigs
}

// awayFromMinuteEnd waits until at least need is left in the current minute, so a test
// that counts per minute runs inside one.
func awayFromMinuteEnd(need time.Duration) {
	now := time.Now()
	if left := now.Truncate(time.Minute).Add(time.Minute).Sub(now); left < need {
		time.Sleep(left + 100*time.Millisecond)
	}
}

// waitNoLeases waits until no rig holds an open lease.
func waitNoLeases(t *testing.T, rigs ...*testRig) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		open := false
		for _, r := range rigs {
			if held, _ := r.e.LeasedUnits(); held > 0 {
				open = true
			}
		}
		if !open {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("leases still open 10 s after the load stopped")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Done when: 2 replicas x 64 goroutines on one user with month and minute limits: the
// admitted checks never exceed any limit in the minute (counted from the answers), the
// last units are admitted, answers come from leases, and once the leases are
// settled every counter equals the admitted total exactly.
func TestLeasesExactOverTwoReplicas(t *testing.T) {
	var taken, returned atomic.Int64
	rigs := leaseRigs(t, 2, 50*time.Millisecond, func(ev quota.LeaseEvent) {
		switch ev.Kind {
		case quota.LeaseTaken:
			taken.Add(1)
		case quota.LeaseReturned:
			returned.Add(1)
		}
	})
	const minuteLimit, monthLimit = 3000, 5000
	req := quota.Request{Org: "acme", Team: "eng", User: "alice", Metric: "tokens", Cost: 1, Limits: quota.LevelLimits{
		Org:  []quota.Limit{lim(quota.Month, 1_000_000), lim(quota.Minute, 100_000)},
		Team: []quota.Limit{lim(quota.Month, 100_000)},
		User: []quota.Limit{lim(quota.Month, monthLimit), lim(quota.Minute, minuteLimit)},
	}}
	awayFromMinuteEnd(8 * time.Second)
	minute := rigs[0].e.Now().Truncate(time.Minute)

	var admitted, leased, denied atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(3 * time.Second)
	for g := range 128 {
		r := rigs[g%2]
		wg.Go(func() {
			for time.Now().Before(stop) {
				res, err := r.e.Check(context.Background(), req)
				if err != nil {
					t.Errorf("Check: %v", err)
					return
				}
				if !res.Allowed {
					denied.Add(1)
					continue
				}
				admitted.Add(1)
				if res.Leased {
					leased.Add(1)
					for _, l := range res.Levels {
						if l.Used > l.Limit {
							t.Errorf("a leased answer shows %s %s used %d over its limit %d", l.Level, l.Window, l.Used, l.Limit)
							return
						}
					}
				}
			}
		})
	}
	wg.Wait()
	if now := rigs[0].e.Now(); now.Truncate(time.Minute) != minute {
		t.Fatalf("the load crossed a minute boundary (%s); the test needs one minute", now)
	}
	n := admitted.Load()
	t.Logf("admitted %d (%d from leases), denied %d, leases taken %d", n, leased.Load(), denied.Load(), taken.Load())
	if n > minuteLimit {
		t.Fatalf("admitted %d in one minute over the user's minute limit %d", n, minuteLimit)
	}
	if n != minuteLimit {
		t.Errorf("admitted %d, want the whole minute limit %d: units stranded", n, minuteLimit)
	}
	if leased.Load() == 0 { // a third to a half on an idle machine; a tenth under a loaded one
		t.Errorf("none of %d admitted checks came from a lease", n)
	}
	waitNoLeases(t, rigs...)
	if taken.Load() == 0 || returned.Load() != taken.Load() {
		t.Errorf("leases taken %d, returned %d", taken.Load(), returned.Load())
	}
	got := rigs[0].usage(t, "acme")
	for c, v := range all("tokens", n) {
		if got[c] != v {
			t.Errorf("month counter %v = %d, want the admitted total %d", c, got[c], v)
		}
	}
	b := rigs[0].bucket(t, "acme", time.Minute, minute)
	if v := b["tokens|u|eng|alice"]; v != itoa(n) {
		t.Errorf("minute bucket of the user = %s, want the admitted total %d", v, n)
	}
	if h := rigs[0].held(t, "acme"); len(h) > 0 {
		for f, v := range h {
			if v != "0" {
				t.Errorf("held %s = %s after every lease was settled", f, v)
			}
		}
	}
}

// A replica killed with leases open (its Redis client gone, so nothing is settled):
// the reservation sweep gives its leases back within the lease's end + 1 s of grace +
// one sweep interval; the units admitted from them are given back uncounted (the
// documented loss), and every other unit is counted exactly.
func TestLeasesOfAKilledReplicaComeBack(t *testing.T) {
	const life, sweep = 2 * time.Second, 100 * time.Millisecond
	var lostUnits, lostUsed atomic.Int64
	rigs := leaseRigs(t, 2, life, func(ev quota.LeaseEvent) {
		if ev.Kind == quota.LeaseFailed {
			lostUnits.Add(ev.Units)
			lostUsed.Add(ev.Used)
		}
	})
	a, b := rigs[0], rigs[1]
	req := quota.Request{Org: "acme", Team: "eng", User: "bob", Metric: "tokens", Cost: 1, Limits: quota.LevelLimits{
		Org: []quota.Limit{lim(quota.Month, 1_000_000)}, User: []quota.Limit{lim(quota.Month, 1_000_000)},
	}}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(500 * time.Millisecond)
	for range 64 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				res, err := b.e.Check(context.Background(), req)
				if err != nil {
					t.Errorf("Check: %v", err)
					return
				}
				if res.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	time.Sleep(100 * time.Millisecond) // leases replaced during the load are settled
	if held, _ := b.e.LeasedUnits(); held == 0 {
		t.Fatal("the replica holds no lease after hot load")
	}
	_ = b.rdb.Close() // killed: it can settle nothing
	killed := time.Now()
	_ = b.e.Close()
	if lostUnits.Load() == 0 {
		t.Fatal("no lease was left unsettled by the kill")
	}
	user := userC("tokens", "eng", "bob")
	if h, err := a.e.HeldUnits(context.Background(), "acme", a.e.Period(1).ID); err != nil || h[user] != lostUnits.Load() {
		t.Fatalf("held after the kill = %v (%v), want the dead replica's leases %d", h, err, lostUnits.Load())
	}
	var back time.Duration
	for {
		if _, err := a.e.SweepReservations(context.Background()); err != nil {
			t.Fatal(err)
		}
		h, err := a.e.HeldUnits(context.Background(), "acme", a.e.Period(1).ID)
		if err != nil {
			t.Fatal(err)
		}
		if h[user] == 0 {
			back = time.Since(killed)
			break
		}
		if time.Since(killed) > 10*time.Second {
			t.Fatal("the dead replica's lease is still held 10 s after the kill")
		}
		time.Sleep(sweep)
	}
	bound := life + time.Second + sweep
	t.Logf("leases of %d units (%d admitted from them) back %s after the kill (bound: lease life %s + grace 1s + sweep %s = %s)",
		lostUnits.Load(), lostUsed.Load(), back, life, sweep, bound)
	if back > bound+200*time.Millisecond {
		t.Errorf("the lease came back %s after the kill, over the stated bound %s", back, bound)
	}
	want := admitted.Load() - lostUsed.Load()
	if got := a.usage(t, "acme")[user]; got != want {
		t.Errorf("user counter = %d, want admitted %d - %d admitted from the dead leases", got, admitted.Load(), lostUsed.Load())
	}
}

// Not leased: shadow mode, idempotent checks, cost 0 and NoLease go to Redis however hot.
func TestLeasesNotForEveryCheck(t *testing.T) {
	rigs := leaseRigs(t, 1, 200*time.Millisecond, nil)
	r := rigs[0]
	base := quota.Request{Org: "acme", Team: "eng", User: "carol", Metric: "tokens", Cost: 1,
		Limits: quota.LevelLimits{User: []quota.Limit{lim(quota.Month, 1_000_000)}}}
	cases := map[string]func(quota.Request, int) quota.Request{
		"shadow":  func(q quota.Request, _ int) quota.Request { q.Mode = quota.Shadow; return q },
		"warn":    func(q quota.Request, _ int) quota.Request { q.Mode = quota.Warn; return q },
		"cost 0":  func(q quota.Request, _ int) quota.Request { q.Cost = 0; return q },
		"nolease": func(q quota.Request, _ int) quota.Request { q.NoLease = true; return q },
		"idempotent": func(q quota.Request, i int) quota.Request {
			q.IdempotencyKey = "key-" + itoa(int64(i)) + "-abcdefgh"
			return q
		},
	}
	for name, mk := range cases {
		t.Run(name, func(t *testing.T) {
			q := base
			q.User = "u-" + name[:4]
			for i := range 400 {
				res := r.MustCheck(t, mk(q, i))
				if res.Leased {
					t.Fatalf("check %d answered from a lease", i)
				}
			}
		})
	}
	if held, _ := r.e.LeasedUnits(); held != 0 {
		t.Errorf("leases held %d", held)
	}
	// The same load, enforced, is leased.
	leased := 0
	for stop := time.Now().Add(time.Second); time.Now().Before(stop); {
		if r.MustCheck(t, base).Leased {
			leased++
		}
	}
	if leased == 0 {
		t.Error("a hot enforced path was never leased")
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// Cold paths (distinct users, each checked rarely) get no lease state: their rates are
// measured in a fixed table, so a million distinct users cost no memory; a hot path does.
func TestLeasesColdPathsHoldNoState(t *testing.T) {
	r := leaseRigs(t, 1, 200*time.Millisecond, nil)[0]
	req := quota.Request{Org: "acme", Team: "eng", Metric: "tokens", Cost: 1,
		Limits: quota.LevelLimits{User: []quota.Limit{lim(quota.Month, 1_000_000)}}}
	for i := range 2000 {
		req.User = "u" + itoa(int64(i))
		r.MustCheck(t, req)
	}
	if n := quota.LeasePaths(r.e); n != 0 {
		t.Errorf("%d paths hold lease state after 2,000 distinct users checked once", n)
	}
	req.User = "hot"
	for stop := time.Now().Add(300 * time.Millisecond); time.Now().Before(stop); {
		r.MustCheck(t, req)
	}
	if n := quota.LeasePaths(r.e); n != 1 {
		t.Errorf("%d paths hold lease state, want the hot one", n)
	}
}

// A lease whose reservation expired before its replica settled it (the replica stalled
// past the grace, and a sweep released it whole): the commit finds it expired, and the
// units admitted from it are counted by a forced check, so the month counters still
// equal the admitted total.
func TestLeaseExpiredBeforeItsCommitIsCounted(t *testing.T) {
	prefix := testenv.ID(t, "ql")
	a := MustRig(t, "", quota.Config{KeyPrefix: prefix, Leases: quota.LeaseConfig{Enabled: true, Max: 400 * time.Millisecond, Threshold: 50}})
	clk := newClock()
	clk.t = time.Now()
	sweeper := MustRig(t, "", quota.Config{KeyPrefix: prefix, Clock: clk.Now})
	clk.Add(time.Hour) // the sweeper sees every lease past its expiry
	req := quota.Request{Org: "acme", Team: "eng", User: "dan", Metric: "tokens", Cost: 1,
		Limits: quota.LevelLimits{User: []quota.Limit{lim(quota.Month, 1_000_000)}}}
	var admitted, leased atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(300 * time.Millisecond)
	for range 16 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				res := a.MustCheck(t, req)
				if res.Allowed {
					admitted.Add(1)
				}
				if res.Leased {
					leased.Add(1)
				}
			}
		})
	}
	wg.Wait()
	expired, err := sweeper.e.ExpireDue(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	if len(expired) == 0 || leased.Load() == 0 {
		t.Fatalf("expired %d leases, %d answers leased: nothing to test", len(expired), leased.Load())
	}
	waitNoLeases(t, a)
	if got, want := a.usage(t, "acme")[userC("tokens", "eng", "dan")], admitted.Load(); got != want {
		t.Errorf("user counter = %d, want the admitted %d", got, want)
	}
}

// A path that turns hot is leased once a burst has brought twice the threshold's units
// of one rate window (2 x 200/s x 50 ms = 20), not only after whole windows have
// passed: on a clock that stands still, the burst alone is enough. Before, a path
// needed a full window in the slot table and another of its own, so the first ~100 ms
// of every burst went to Redis check by check (2 % of a 4-s paced run, its p99).
func TestHotPathLeasedWithoutWaitingForAWindow(t *testing.T) {
	clk := newClock()
	r := MustRig(t, "", quota.Config{KeyPrefix: testenv.ID(t, "ql"), Clock: clk.Now,
		Leases: quota.LeaseConfig{Enabled: true, Max: 200 * time.Millisecond}})
	req := quota.Request{Org: "acme", Team: "eng", User: "erin", Metric: "tokens", Cost: 1,
		Limits: quota.LevelLimits{User: []quota.Limit{lim(quota.Month, 1_000_000)}}}
	sent := 0
	for ; sent < 200; sent++ {
		if r.MustCheck(t, req).Leased {
			break
		}
	}
	// 20 to be known hot, one to see the path's headroom, then the lease.
	if sent > 22 {
		t.Fatalf("the first leased answer came after %d checks on a clock standing still, want at most 22", sent)
	}
	t.Logf("leased after %d checks", sent)
}
