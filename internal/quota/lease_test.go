package quota_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
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
		Org:  []vocab.Limit{lim(vocab.Month, 1_000_000), lim(vocab.Minute, 100_000)},
		Team: []vocab.Limit{lim(vocab.Month, 100_000)},
		User: []vocab.Limit{lim(vocab.Month, monthLimit), lim(vocab.Minute, minuteLimit)},
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

// kill stops r as kill -9 would leave it: its Redis client is closed first, so
// nothing it held is settled (Close then tries once and fails).
func (r *testRig) kill() {
	_ = r.rdb.Close()
	_ = r.e.Close()
}

// sweepUntilNothingHeld runs the reservation sweep on r until org holds nothing: the
// dead replicas' leases have expired. It returns how long that took.
func sweepUntilNothingHeld(t *testing.T, r *testRig, org string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		if _, err := r.e.SweepReservations(context.Background()); err != nil {
			t.Fatal(err)
		}
		h, err := r.e.HeldUnits(context.Background(), org, r.e.Period(1).ID)
		if err != nil {
			t.Fatal(err)
		}
		held := int64(0)
		for _, v := range h {
			held += v
		}
		if held == 0 {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("%d units still held %s after the kill", held, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A replica killed with a lease open (its Redis client gone, so nothing is settled)
// leaves the lease to the sweep, which commits it whole at its expiry: the units
// admitted from it stay counted, never given back to be admitted again, and the
// over-count is the lease's unused part, at most one lease of the path, 1/(16 x
// replicas) of its headroom.
func TestLeasesOfAKilledReplicaAreCounted(t *testing.T) {
	// The kill may fall between two leases of the path (the last one settled, the next
	// not yet taken): then nothing was open, nothing is lost, and the run proves
	// nothing. It is tried again, on fresh rigs, up to three times.
	for attempt := 1; !killedReplicaRun(t, attempt == 3); attempt++ {
		t.Logf("attempt %d: the kill fell between two leases (none open) or cut a settle's reply; again", attempt)
	}
}

// killedReplicaRun is one run of TestLeasesOfAKilledReplicaAreCounted; false when no
// lease was open at the kill and last is false.
func killedReplicaRun(t *testing.T, last bool) bool {
	const life, limit = 300 * time.Millisecond, 200_000
	var lostLeases, lostUnits, lostUsed atomic.Int64
	rigs := leaseRigs(t, 2, life, func(ev quota.LeaseEvent) {
		if ev.Kind == quota.LeaseFailed {
			lostLeases.Add(1)
			lostUnits.Add(ev.Units)
			lostUsed.Add(ev.Used)
		}
	})
	a, b := rigs[0], rigs[1]
	req := quota.Request{Org: "acme", Team: "eng", User: "bob", Metric: "tokens", Cost: 1, Limits: quota.LevelLimits{
		Org: []vocab.Limit{lim(vocab.Month, 1_000_000)}, User: []vocab.Limit{lim(vocab.Month, limit)},
	}}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	var killed atomic.Bool
	for range 64 {
		wg.Go(func() {
			for !killed.Load() {
				res, err := b.e.Check(context.Background(), req)
				if err != nil {
					return // killed
				}
				if res.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	// Killed under load, with its lease open: the checks in flight fail, those
	// answered count.
	time.Sleep(300 * time.Millisecond)
	for deadline := time.Now().Add(2 * time.Second); ; {
		if quota.LeaseAdmitting(b.e) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the replica holds no lease under hot load")
		}
		time.Sleep(100 * time.Microsecond)
	}
	b.kill()
	killed.Store(true)
	wg.Wait()
	if n := lostLeases.Load(); n == 0 && !last {
		return false
	} else if n != 1 {
		t.Fatalf("%d leases left unsettled by the kill, want the path's one", n)
	}
	user := userC("tokens", "eng", "bob")
	// The kill may also cut the reply of a settle that Redis ran: the replica reports
	// its lease lost, yet nothing is held (it was settled, its units counted as used).
	// That run proves nothing about a dead lease either: tried again.
	if h, err := a.e.HeldUnits(context.Background(), "acme", a.e.Period(1).ID); err == nil && h[user] == 0 && !last {
		t.Logf("the kill cut the reply of a settle Redis ran (%d units reported lost, none held)", lostUnits.Load())
		return false
	}
	if h, err := a.e.HeldUnits(context.Background(), "acme", a.e.Period(1).ID); err != nil || h[user] != lostUnits.Load() {
		t.Fatalf("held after the kill = %v (%v), want the dead replica's lease %d", h, err, lostUnits.Load())
	}
	back := sweepUntilNothingHeld(t, a, "acme", 5*time.Second)
	n, got := admitted.Load(), a.usage(t, "acme")[user]
	over, bound := got-n, int64(limit/(16*2))
	t.Logf("admitted %d; the dead lease: %d units, %d admitted from it; counted %d (+%d, bound limit/(16 x 2) = %d), committed by the sweep %s after the kill",
		n, lostUnits.Load(), lostUsed.Load(), got, over, bound, back)
	if n > limit {
		t.Errorf("admitted %d over the limit %d", n, limit)
	}
	if got < n {
		t.Errorf("user counter = %d, below the %d admitted: the dead lease's units were given back", got, n)
	}
	// Counted beside: the dead lease's unused units and the checks the kill cut off
	// after Redis ran them (at most one per goroutine: an error, not an answer).
	if unused, cut := lostUnits.Load()-lostUsed.Load(), got-n-(lostUnits.Load()-lostUsed.Load()); cut < 0 || cut > 64 {
		t.Errorf("user counter = %d, want admitted %d + the dead lease's unused %d + at most 64 checks cut off", got, n, unused)
	}
	if over > bound {
		t.Errorf("over-count %d above the bound %d", over, bound)
	}
	return true
}

// A crash loop (a replica started, loaded, killed with its lease open, eight times
// over) never admits past the limit: every dead lease is counted whole, so no unit is
// admitted twice; counted - admitted is the dead leases' unused units, within kills x
// limit/(16 x replicas).
func TestLeasesCrashLoopNeverOverAdmits(t *testing.T) {
	const life, limit, kills, loaders = 200 * time.Millisecond, 2000, 8, 8
	prefix := testenv.ID(t, "ql")
	var lostUnits, lostUsed atomic.Int64
	cfg := quota.Config{KeyPrefix: prefix, Leases: quota.LeaseConfig{Enabled: true, Max: life, Threshold: 50, Replicas: 2,
		OnLease: func(ev quota.LeaseEvent) {
			if ev.Kind == quota.LeaseFailed {
				lostUnits.Add(ev.Units)
				lostUsed.Add(ev.Used)
			}
		}},
		OnReservation: func(ev quota.ReservationEvent) {
			t.Errorf("a lease reported as a reservation %s", ev.State)
		}}
	survivor := MustRig(t, "", cfg)
	req := quota.Request{Org: "acme", Team: "eng", User: "cleo", Metric: "tokens", Cost: 1, Limits: quota.LevelLimits{
		Org: []vocab.Limit{lim(vocab.Month, 1_000_000)}, User: []vocab.Limit{lim(vocab.Month, limit)},
	}}
	var admitted, leased atomic.Int64
	for range kills {
		b := MustRig(t, "", cfg)
		var wg sync.WaitGroup
		var killed atomic.Bool
		for range loaders {
			wg.Go(func() {
				for !killed.Load() {
					res, err := b.e.Check(context.Background(), req)
					if err != nil {
						return // killed
					}
					if res.Allowed {
						admitted.Add(1)
					}
					if res.Leased {
						leased.Add(1)
					}
				}
			})
		}
		// Killed mid-load, as soon as it holds a lease (near the limit it takes none).
		time.Sleep(10 * time.Millisecond)
		for deadline := time.Now().Add(150 * time.Millisecond); time.Now().Before(deadline); {
			if quota.LeaseAdmitting(b.e) {
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
		b.kill()
		killed.Store(true)
		wg.Wait()
		sweepUntilNothingHeld(t, survivor, "acme", 5*time.Second)
	}
	n, got := admitted.Load(), survivor.usage(t, "acme")[userC("tokens", "eng", "cleo")]
	bound := int64(kills * limit / (16 * 2))
	t.Logf("%d kills: admitted %d (%d leased) of the limit %d; counted %d (+%d; dead leases %d units, %d admitted from them; bound %d)",
		kills, n, leased.Load(), limit, got, got-n, lostUnits.Load(), lostUsed.Load(), bound)
	if n > limit {
		t.Errorf("admitted %d over the limit %d (%d %%)", n, limit, n*100/limit)
	}
	if got < n {
		t.Errorf("counted %d below the %d admitted", got, n)
	}
	if got > limit {
		t.Errorf("counted %d over the limit %d", got, limit)
	}
	// Counted beside: the dead leases' unused units (the bound) and the checks each
	// kill cut off after Redis ran them (at most one per loader).
	if unused := lostUnits.Load() - lostUsed.Load(); unused > bound || got-n-unused > kills*loaders || got-n-unused < 0 {
		t.Errorf("over-count %d: the dead leases' unused %d (bound %d) + %d checks cut off (at most %d)", got-n, unused, bound, got-n-unused, kills*loaders)
	}
	if lostUnits.Load() == 0 || leased.Load() == 0 {
		t.Errorf("no lease was open at a kill (%d leased answers): nothing tested", leased.Load())
	}
}

// Renewal never leaves two leases of a path open on a replica (a crash would count
// both): sampled throughout a hot load with short leases.
func TestLeasesOneOpenPerPath(t *testing.T) {
	var taken atomic.Int64
	r := leaseRigs(t, 1, 10*time.Millisecond, func(ev quota.LeaseEvent) {
		if ev.Kind == quota.LeaseTaken {
			taken.Add(1)
		}
	})[0]
	req := quota.Request{Org: "acme", Team: "eng", User: "fay", Metric: "tokens", Cost: 1,
		Limits: quota.LevelLimits{User: []vocab.Limit{lim(vocab.Month, 10_000_000)}}}
	var wg sync.WaitGroup
	var most atomic.Int64
	stop := time.Now().Add(time.Second)
	for range 32 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				r.MustCheck(t, req)
			}
		})
	}
	wg.Go(func() {
		for time.Now().Before(stop) {
			if n := int64(quota.OpenLeases(r.e)); n > most.Load() {
				most.Store(n)
			}
			time.Sleep(20 * time.Microsecond)
		}
	})
	wg.Wait()
	t.Logf("%d leases taken, at most %d open at once", taken.Load(), most.Load())
	if taken.Load() < 10 {
		t.Fatalf("%d leases taken: too few renewals to test", taken.Load())
	}
	if most.Load() > 1 {
		t.Errorf("%d leases of one path open at once, want at most 1", most.Load())
	}
}

// The items of a batch take the same path as single checks: on a hot path they are
// admitted from its lease, and the limit holds exactly: the admitted items never pass
// it, the last units are admitted, and once the leases are settled the counter is the
// admitted total.
func TestLeasesAdmitBatchItems(t *testing.T) {
	r := leaseRigs(t, 1, 100*time.Millisecond, nil)[0]
	const limit = 3000
	req := quota.Request{Org: "acme", Team: "eng", User: "dora", Metric: "tokens", Cost: 1,
		Limits: quota.LevelLimits{User: []vocab.Limit{lim(vocab.Month, limit)}}}
	batch := make([]quota.Request, 16)
	for i := range batch {
		batch[i] = req
	}
	var admitted, leased atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(3 * time.Second) // near the limit, units come back from leases
	for range 8 {
		wg.Go(func() {
			for admitted.Load() < limit && time.Now().Before(stop) {
				res, errs := r.e.CheckBatch(context.Background(), batch)
				for i := range res {
					if errs[i] != nil {
						t.Errorf("CheckBatch item %d: %v", i, errs[i])
						return
					}
					if res[i].Allowed {
						admitted.Add(1)
					}
					if res[i].Leased {
						leased.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	n := admitted.Load()
	t.Logf("admitted %d items (%d from leases) at a limit of %d", n, leased.Load(), limit)
	if n != limit {
		t.Errorf("admitted %d batch items, want exactly the limit %d", n, limit)
	}
	if leased.Load() == 0 {
		t.Errorf("none of %d admitted batch items came from a lease", n)
	}
	waitNoLeases(t, r)
	if got := r.usage(t, "acme")[userC("tokens", "eng", "dora")]; got != n {
		t.Errorf("user counter %d, want the admitted total %d", got, n)
	}
}

// Not leased: shadow mode, idempotent checks, cost 0 and NoLease go to Redis however hot.
func TestLeasesNotForEveryCheck(t *testing.T) {
	rigs := leaseRigs(t, 1, 200*time.Millisecond, nil)
	r := rigs[0]
	base := quota.Request{Org: "acme", Team: "eng", User: "carol", Metric: "tokens", Cost: 1,
		Limits: quota.LevelLimits{User: []vocab.Limit{lim(vocab.Month, 1_000_000)}}}
	cases := map[string]func(quota.Request, int) quota.Request{
		"shadow":  func(q quota.Request, _ int) quota.Request { q.Mode = vocab.Shadow; return q },
		"warn":    func(q quota.Request, _ int) quota.Request { q.Mode = vocab.Warn; return q },
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
		Limits: quota.LevelLimits{User: []vocab.Limit{lim(vocab.Month, 1_000_000)}}}
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
// past the grace, and a sweep committed it whole): the commit finds it expired and
// counts nothing more, since the expiry counted the whole amount, at least what was
// admitted. The month counters are the admitted total plus the expired leases' unused
// units, each unit once.
func TestLeaseExpiredBeforeItsCommitIsCounted(t *testing.T) {
	prefix := testenv.ID(t, "ql")
	var expiredUnused, expiredLeases atomic.Int64
	a := MustRig(t, "", quota.Config{KeyPrefix: prefix, Leases: quota.LeaseConfig{Enabled: true, Max: 400 * time.Millisecond, Threshold: 50,
		OnLease: func(ev quota.LeaseEvent) {
			if ev.Kind == quota.LeaseExpired {
				expiredLeases.Add(1)
				expiredUnused.Add(ev.Units - ev.Used)
			}
		}}})
	clk := newClock()
	clk.t = time.Now()
	sweeper := MustRig(t, "", quota.Config{KeyPrefix: prefix, Clock: clk.Now, OnReservation: func(ev quota.ReservationEvent) {
		t.Errorf("a lease's expiry reported as a reservation %s", ev.State)
	}})
	clk.Add(time.Hour) // the sweeper sees every lease past its expiry
	req := quota.Request{Org: "acme", Team: "eng", User: "dan", Metric: "tokens", Cost: 1,
		Limits: quota.LevelLimits{User: []vocab.Limit{lim(vocab.Month, 1_000_000)}}}
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
	for _, r := range expired {
		if r.State != vocab.Expired || r.Used != r.Amount {
			t.Errorf("lease %s expired %s with used %d of %d, want committed whole", r.ID, r.State, r.Used, r.Amount)
		}
	}
	waitNoLeases(t, a)
	if expiredLeases.Load() != int64(len(expired)) {
		t.Errorf("%d leases found expired by their replica, %d expired by the sweep", expiredLeases.Load(), len(expired))
	}
	got, want := a.usage(t, "acme")[userC("tokens", "eng", "dan")], admitted.Load()+expiredUnused.Load()
	t.Logf("admitted %d, %d leases expired with %d units unused, counted %d", admitted.Load(), len(expired), expiredUnused.Load(), got)
	if got != want {
		t.Errorf("user counter = %d, want the admitted %d + the expired leases' unused %d", got, admitted.Load(), expiredUnused.Load())
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
		Limits: quota.LevelLimits{User: []vocab.Limit{lim(vocab.Month, 1_000_000)}}}
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

// A lease whose settlement gives up (Redis frozen past the lease's end, the 1 s grace
// and 10 s of retries) loses nothing and counts nothing twice: the commits its replica
// sent are queued in the frozen server and run when it resumes (the first wins, the
// rest are replays), and if none had, its expiry would commit it whole. So the
// admitted units are counted, plus at most the lease's unused part. (This checks the
// path that gave up; TestLeasesOfAKilledReplicaAreCounted covers a settlement that
// never arrives.)
func TestLeaseWhoseSettleGaveUpIsCounted(t *testing.T) {
	t.Parallel()
	srv := MustPrivateRedis(t)
	var failed, failedUnits, failedUsed atomic.Int64
	cfg := quota.Config{KeyPrefix: testenv.ID(t, "ql"), Leases: quota.LeaseConfig{Enabled: true, Max: 300 * time.Millisecond, Threshold: 50,
		OnLease: func(ev quota.LeaseEvent) {
			if ev.Kind == quota.LeaseFailed {
				failedUnits.Add(ev.Units)
				failedUsed.Add(ev.Used)
				failed.Add(1)
			}
		}}}
	a := MustRig(t, srv.URL(), cfg)
	req := quota.Request{Org: "acme", Team: "eng", User: "gus", Metric: "tokens", Cost: 1,
		Limits: quota.LevelLimits{User: []vocab.Limit{lim(vocab.Month, 1_000_000)}}}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	var stop atomic.Bool
	for range 16 {
		wg.Go(func() {
			for !stop.Load() {
				if a.MustCheck(t, req).Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	for deadline := time.Now().Add(2 * time.Second); !quota.LeaseAdmitting(a.e); {
		if time.Now().After(deadline) {
			t.Fatal("no lease under hot load")
		}
		time.Sleep(100 * time.Microsecond)
	}
	stop.Store(true)
	wg.Wait()
	if err := srv.srv.cmd.Process.Signal(syscall.SIGSTOP); err != nil { // frozen: nothing answers
		t.Fatal(err)
	}
	frozen := time.Now()
	for failed.Load() == 0 {
		if time.Since(frozen) > 20*time.Second {
			_ = srv.srv.cmd.Process.Signal(syscall.SIGCONT)
			t.Fatal("the lease's settlement has not given up 20 s into the freeze")
		}
		time.Sleep(50 * time.Millisecond)
	}
	gaveUp := time.Since(frozen)
	if err := srv.srv.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if failed.Load() != 1 {
		t.Fatalf("%d leases gave up, want 1", failed.Load())
	}
	sweepUntilNothingHeld(t, a, "acme", 5*time.Second)
	n, got := admitted.Load(), a.usage(t, "acme")[userC("tokens", "eng", "gus")]
	t.Logf("admitted %d; the lease whose settlement gave up %s into the freeze: %d units, %d admitted from it; counted %d (+%d)",
		n, gaveUp, failedUnits.Load(), failedUsed.Load(), got, got-n)
	if unused := failedUnits.Load() - failedUsed.Load(); got < n || got > n+unused {
		t.Errorf("counted %d, want the admitted %d + at most the lease's unused %d", got, n, unused)
	}
}
