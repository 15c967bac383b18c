package quota_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// fakeClock is a clock tests move by hand; the engine measures the time elapsed since
// its Redis TIME sample as the difference of its readings.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// newClock starts a fake clock at the start of a minute bucket, plus 1 s, so a test
// knows which bucket it is in.
func newClock() *fakeClock {
	now := time.Now().Truncate(time.Minute).Add(time.Second)
	return &fakeClock{t: now}
}

func reserveReq(org string, cost int64, limits quota.LevelLimits) quota.Request {
	return quota.Request{Org: org, Team: "eng", User: "alice", Metric: "tokens", Cost: cost, Limits: limits}
}

func (r *testRig) mustReserve(tb testing.TB, req quota.Request, opt quota.ReserveOptions) vocab.Reservation {
	tb.Helper()
	res, out, err := r.e.Reserve(context.Background(), req, opt)
	if err != nil {
		tb.Fatalf("Reserve: %v", err)
	}
	if !out.Allowed {
		tb.Fatalf("Reserve(%d) denied: %+v", req.Cost, out)
	}
	return res
}

// held reads the held units of org in the current period.
func (r *testRig) held(tb testing.TB, org string) map[string]string {
	tb.Helper()
	return r.raw.HGetAll(context.Background(), r.prefix+":{"+org+"}|h|"+r.e.Period(1).ID).Val()
}

func (r *testRig) bucket(tb testing.TB, org string, w time.Duration, at time.Time) map[string]string {
	tb.Helper()
	n := at.UnixMilli() / w.Milliseconds()
	key := r.prefix + ":{" + org + "}|w|" + strconv.FormatInt(int64(w/time.Second), 10) + "|" + strconv.FormatInt(n, 10)
	return r.raw.HGetAll(context.Background(), key).Val()
}

func all(metric string, v int64) map[quota.Counter]int64 {
	return map[quota.Counter]int64{orgC(metric): v, teamC(metric, "eng"): v, userC(metric, "eng", "alice"): v}
}

