package quota_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Concurrency limits (vocab.Concurrent, KEYS.md "Concurrency"): units held at once by
// open reservations, per counter, given back whole exactly once.

func conc(n int64) vocab.Limit { return vocab.Limit{Window: vocab.Concurrent, Limit: n} }

// inFlight reads the engine's in-flight units of org; a test fails on any negative.
func (r *testRig) inFlight(tb testing.TB, org string) map[quota.Counter]int64 {
	tb.Helper()
	m, err := r.e.InFlight(context.Background(), org)
	if err != nil {
		tb.Fatal(err)
	}
	for f, v := range r.raw.HGetAll(context.Background(), r.prefix+":{"+org+"}|c").Val() {
		if v[0] == '-' {
			tb.Fatalf("in-flight %s is %s", f, v)
		}
	}
	return m
}

func TestConcurrentReservationsHoldAndChecksOnlyTest(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	ctx := context.Background()
	limits := quota.LevelLimits{User: []vocab.Limit{conc(3), lim(vocab.Month, 1000)}}
	req := reserveReq("acme", 1, limits)
	a := r.mustReserve(t, req, quota.ReserveOptions{})
	req.Cost = 2
	b := r.mustReserve(t, req, quota.ReserveOptions{})
	if got := r.inFlight(t, "acme"); !cmp.Equal(got, all("tokens", 3)) {
		t.Fatalf("in flight after 1 + 2 held = %v, want 3 at every level", got)
	}
	// Full: a reservation of 1 more is denied at the user's concurrent limit, holds nothing.
	req.Cost = 1
	_, out, err := r.e.Reserve(ctx, req, quota.ReserveOptions{})
	if err != nil || out.Allowed || out.BlockedAt == nil || out.BlockedAt.Window != vocab.Concurrent || out.BlockedAt.Level != vocab.LevelUser {
		t.Fatalf("4th unit: allowed %v blocked %+v err %v; want denied at user/concurrent", out.Allowed, out.BlockedAt, err)
	}
	// A check tests held + cost <= limit: cost 1 is refused, cost 0 passes; neither holds.
	creq := req
	if res := r.MustCheck(t, creq); res.Allowed || res.BlockedAt.Window != vocab.Concurrent {
		t.Fatalf("check of 1 with 3 of 3 in flight: %+v", res)
	}
	creq.Cost = 0
	if res := r.MustCheck(t, creq); !res.Allowed || res.Levels[0].Used != 3 || res.Levels[0].Window != vocab.Concurrent {
		t.Fatalf("check of 0: %+v", res)
	}
	// Commit of 5 (over the amount of 2) gives all of the 2 back from flight; used counts in the month.
	if _, err := r.e.Commit(ctx, "acme", 1, b.ID, 5); err != nil {
		t.Fatal(err)
	}
	if got := r.inFlight(t, "acme"); !cmp.Equal(got, all("tokens", 1)) {
		t.Fatalf("in flight after commit = %v, want 1", got)
	}
	creq.Cost = 2
	if res := r.MustCheck(t, creq); !res.Allowed || res.Levels[0].Used != 1 {
		t.Fatalf("check of 2 with 1 in flight: %+v", res)
	}
	if got := r.inFlight(t, "acme"); !cmp.Equal(got, all("tokens", 1)) {
		t.Fatalf("a check held something: in flight %v", got)
	}
	if _, err := r.e.Release(ctx, "acme", 1, a.ID); err != nil {
		t.Fatal(err)
	}
	// A repeated release, a commit after it: nothing moves again.
	if _, err := r.e.Release(ctx, "acme", 1, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := r.e.Commit(ctx, "acme", 1, a.ID, 1); err == nil {
		t.Fatal("commit after release: no error")
	}
	if got := r.inFlight(t, "acme"); len(got) != 0 {
		t.Fatalf("in flight after all settled = %v, want none", got)
	}
	if n := r.raw.Exists(ctx, r.prefix+":{acme}|c").Val(); n != 0 {
		t.Fatal("in-flight hash left behind with nothing in flight")
	}
	// month: the commit's 5 and the check's 2 (checks count in the other windows as before)
	if got := r.usage(t, "acme"); !cmp.Equal(got, all("tokens", 7)) {
		t.Fatalf("month usage = %v, want 7", got)
	}
}

// A reservation on a path without a concurrent limit holds nothing in flight.
func TestReservationWithoutConcurrentLimitNotInFlight(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	r.mustReserve(t, reserveReq("acme", 4, quota.LevelLimits{User: []vocab.Limit{lim(vocab.Month, 10)}}), quota.ReserveOptions{})
	if got := r.inFlight(t, "acme"); len(got) != 0 {
		t.Fatalf("in flight = %v, want none", got)
	}
}

// Expiry gives the slot back once: the sweep, a late release and another sweep leave
// in-flight at 0, and on_expiry commit counts the amount once.
func TestConcurrentExpiryGivesBackOnce(t *testing.T) {
	t.Parallel()
	clk := newClock()
	r := MustRig(t, "", quota.Config{Clock: clk.Now})
	ctx := context.Background()
	limits := quota.LevelLimits{Org: []vocab.Limit{conc(2)}}
	res := r.mustReserve(t, reserveReq("acme", 2, limits), quota.ReserveOptions{TTL: time.Second})
	clk.Add(2 * time.Second)
	for range 2 {
		if _, err := r.e.ExpireDue(ctx, "acme"); err != nil {
			t.Fatal(err)
		}
	}
	var se *quota.StateError
	if _, err := r.e.Release(ctx, "acme", 1, res.ID); !errors.As(err, &se) || se.State != vocab.Expired {
		t.Fatalf("release after expiry: %v", err)
	}
	if got := r.inFlight(t, "acme"); len(got) != 0 {
		t.Fatalf("in flight after expiry = %v, want none", got)
	}
	if got := r.usage(t, "acme"); !cmp.Equal(got, all("tokens", 2)) {
		t.Fatalf("month usage = %v, want the amount once", got)
	}
	r.mustReserve(t, reserveReq("acme", 2, limits), quota.ReserveOptions{}) // the slots are free again
}

// Extend keeps a slot held past its first TTL; without it the slot expires.
func TestExtendKeepsSlotAlive(t *testing.T) {
	t.Parallel()
	clk := newClock()
	r := MustRig(t, "", quota.Config{Clock: clk.Now})
	ctx := context.Background()
	limits := quota.LevelLimits{User: []vocab.Limit{conc(2)}}
	streaming := r.mustReserve(t, reserveReq("acme", 1, limits), quota.ReserveOptions{TTL: 2 * time.Second, OnExpiry: vocab.ExpiryRelease})
	idle := r.mustReserve(t, reserveReq("acme", 1, limits), quota.ReserveOptions{TTL: 2 * time.Second, OnExpiry: vocab.ExpiryRelease})
	for range 5 { // 5 s of "streaming", a heartbeat every second, the sweep running
		clk.Add(time.Second)
		got, err := r.e.Extend(ctx, "acme", 1, streaming.ID, 2*time.Second)
		if err != nil {
			t.Fatalf("extend: %v", err)
		}
		if want := r.e.Now().Add(2 * time.Second).UnixMilli(); got.ExpiresAt.UnixMilli() != want || got.State != vocab.Held {
			t.Fatalf("extended: %+v, want held until %d", got, want)
		}
		if _, err := r.e.ExpireDue(ctx, "acme"); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := r.e.Reservation(ctx, "acme", 1, streaming.ID); got.State != vocab.Held {
		t.Fatalf("extended reservation: %s, want held", got.State)
	}
	if got, _ := r.e.Reservation(ctx, "acme", 1, idle.ID); got.State != vocab.Expired {
		t.Fatalf("reservation without extend: %s, want expired", got.State)
	}
	if got := r.inFlight(t, "acme"); !cmp.Equal(got, all("tokens", 1)) {
		t.Fatalf("in flight = %v, want the extended slot only", got)
	}
	// Extending a settled reservation: 409's error, naming the state.
	var se *quota.StateError
	if _, err := r.e.Extend(ctx, "acme", 1, idle.ID, time.Second); !errors.As(err, &se) || se.State != vocab.Expired {
		t.Fatalf("extend of expired: %v", err)
	}
	// Past its expiry but not swept yet: extend settles it by its on_expiry, once.
	clk.Add(3 * time.Second)
	if _, err := r.e.Extend(ctx, "acme", 1, streaming.ID, time.Second); !errors.As(err, &se) || se.State != vocab.Expired {
		t.Fatalf("extend past expiry: %v", err)
	}
	if got := r.inFlight(t, "acme"); len(got) != 0 {
		t.Fatalf("in flight = %v, want none", got)
	}
	if _, err := r.e.Extend(ctx, "acme", 1, streaming.ID, 0); !errors.Is(err, quota.ErrInvalid) {
		t.Fatalf("ttl 0: %v", err)
	}
	if _, err := r.e.Extend(ctx, "acme", 1, "r_0000000000000000000000", time.Second); !errors.Is(err, quota.ErrReservationNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
}

// memHydrator keeps what Drain took, as the ledger does, and hands it back.
type memHydrator struct {
	mu       sync.Mutex
	counters map[quota.Counter]int64
	recs     map[string]quota.ReservationRecord
}

func (h *memHydrator) StoredUsage(context.Context, string, vocab.Period) (map[quota.Counter]int64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[quota.Counter]int64{}
	for c, v := range h.counters {
		out[c] = v
	}
	return out, nil
}

func (h *memHydrator) StoredReservations(context.Context, string, vocab.Period) ([]quota.ReservationRecord, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []quota.ReservationRecord
	for _, r := range h.recs {
		out = append(out, r)
	}
	return out, nil
}

func (h *memHydrator) persist(tb testing.TB, e *quota.Engine, org string) {
	tb.Helper()
	d, err := e.Drain(context.Background(), org, e.Period(1).ID)
	if err != nil {
		tb.Fatal(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for c, v := range d.Counters {
		h.counters[c] = v
	}
	for _, r := range d.Reservations {
		h.recs[r.ID] = r
	}
}

// After Redis loses the org's keys, hydration rebuilds in-flight from the held
// reservations it restores: every slot counted once, none leaked, none twice (a
// second hydration of the same records changes nothing), and each still settles once.
func TestConcurrentSurvivesRedisLoss(t *testing.T) {
	t.Parallel()
	h := &memHydrator{counters: map[quota.Counter]int64{}, recs: map[string]quota.ReservationRecord{}}
	clk := newClock()
	r := MustRig(t, "", quota.Config{Hydrator: h, Clock: clk.Now})
	ctx := context.Background()
	limits := quota.LevelLimits{User: []vocab.Limit{conc(5)}}
	a := r.mustReserve(t, reserveReq("acme", 2, limits), quota.ReserveOptions{TTL: time.Minute})
	b := r.mustReserve(t, reserveReq("acme", 1, limits), quota.ReserveOptions{TTL: time.Minute})
	h.persist(t, r.e, "acme")
	before := r.inFlight(t, "acme")
	if !cmp.Equal(before, all("tokens", 3)) {
		t.Fatalf("in flight = %v", before)
	}
	r.wipeOrg(t, "acme")
	// The next reservation hydrates first: 3 restored + 2 = the limit, the third is refused.
	c := r.mustReserve(t, reserveReq("acme", 2, limits), quota.ReserveOptions{TTL: time.Minute})
	if got := r.inFlight(t, "acme"); !cmp.Equal(got, all("tokens", 5)) {
		t.Fatalf("in flight after hydration = %v, want 3 restored + 2", got)
	}
	if _, out, err := r.e.Reserve(ctx, reserveReq("acme", 1, limits), quota.ReserveOptions{}); err != nil || out.Allowed {
		t.Fatalf("over the restored slots: allowed %v err %v", out.Allowed, err)
	}
	// Lose only the month hash (the marker) this time: hydration runs again with the
	// same stored records while the records and the in-flight hash survive.
	r.raw.Del(ctx, r.prefix+":{acme}|m|"+r.e.Period(1).ID)
	r.MustCheck(t, reserveReq("acme", 0, limits))
	if got := r.inFlight(t, "acme"); !cmp.Equal(got, all("tokens", 5)) {
		t.Fatalf("in flight after a second hydration = %v, want 5", got)
	}
	for _, id := range []string{a.ID, b.ID, c.ID} {
		if _, err := r.e.Release(ctx, "acme", 1, id); err != nil {
			t.Fatalf("release %s: %v", id, err)
		}
	}
	if got := r.inFlight(t, "acme"); len(got) != 0 {
		t.Fatalf("in flight after releases = %v, want none", got)
	}
}

// 64 clients over 2 engines hold and release slots under user 3, team 5, org 8 (2
// teams of 3 users, so each level binds): a sampler reading in-flight throughout never
// sees a level over its limit, every level is seen full, and at the end nothing is in
// flight.
func TestConcurrentLimitsNeverExceededAcrossEngines(t *testing.T) {
	t.Parallel()
	r1 := MustRig(t, "", quota.Config{})
	r2 := MustRig(t, "", quota.Config{KeyPrefix: r1.prefix})
	ctx := context.Background()
	limits := func() quota.LevelLimits {
		return quota.LevelLimits{Org: []vocab.Limit{conc(8)}, Team: []vocab.Limit{conc(5)}, User: []vocab.Limit{conc(3)}}
	}
	teams, users := []string{"t1", "t2"}, []string{"u1", "u2", "u3"}
	limitOf := map[vocab.Level]int64{vocab.LevelOrg: 8, vocab.LevelTeam: 5, vocab.LevelUser: 3}

	var stop atomic.Bool
	var maxSeen sync.Map // level -> max seen
	var samples, over atomic.Int64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for !stop.Load() {
			m, err := r1.e.InFlight(ctx, "acme") // not inFlight: no Fatal off the test's goroutine
			if err != nil {
				t.Error(err)
				return
			}
			samples.Add(1)
			for c, v := range m {
				if v > limitOf[c.Level] {
					over.Add(1)
					t.Errorf("%+v in flight %d > limit %d", c, v, limitOf[c.Level])
				}
				if old, ok := maxSeen.Load(c.Level); !ok || v > old.(int64) {
					maxSeen.Store(c.Level, v)
				}
			}
		}
	}()

	var wg sync.WaitGroup
	var admitted, denied atomic.Int64
	deadline := time.Now().Add(3 * time.Second)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e := r1.e
			if i%2 == 1 {
				e = r2.e
			}
			req := quota.Request{Org: "acme", Team: teams[i%2], User: users[(i/2)%3], Metric: "requests", Cost: 1 + int64(i%2), Limits: limits()}
			for n := 0; time.Now().Before(deadline); n++ {
				res, out, err := e.Reserve(ctx, req, quota.ReserveOptions{TTL: time.Minute})
				if err != nil {
					t.Error(err)
					return
				}
				if !out.Allowed {
					denied.Add(1)
					time.Sleep(time.Millisecond)
					continue
				}
				admitted.Add(1)
				time.Sleep(time.Duration(n%3) * time.Millisecond)
				if n%2 == 0 {
					_, err = e.Release(ctx, "acme", 1, res.ID)
				} else {
					_, err = e.Commit(ctx, "acme", 1, res.ID, 1)
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	stop.Store(true)
	<-sampled
	if got := r1.inFlight(t, "acme"); len(got) != 0 {
		t.Fatalf("in flight after the run = %v, want none", got)
	}
	for lv, l := range limitOf {
		if v, _ := maxSeen.Load(lv); v == nil || v.(int64) < l-1 {
			t.Errorf("level %s peaked at %v in flight, limit %d: the test did not bind it", lv, v, l)
		}
	}
	t.Logf("%d admitted, %d denied, %d samples, %d over a limit", admitted.Load(), denied.Load(), samples.Load(), over.Load())
	if admitted.Load() == 0 || denied.Load() == 0 {
		t.Fatalf("admitted %d denied %d: the limits did not bind", admitted.Load(), denied.Load())
	}
}

// holderEnv makes the test binary, re-executed, the holder process of
// TestConcurrentKilledHolderSlotsComeBack: "<redis url> <key prefix>".
const holderEnv = "QUOTA_TEST_CONCURRENT_HOLDER"

// TestConcurrentHolderProcess is the holder: it reserves 3 slots of 2 units (TTL 1 s,
// on_expiry commit), prints their ids and waits to be killed. Skipped unless re-executed.
func TestConcurrentHolderProcess(t *testing.T) {
	arg := os.Getenv(holderEnv)
	if arg == "" {
		t.Skip("the holder process of TestConcurrentKilledHolderSlotsComeBack")
	}
	url, prefix, _ := strings.Cut(arg, " ")
	opt, err := quota.ClientOptions(url)
	if err != nil {
		t.Fatal(err)
	}
	e, err := quota.New(redis.NewClient(opt), quota.Config{KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 3 {
		res, out, err := e.Reserve(context.Background(), reserveReq("acme", 2, holderLimits()), quota.ReserveOptions{TTL: time.Second})
		if err != nil || !out.Allowed {
			t.Fatalf("reserve: %v %+v", err, out)
		}
		ids = append(ids, res.ID)
	}
	fmt.Printf("HELD %s\n", strings.Join(ids, " "))
	select {} // until kill -9
}

func holderLimits() quota.LevelLimits {
	return quota.LevelLimits{Org: []vocab.Limit{conc(8)}, User: []vocab.Limit{conc(6), lim(vocab.Month, 100)}}
}

// A holder killed for real (kill -9, no release, no defer): its slots come back
// within its TTL + one sweep interval, exactly once (in-flight returns to 0 and stays
// there under further sweeps by two engines; the month counts each amount once).
func TestConcurrentKilledHolderSlotsComeBack(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	r2 := MustRig(t, "", quota.Config{KeyPrefix: r.prefix})
	url := testenv.RedisURL(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestConcurrentHolderProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), holderEnv+"="+url+" "+r.prefix)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	held := time.Now()
	if err != nil || !strings.HasPrefix(line, "HELD ") {
		t.Fatalf("holder said %q, %v", line, err)
	}
	if got := r.inFlight(t, "acme"); !cmp.Equal(got, all("tokens", 6)) {
		t.Fatalf("in flight with the holder alive = %v, want 6", got)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// Full while the dead holder's slots are held: nothing fits at the user.
	if _, res, err := r.e.Reserve(context.Background(), reserveReq("acme", 1, holderLimits()), quota.ReserveOptions{}); err != nil || res.Allowed {
		t.Fatalf("reserve over the dead holder's slots: allowed %v, %v", res.Allowed, err)
	}
	const ttl, interval = time.Second, 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for _, e := range []*quota.Engine{r.e, r2.e} { // two sweepers at once, as two workers
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk := time.NewTicker(interval)
			defer tk.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tk.C:
					_, _ = e.SweepReservations(ctx)
				}
			}
		}()
	}
	for len(r.inFlight(t, "acme")) > 0 {
		if time.Since(held) > ttl+interval+300*time.Millisecond { // + scheduling slack under -race
			t.Fatalf("slots still in flight %s after the holder's reservations: %v", time.Since(held), r.inFlight(t, "acme"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	back := time.Since(held)
	time.Sleep(3 * interval) // more sweeps by both engines: nothing moves again
	cancel()
	wg.Wait()
	if got := r.inFlight(t, "acme"); len(got) != 0 {
		t.Fatalf("in flight after more sweeps = %v", got)
	}
	if got := r.usage(t, "acme"); !cmp.Equal(got, all("tokens", 6)) {
		t.Fatalf("month = %v, want each amount counted once (on_expiry commit)", got)
	}
	for _, id := range strings.Fields(strings.TrimPrefix(line, "HELD ")) {
		if res, err := r.e.Reservation(context.Background(), "acme", 1, id); err != nil || res.State != vocab.Expired {
			t.Fatalf("%s: %s, %v; want expired", id, res.State, err)
		}
	}
	t.Logf("slots back %s after they were held (ttl %s, sweep every %s)", back, ttl, interval)
}

// A hot path with a concurrent limit is never leased: a lease is a reservation and
// would hold in flight (and its in-process admissions could not see other holders).
// The same path without the concurrent limit is leased (the test's control).
func TestConcurrentPathNotLeased(t *testing.T) {
	t.Parallel()
	for _, withConc := range []bool{true, false} {
		var taken atomic.Int64
		r := MustRig(t, "", quota.Config{Leases: quota.LeaseConfig{Enabled: true, Threshold: 10,
			OnLease: func(ev quota.LeaseEvent) {
				if ev.Kind == quota.LeaseTaken {
					taken.Add(1)
				}
			}}})
		limits := quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 1_000_000)}}
		if withConc {
			limits.User = []vocab.Limit{conc(1000)}
		}
		for i := range 400 {
			if res := r.MustCheck(t, reserveReq("acme", 1, limits)); !res.Allowed {
				t.Fatalf("check denied: %+v", res)
			}
			if i%10 == 0 {
				if got := r.inFlight(t, "acme"); len(got) != 0 {
					t.Fatalf("concurrent %v: in flight during checks = %v, want none", withConc, got)
				}
			}
		}
		if withConc && taken.Load() != 0 {
			t.Errorf("%d leases taken on a path with a concurrent limit", taken.Load())
		}
		if !withConc && taken.Load() == 0 {
			t.Errorf("control: no lease taken on the hot path without a concurrent limit")
		}
	}
}

// An extension is persisted with the record (extend marks it changed for the drain):
// after Redis loses its data the reservation comes back with its extended expiry, and
// its slot with it.
func TestExtensionSurvivesRedisLoss(t *testing.T) {
	t.Parallel()
	h := &memHydrator{counters: map[quota.Counter]int64{}, recs: map[string]quota.ReservationRecord{}}
	r := MustRig(t, "", quota.Config{Hydrator: h})
	ctx := context.Background()
	limits := quota.LevelLimits{User: []vocab.Limit{conc(1)}}
	res := r.mustReserve(t, reserveReq("acme", 1, limits), quota.ReserveOptions{TTL: 2 * time.Second})
	h.persist(t, r.e, "acme")
	ext, err := r.e.Extend(ctx, "acme", 1, res.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	h.persist(t, r.e, "acme")
	r.wipeOrg(t, "acme")
	got, err := r.e.Reservation(ctx, "acme", 1, res.ID) // hydrates
	if err != nil || got.State != vocab.Held || !got.ExpiresAt.Equal(ext.ExpiresAt) {
		t.Fatalf("after the loss: %+v, %v; want held until %s", got, err, ext.ExpiresAt)
	}
	if got := r.inFlight(t, "acme"); !cmp.Equal(got, all("tokens", 1)) {
		t.Fatalf("in flight after the loss = %v, want the extended slot", got)
	}
}