func TestReserveHoldsThenCommitGivesBack(t *testing.T) {
	t.Parallel()
	clk := newClock()
	r := MustRig(t, "", quota.Config{Clock: clk.Now})
	org := testenv.ID(t, "o")
	limits := quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 100)}, Team: []vocab.Limit{lim(vocab.Minute, 50)}}
	ctx := context.Background()

	res := r.mustReserve(t, reserveReq(org, 30, limits), quota.ReserveOptions{})
	if res.State != vocab.Held || res.Amount != 30 || res.OnExpiry != vocab.ExpiryCommit || !quota.ValidReservationID(res.ID) {
		t.Fatalf("reservation = %+v", res)
	}
	// Held units are in the counters but not committed: usage (committed) has none of
	// them, the held units all of them.
	if d := cmp.Diff(all("tokens", 0), r.usage(t, org)); d != "" {
		t.Errorf("committed usage while held (-want +got):\n%s", d)
	}
	held, err := r.e.HeldUnits(ctx, org, r.e.Period(1).ID)
	if d := cmp.Diff(all("tokens", 30), held); err != nil || d != "" {
		t.Errorf("held units (-want +got):\n%s %v", d, err)
	}
	// Held units count against the limits: 21 more do not fit the team's minute.
	if out := r.MustCheck(t, reserveReq(org, 21, limits)); out.Allowed {
		t.Fatalf("a check over used + held was allowed: %+v", out)
	}
	_, out, err := r.e.Reserve(ctx, reserveReq(org, 21, limits), quota.ReserveOptions{})
	if err != nil || out.Allowed {
		t.Fatalf("a reservation over used + held: %+v, %v", out, err)
	}
	if held, _ := r.e.HeldUnits(ctx, org, r.e.Period(1).ID); cmp.Diff(all("tokens", 30), held) != "" {
		t.Errorf("a denied reservation changed the held units: %v", held)
	}

	got, err := r.e.Commit(ctx, org, 1, res.ID, 10)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != vocab.Committed || got.Used != 10 || got.Released != 20 || got.OverReserved != 0 || got.Team != "eng" || got.User != "alice" || got.Metric != "tokens" {
		t.Errorf("commit = %+v", got)
	}
	if d := cmp.Diff(all("tokens", 10), r.usage(t, org)); d != "" {
		t.Errorf("usage after commit (-want +got):\n%s", d)
	}
	wantBucket := map[string]string{"tokens|o": "10", "tokens|t|eng": "10", "tokens|u|eng|alice": "10"}
	if d := cmp.Diff(wantBucket, r.bucket(t, org, time.Minute, clk.Now())); d != "" {
		t.Errorf("minute bucket after commit (-want +got):\n%s", d)
	}
	for f, v := range r.held(t, org) {
		if v != "0" {
			t.Errorf("held %s = %s after commit", f, v)
		}
	}
	// Repeated: the first answer, nothing counted.
	again, err := r.e.Commit(ctx, org, 1, res.ID, 25)
	if err != nil || again.Used != 10 || again.Released != 20 {
		t.Errorf("repeated commit = %+v, %v; want the first answer", again, err)
	}
	if d := cmp.Diff(all("tokens", 10), r.usage(t, org)); d != "" {
		t.Errorf("usage after a repeated commit (-want +got):\n%s", d)
	}
	// Settled one way, another is a conflict naming the state.
	var se *quota.StateError
	if _, err := r.e.Release(ctx, org, 1, res.ID); !errors.As(err, &se) || se.State != vocab.Committed || !errors.Is(err, derrors.Conflict) {
		t.Errorf("release after commit: %v", err)
	}
	rel := r.mustReserve(t, reserveReq(org, 5, limits), quota.ReserveOptions{})
	if got, err := r.e.Release(ctx, org, 1, rel.ID); err != nil || got.State != vocab.Released || got.Released != 5 {
		t.Errorf("release = %+v, %v", got, err)
	}
	if _, err := r.e.Commit(ctx, org, 1, rel.ID, 1); !errors.As(err, &se) || se.State != vocab.Released {
		t.Errorf("commit after release: %v", err)
	}
	if d := cmp.Diff(all("tokens", 10), r.usage(t, org)); d != "" {
		t.Errorf("usage after release (-want +got):\n%s", d)
	}
	// Another org's reservation is absent.
	if _, err := r.e.Commit(ctx, testenv.ID(t, "other"), 1, res.ID, 1); !errors.Is(err, quota.ErrReservationNotFound) {
		t.Errorf("commit of another org's reservation: %v", err)
	}
	if _, err := r.e.Reservation(ctx, testenv.ID(t, "other"), 1, res.ID); !errors.Is(err, quota.ErrReservationNotFound) {
		t.Errorf("another org's reservation: %v", err)
	}
}

func TestReserveOverReserved(t *testing.T) {
	t.Parallel()
	clk := newClock()
	r := MustRig(t, "", quota.Config{Clock: clk.Now})
	org := testenv.ID(t, "o")
	limits := quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 20), lim(vocab.Minute, 20)}}
	res := r.mustReserve(t, reserveReq(org, 10, limits), quota.ReserveOptions{})
	got, err := r.e.Commit(context.Background(), org, 1, res.ID, 25)
	if err != nil {
		t.Fatal(err)
	}
	if got.Used != 25 || got.OverReserved != 15 || got.Released != 0 {
		t.Errorf("commit = %+v, want used 25, over-reserved 15", got)
	}
	if d := cmp.Diff(all("tokens", 25), r.usage(t, org)); d != "" {
		t.Errorf("usage (-want +got):\n%s", d)
	}
	want := map[string]string{"tokens|o": "25", "tokens|t|eng": "25", "tokens|u|eng|alice": "25"}
	if d := cmp.Diff(want, r.bucket(t, org, time.Minute, clk.Now())); d != "" {
		t.Errorf("minute bucket (-want +got):\n%s", d)
	}
}

// Units go back to the bucket they were taken from while it is the current or the
// previous one of its window; a bucket that rolled out is left alone.
func TestReserveGiveBackRolledBucket(t *testing.T) {
	t.Parallel()
	clk := newClock()
	r := MustRig(t, "", quota.Config{Clock: clk.Now})
	org := testenv.ID(t, "o")
	ctx := context.Background()
	limits := quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Minute, 1000)}}
	start := clk.Now()

	prev := r.mustReserve(t, reserveReq(org, 30, limits), quota.ReserveOptions{TTL: time.Hour})
	rolled := r.mustReserve(t, reserveReq(org, 40, limits), quota.ReserveOptions{TTL: time.Hour})
	clk.Add(time.Minute) // the bucket charged is now the previous one
	if _, err := r.e.Commit(ctx, org, 1, prev.ID, 10); err != nil {
		t.Fatal(err)
	}
	if got := r.bucket(t, org, time.Minute, start)["tokens|o"]; got != "50" { // 70 - 20
		t.Errorf("previous bucket after give-back = %s, want 50", got)
	}
	clk.Add(time.Minute) // now it rolled out of the window
	if _, err := r.e.Commit(ctx, org, 1, rolled.ID, 5); err != nil {
		t.Fatal(err)
	}
	if got := r.bucket(t, org, time.Minute, start)["tokens|o"]; got != "50" {
		t.Errorf("rolled bucket = %s, want it untouched at 50", got)
	}
	if got := r.bucket(t, org, time.Minute, clk.Now()); len(got) != 0 {
		t.Errorf("current bucket = %v, want untouched", got)
	}
	if got := r.usage(t, org)[orgC("tokens")]; got != 15 {
		t.Errorf("month usage = %d, want 15", got)
	}
}

func TestReserveIdempotencyKey(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	org := testenv.ID(t, "o")
	req := reserveReq(org, 7, quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 100)}})
	req.IdempotencyKey = "llm-call-0001"
	first := r.mustReserve(t, req, quota.ReserveOptions{})
	second, out, err := r.e.Reserve(context.Background(), req, quota.ReserveOptions{})
	if err != nil || !out.Replayed || second.ID != first.ID || second.State != vocab.Held || second.Amount != 7 {
		t.Fatalf("repeat = %+v %+v %v; want the first reservation replayed", second, out, err)
	}
	if held, _ := r.e.HeldUnits(context.Background(), org, r.e.Period(1).ID); cmp.Diff(all("tokens", 7), held) != "" {
		t.Errorf("held units %v, want 7 once", held)
	}
	// The key was a reservation's: a check with it is a conflict, counting nothing.
	check := req
	if _, err := r.e.Check(context.Background(), check); !errors.Is(err, quota.ErrIdempotencyConflict) {
		t.Errorf("check with a reservation's key: %v", err)
	}
}

func TestReserveInvalid(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	org := testenv.ID(t, "o")
	for name, tc := range map[string]struct {
		cost int64
		opt  quota.ReserveOptions
	}{
		"amount 0":      {0, quota.ReserveOptions{}},
		"amount < 0":    {-1, quota.ReserveOptions{}},
		"too large":     {vocab.MaxUnits + 1, quota.ReserveOptions{}},
		"ttl too long":  {1, quota.ReserveOptions{TTL: quota.MaxReservationTTL + time.Second}},
		"ttl negative":  {1, quota.ReserveOptions{TTL: -time.Second}},
		"bad on_expiry": {1, quota.ReserveOptions{OnExpiry: "keep"}},
	} {
		if _, _, err := r.e.Reserve(context.Background(), reserveReq(org, tc.cost, quota.LevelLimits{}), tc.opt); !errors.Is(err, quota.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if u := r.usage(t, org); len(u) != 0 {
		t.Errorf("usage after invalid reservations: %v", u)
	}
}

// Expiry settles by on_expiry exactly once, however many engines sweep at once, and
// a commit that comes after the expiry finds it expired.
func TestReserveExpiryOnceWithTwoSweepers(t *testing.T) {
	t.Parallel()
	clk := newClock()
	prefix := testenv.ID(t, "qt")
	r := MustRig(t, "", quota.Config{Clock: clk.Now, KeyPrefix: prefix})
	other := MustRig(t, "", quota.Config{Clock: clk.Now, KeyPrefix: prefix})
	org := testenv.ID(t, "o")
	ctx := context.Background()
	limits := quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 1000)}}
	var ids []string
	for i := range 20 {
		onExp := vocab.ExpiryCommit
		if i%2 == 1 {
			onExp = vocab.ExpiryRelease
		}
		ids = append(ids, r.mustReserve(t, reserveReq(org, 10, limits), quota.ReserveOptions{TTL: time.Second, OnExpiry: onExp}).ID)
	}
	if n, err := r.e.SweepReservations(ctx); err != nil || n != 0 {
		t.Fatalf("sweep before the expiry: %d, %v", n, err)
	}
	clk.Add(time.Second)
	var total atomic.Int64
	var wg sync.WaitGroup
	for _, e := range []*quota.Engine{r.e, other.e, r.e, other.e} {
		wg.Go(func() {
			n, err := e.SweepReservations(ctx)
			if err != nil {
				t.Error(err)
			}
			total.Add(int64(n))
		})
	}
	wg.Wait()
	if total.Load() != 20 {
		t.Errorf("expired %d reservations in all, want 20 exactly once each", total.Load())
	}
	if d := cmp.Diff(all("tokens", 100), r.usage(t, org)); d != "" { // 10 commit 10 each
		t.Errorf("usage (-want +got):\n%s", d)
	}
	var se *quota.StateError
	if _, err := r.e.Commit(ctx, org, 1, ids[0], 1); !errors.As(err, &se) || se.State != vocab.Expired {
		t.Errorf("commit after expiry: %v", err)
	}
	got, err := r.e.Reservation(ctx, org, 1, ids[1])
	if err != nil || got.State != vocab.Expired || got.Used != 0 || got.Released != 10 {
		t.Errorf("expired with release = %+v, %v", got, err)
	}
}

// A commit racing the expiry: exactly one of them settles each reservation, and the
// usage is the winner's.
func TestReserveCommitRacingExpiry(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	org := testenv.ID(t, "o")
	ctx := context.Background()
	limits := quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 100000)}}
	const n = 30
	var committed, expired atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			got, err := r.e.ExpireDue(ctx, org)
			if err != nil {
				t.Error(err)
				return
			}
			expired.Add(int64(len(got)))
		}
	})
	var cwg sync.WaitGroup
	for i := range n {
		res := r.mustReserve(t, reserveReq(org, 10, limits), quota.ReserveOptions{TTL: 15 * time.Millisecond, OnExpiry: vocab.ExpiryRelease})
		cwg.Go(func() {
			time.Sleep(time.Duration(i%3) * 8 * time.Millisecond) // some before the expiry, some around it, some after
			_, err := r.e.Commit(ctx, org, 1, res.ID, 3)
			var se *quota.StateError
			switch {
			case err == nil:
				committed.Add(1)
			case errors.As(err, &se) && se.State == vocab.Expired:
			default:
				t.Error(err)
			}
		})
	}
	cwg.Wait()
	time.Sleep(50 * time.Millisecond)
	close(stop)
	wg.Wait()
	// Expiries the commit found due are settled by the commit's own call: the sweep
	// saw fewer. Every reservation is settled once: committed + expired states = n.
	var states = map[vocab.ReservationState]int64{}
	ids, _ := r.raw.Keys(ctx, r.prefix+":{"+org+"}|r|*").Result()
	for _, k := range ids {
		states[vocab.ReservationState(r.raw.HGet(ctx, k, "s").Val())]++
	}
	if states[vocab.Committed] != committed.Load() || states[vocab.Committed]+states[vocab.Expired] != n {
		t.Errorf("states %v, commits that won %d, of %d", states, committed.Load(), n)
	}
	if got := r.usage(t, org)[orgC("tokens")]; got != 3*committed.Load() {
		t.Errorf("usage %d, want 3 per winning commit (%d)", got, committed.Load())
	}
	t.Logf("%d commits won, %d expired by the sweep", committed.Load(), expired.Load())
}

// The sweep pipelines its orgs; a Redis that forgot the script (SCRIPT FLUSH on the
// shared Redis: other tests only see a reload) and more due reservations than one
// run expires are finished one org at a time. Every due reservation expires once.
func TestSweepAfterScriptFlushAndOverABatch(t *testing.T) {
	clk := newClock()
	r := MustRig(t, "", quota.Config{Clock: clk.Now})
	ctx := context.Background()
	limits := quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 1<<40)}}
	want := 0
	for i, n := range []int{3, 501, 1} { // 501: more than one run's 500
		org := testenv.ID(t, "o"+strconv.Itoa(i))
		for range n {
			r.mustReserve(t, reserveReq(org, 1, limits), quota.ReserveOptions{TTL: time.Second})
		}
		want += n
	}
	clk.Add(time.Second)
	if err := r.raw.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	n, err := r.e.SweepReservations(ctx)
	if err != nil || n != want {
		t.Errorf("sweep after SCRIPT FLUSH expired %d, %v; want %d", n, err, want)
	}
	if n, err := r.e.SweepReservations(ctx); err != nil || n != 0 {
		t.Errorf("a second sweep expired %d, %v; want none", n, err)
	}
}
