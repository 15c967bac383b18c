package quota_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

var ignoreReset = cmpopts.IgnoreFields(vocab.LevelStatus{}, "ResetAt")

func TestCheckSequences(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	type step struct {
		cost       int64
		mode       vocab.Mode
		allowed    bool
		levels     []vocab.LevelStatus // org/team/user ids are filled in below
		blockedAt  *vocab.Blocked
		wouldBlock *vocab.Blocked
	}
	ls := func(level vocab.Level, w vocab.Window, limit, used int64) vocab.LevelStatus {
		return vocab.LevelStatus{Level: level, Window: w, Limit: limit, Used: used, Remaining: max(limit-used, 0)}
	}
	bl := func(level vocab.Level, w vocab.Window) *vocab.Blocked { return &vocab.Blocked{Level: level, Window: w} }
	org, team, user := vocab.LevelOrg, vocab.LevelTeam, vocab.LevelUser
	tests := []struct {
		name      string
		noTeam    bool
		noUser    bool
		limits    quota.LevelLimits
		steps     []step
		wantUsage func(org string) map[quota.Counter]int64
	}{
		{
			name:   "cost larger than remaining is refused whole",
			limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Minute, 20)}},
			steps: []step{
				{cost: 15, allowed: true, levels: []vocab.LevelStatus{ls(org, vocab.Minute, 20, 15)}},
				{cost: 6, levels: []vocab.LevelStatus{ls(org, vocab.Minute, 20, 15)}, blockedAt: bl(org, vocab.Minute)},
				{cost: 5, allowed: true, levels: []vocab.LevelStatus{ls(org, vocab.Minute, 20, 20)}},
			},
			wantUsage: func(string) map[quota.Counter]int64 {
				return map[quota.Counter]int64{orgC("requests"): 20, teamC("requests", "eng"): 20, userC("requests", "eng", "alice"): 20}
			},
		},
		{
			name:   "cost 0 consumes nothing",
			limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 10)}, User: []vocab.Limit{lim(vocab.Minute, 3)}},
			steps: []step{
				{cost: 3, allowed: true, levels: []vocab.LevelStatus{ls(org, vocab.Month, 10, 3), ls(user, vocab.Minute, 3, 3)}},
				{cost: 0, allowed: true, levels: []vocab.LevelStatus{ls(org, vocab.Month, 10, 3), ls(user, vocab.Minute, 3, 3)}},
				{cost: 0, allowed: true, levels: []vocab.LevelStatus{ls(org, vocab.Month, 10, 3), ls(user, vocab.Minute, 3, 3)}},
			},
			wantUsage: func(string) map[quota.Counter]int64 {
				return map[quota.Counter]int64{orgC("requests"): 3, teamC("requests", "eng"): 3, userC("requests", "eng", "alice"): 3}
			},
		},
		{
			name:   "usage counted at levels without a limit",
			limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 100)}},
			steps: []step{
				{cost: 2, allowed: true, levels: []vocab.LevelStatus{ls(org, vocab.Month, 100, 2)}},
				{cost: 5, allowed: true, levels: []vocab.LevelStatus{ls(org, vocab.Month, 100, 7)}},
			},
			wantUsage: func(string) map[quota.Counter]int64 {
				return map[quota.Counter]int64{orgC("requests"): 7, teamC("requests", "eng"): 7, userC("requests", "eng", "alice"): 7}
			},
		},
		{
			name: "denied at the user counts nothing anywhere",
			limits: quota.LevelLimits{
				Org:  []vocab.Limit{lim(vocab.Month, 10)},
				Team: []vocab.Limit{lim(vocab.Month, 5)},
				User: []vocab.Limit{lim(vocab.Month, 3), lim(vocab.Minute, 2)},
			},
			steps: []step{
				{cost: 1, allowed: true, levels: []vocab.LevelStatus{ls(org, vocab.Month, 10, 1), ls(team, vocab.Month, 5, 1), ls(user, vocab.Month, 3, 1), ls(user, vocab.Minute, 2, 1)}},
				{cost: 1, allowed: true, levels: []vocab.LevelStatus{ls(org, vocab.Month, 10, 2), ls(team, vocab.Month, 5, 2), ls(user, vocab.Month, 3, 2), ls(user, vocab.Minute, 2, 2)}},
				{cost: 1, levels: []vocab.LevelStatus{ls(org, vocab.Month, 10, 2), ls(team, vocab.Month, 5, 2), ls(user, vocab.Month, 3, 2), ls(user, vocab.Minute, 2, 2)}, blockedAt: bl(user, vocab.Minute)},
			},
			wantUsage: func(string) map[quota.Counter]int64 {
				return map[quota.Counter]int64{orgC("requests"): 2, teamC("requests", "eng"): 2, userC("requests", "eng", "alice"): 2}
			},
		},
		{
			name:   "broadest window wins",
			limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Minute, 1)}, User: []vocab.Limit{lim(vocab.Month, 1)}},
			steps: []step{
				{cost: 1, allowed: true, levels: []vocab.LevelStatus{ls(org, vocab.Minute, 1, 1), ls(user, vocab.Month, 1, 1)}},
				{cost: 1, levels: []vocab.LevelStatus{ls(org, vocab.Minute, 1, 1), ls(user, vocab.Month, 1, 1)}, blockedAt: bl(user, vocab.Month)},
			},
			wantUsage: func(string) map[quota.Counter]int64 {
				return map[quota.Counter]int64{orgC("requests"): 1, teamC("requests", "eng"): 1, userC("requests", "eng", "alice"): 1}
			},
		},
		{
			name:   "equal windows: the highest level wins",
			noUser: true,
			limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Hour, 1)}, Team: []vocab.Limit{lim(vocab.Hour, 1)}},
			steps: []step{
				{cost: 1, allowed: true, levels: []vocab.LevelStatus{ls(org, vocab.Hour, 1, 1), ls(team, vocab.Hour, 1, 1)}},
				{cost: 1, levels: []vocab.LevelStatus{ls(org, vocab.Hour, 1, 1), ls(team, vocab.Hour, 1, 1)}, blockedAt: bl(org, vocab.Hour)},
			},
			wantUsage: func(string) map[quota.Counter]int64 {
				return map[quota.Counter]int64{orgC("requests"): 1, teamC("requests", "eng"): 1}
			},
		},
		{
			name:   "shadow counts over the limit and reports would_block",
			noTeam: true,
			limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 1)}},
			steps: []step{
				{cost: 1, mode: vocab.Shadow, allowed: true, levels: []vocab.LevelStatus{ls(org, vocab.Month, 1, 1)}},
				{cost: 1, mode: vocab.Shadow, allowed: true, levels: []vocab.LevelStatus{ls(org, vocab.Month, 1, 2)}, wouldBlock: bl(org, vocab.Month)},
				{cost: 1, mode: vocab.Warn, allowed: true, levels: []vocab.LevelStatus{ls(org, vocab.Month, 1, 3)}, wouldBlock: bl(org, vocab.Month)},
				{cost: 1, mode: vocab.Enforce, levels: []vocab.LevelStatus{ls(org, vocab.Month, 1, 3)}, blockedAt: bl(org, vocab.Month)},
			},
			wantUsage: func(string) map[quota.Counter]int64 { return map[quota.Counter]int64{orgC("requests"): 3} },
		},
		{
			name:   "limit 0 blocks every cost but 0",
			limits: quota.LevelLimits{Team: []vocab.Limit{lim(vocab.Day, 0)}},
			steps: []step{
				{cost: 1, levels: []vocab.LevelStatus{ls(team, vocab.Day, 0, 0)}, blockedAt: bl(team, vocab.Day)},
				{cost: 0, allowed: true, levels: []vocab.LevelStatus{ls(team, vocab.Day, 0, 0)}},
			},
			wantUsage: func(string) map[quota.Counter]int64 { return map[quota.Counter]int64{} },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			orgID := testenv.ID(t, "org")
			req := quota.Request{Org: orgID, Team: "eng", User: "alice", Metric: "requests", Limits: tt.limits}
			if tt.noUser || tt.noTeam {
				req.User = ""
			}
			if tt.noTeam {
				req.Team = ""
			}
			ids := map[vocab.Level]string{vocab.LevelOrg: orgID, vocab.LevelTeam: "eng", vocab.LevelUser: "alice"}
			for i, s := range tt.steps {
				req.Cost, req.Mode = s.cost, s.mode
				before := r.snapshot(t, orgID)
				got := r.MustCheck(t, req)
				want := vocab.Result{Allowed: s.allowed, Levels: s.levels, BlockedAt: s.blockedAt, WouldBlock: s.wouldBlock}
				for j := range want.Levels {
					want.Levels[j].ID = ids[want.Levels[j].Level]
					want.Levels[j].Metric = "requests"
				}
				for _, b := range []*vocab.Blocked{want.BlockedAt, want.WouldBlock} {
					if b != nil {
						b.ID = ids[b.Level]
						b.Metric = "requests"
					}
				}
				if !got.Allowed && got.RetryAfter <= 0 {
					t.Errorf("step %d: denied with RetryAfter %v, want > 0", i, got.RetryAfter)
				}
				if diff := cmp.Diff(want, got, ignoreReset, cmpopts.IgnoreFields(vocab.Result{}, "RetryAfter"), cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("step %d (cost %d): result mismatch (-want +got):\n%s", i, s.cost, diff)
				}
				if !got.Allowed || s.cost == 0 {
					if diff := cmp.Diff(before, r.snapshot(t, orgID)); diff != "" {
						t.Errorf("step %d: a check that consumed nothing changed counters (-before +after):\n%s", i, diff)
					}
				}
			}
			if diff := cmp.Diff(tt.wantUsage(orgID), r.usage(t, orgID), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("month usage mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestResetAndRetryAfter(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	req := quota.Request{Org: testenv.ID(t, "org"), Metric: "requests", Cost: 1,
		Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 100), lim(vocab.Minute, 1)}}}
	r.MustCheck(t, req)
	res := r.MustCheck(t, req)
	if res.Allowed || res.BlockedAt == nil || res.BlockedAt.Window != vocab.Minute {
		t.Fatalf("second check: got %+v, want denied at the minute window", res)
	}
	if res.RetryAfter <= 0 || res.RetryAfter > 2*time.Minute {
		t.Errorf("RetryAfter = %v, want within (0, 2m]", res.RetryAfter)
	}
	now := r.e.Now()
	if got, want := res.Levels[0].ResetAt, r.e.Period(1).End; !got.Equal(want) {
		t.Errorf("month ResetAt = %v, want the period end %v", got, want)
	}
	if got := res.Levels[1].ResetAt; got.Before(now.Add(-time.Second)) || got.After(now.Add(61*time.Second)) {
		t.Errorf("minute ResetAt = %v, want within a minute of %v", got, now)
	}
}

func TestMinuteWindowRapidChecks(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	req := quota.Request{Org: testenv.ID(t, "org"), Team: "eng", User: "bob", Metric: "requests", Cost: 1,
		Limits: quota.LevelLimits{User: []vocab.Limit{lim(vocab.Minute, 20)}}}
	admitted := 0
	for range 30 {
		if r.MustCheck(t, req).Allowed {
			admitted++
		}
	}
	// 20 in one bucket; one more is possible when the checks straddle a bucket edge,
	// where the previous bucket's weight has just begun to fall.
	if admitted < 20 || admitted > 21 {
		t.Errorf("admitted %d of 30 checks at 20/minute, want 20 (21 across a bucket edge)", admitted)
	}
}

// TestCascadeConcurrent runs 64 goroutines against a three-level cascade and checks
// that exactly the limits are admitted, never more.
func TestCascadeConcurrent(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	orgID := testenv.ID(t, "org")
	teams := map[string]int64{"team-a": 600, "team-b": 400}
	users := []string{"u1", "u2", "u3", "u4"}
	var admitted sync.Map // "team" or "team|user" -> *atomic.Int64
	count := func(k string) *atomic.Int64 {
		v, _ := admitted.LoadOrStore(k, new(atomic.Int64))
		return v.(*atomic.Int64)
	}
	var total atomic.Int64
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Go(func() {
			team := "team-a"
			if g%2 == 1 {
				team = "team-b"
			}
			user := users[(g/2)%len(users)]
			req := quota.Request{Org: orgID, Team: team, User: user, Metric: "requests", Cost: 1,
				Limits: quota.LevelLimits{
					Org:  []vocab.Limit{lim(vocab.Month, 1000)},
					Team: []vocab.Limit{lim(vocab.Month, teams[team])},
					User: []vocab.Limit{lim(vocab.Month, 200)},
				}}
			for range 40 {
				res, err := r.e.Check(context.Background(), req)
				if err != nil {
					t.Error(err)
					return
				}
				if res.Allowed {
					total.Add(1)
					count(team).Add(1)
					count(team + "|" + user).Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := total.Load(); got != 1000 {
		t.Errorf("admitted %d checks, want exactly the org's 1000", got)
	}
	want := map[quota.Counter]int64{orgC("requests"): total.Load()}
	for team, limit := range teams {
		if got := count(team).Load(); got != limit {
			t.Errorf("%s: admitted %d, want exactly its %d", team, got, limit)
		}
		want[teamC("requests", team)] = count(team).Load()
		for _, u := range users {
			n := count(team + "|" + u).Load()
			if n > 200 {
				t.Errorf("%s/%s: admitted %d, over its 200", team, u, n)
			}
			if n > 0 {
				want[userC("requests", team, u)] = n
			}
		}
	}
	if diff := cmp.Diff(want, r.usage(t, orgID)); diff != "" {
		t.Errorf("counters differ from the admitted checks (-want +got):\n%s", diff)
	}

	// Every limit is exhausted now: a further check at any user is denied and changes
	// nothing at any level.
	before := r.snapshot(t, orgID)
	res := r.MustCheck(t, quota.Request{Org: orgID, Team: "team-a", User: "u9", Metric: "requests", Cost: 1,
		Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 1000)}, Team: []vocab.Limit{lim(vocab.Month, 600)}, User: []vocab.Limit{lim(vocab.Month, 200)}}})
	if res.Allowed {
		t.Fatal("check over exhausted limits was allowed")
	}
	if diff := cmp.Diff(before, r.snapshot(t, orgID)); diff != "" {
		t.Errorf("denied check changed counters (-before +after):\n%s", diff)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	ok := quota.Request{Org: "acme", Team: "eng", User: "alice@example.com", Metric: "requests", Cost: 1}
	tests := []struct {
		name   string
		mutate func(*quota.Request)
		valid  bool
	}{
		{name: "valid", mutate: func(*quota.Request) {}, valid: true},
		{name: "ids with . : @ -", mutate: func(r *quota.Request) { r.Org = "a.b:c@d-e" }, valid: true},
		{name: "missing org", mutate: func(r *quota.Request) { r.Org = "" }},
		{name: "org with a pipe", mutate: func(r *quota.Request) { r.Org = "a|b" }},
		{name: "org with a brace", mutate: func(r *quota.Request) { r.Org = "a{b}" }},
		{name: "user without team", mutate: func(r *quota.Request) { r.Team = "" }},
		{name: "missing metric", mutate: func(r *quota.Request) { r.Metric = "" }},
		{name: "negative cost", mutate: func(r *quota.Request) { r.Cost = -1 }},
		{name: "cost too large", mutate: func(r *quota.Request) { r.Cost = vocab.MaxUnits + 1 }},
		{name: "short idempotency key", mutate: func(r *quota.Request) { r.IdempotencyKey = "short" }},
		{name: "idempotency key with a space", mutate: func(r *quota.Request) { r.IdempotencyKey = "has a space" }},
		{name: "unknown mode", mutate: func(r *quota.Request) { r.Mode = "loud" }},
		{name: "anchor day 29", mutate: func(r *quota.Request) { r.AnchorDay = 29 }},
		{name: "unknown window", mutate: func(r *quota.Request) { r.Limits.Org = []vocab.Limit{{Window: "week", Limit: 1}} }},
		{name: "repeated window", mutate: func(r *quota.Request) { r.Limits.Org = []vocab.Limit{lim(vocab.Month, 1), lim(vocab.Month, 2)} }},
		{name: "negative limit", mutate: func(r *quota.Request) { r.Limits.User = []vocab.Limit{lim(vocab.Day, -1)} }},
		{name: "limits of an absent level", mutate: func(r *quota.Request) { r.User = ""; r.Limits.User = []vocab.Limit{lim(vocab.Day, 1)} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := ok
			tt.mutate(&req)
			err := req.Validate()
			if tt.valid != (err == nil) {
				t.Fatalf("Validate() = %v, want valid %v", err, tt.valid)
			}
			if err != nil && !errors.Is(err, quota.ErrInvalid) {
				t.Errorf("Validate() = %v, want it to wrap ErrInvalid", err)
			}
		})
	}
}

// The two-bucket sliding window, step by step on the engine's clock: the previous
// bucket's count weighs by the part of the window still covering it, a bucket that has
// ended stops counting, and the retry hint says when the next unit fits. The buckets
// and the elapsed fraction come from the engine's clock (check.lua reads no TIME), so
// this runs without sleeping.
func TestSlidingWindowAcrossBuckets(t *testing.T) {
	t.Parallel()
	clock := testenv.NewClock(time.Now()) // the engine measures the time elapsed since its Redis TIME sample on it
	r := MustRig(t, "", quota.Config{Clock: clock.Now, ClockSync: time.Hour})
	// Start 30 s into a minute bucket of the engine's clock.
	now := r.e.Now()
	clock.Add(now.Truncate(time.Minute).Add(90 * time.Second).Sub(now))
	req := quota.Request{Org: testenv.ID(t, "org"), Team: "eng", User: "ann", Metric: "requests", Cost: 1,
		Limits: quota.LevelLimits{User: []vocab.Limit{lim(vocab.Minute, 10)}}}
	check := func(cost int64) vocab.Result {
		t.Helper()
		req.Cost = cost
		return r.MustCheck(t, req)
	}
	if res := check(10); !res.Allowed || res.Levels[0].Used != 10 {
		t.Fatalf("10 of 10 in one bucket: %+v", res)
	}
	res := check(1)
	if res.Allowed {
		t.Fatalf("11th unit in the same bucket admitted: %+v", res)
	}
	// The current bucket alone is full: it must become the previous one (30 s) and
	// then weigh less than 9/10 of the window (6 s more).
	if res.RetryAfter != 36*time.Second {
		t.Errorf("RetryAfter = %v, want 36s", res.RetryAfter)
	}

	clock.Add(45 * time.Second) // 15 s into the next bucket: the previous weighs 3/4
	if res := check(0); res.Levels[0].Used != 7 {
		t.Errorf("15 s into the next bucket: used %d, want floor(10 * 45/60) = 7", res.Levels[0].Used)
	}
	if res := check(3); !res.Allowed || res.Levels[0].Used != 10 {
		t.Fatalf("3 more at 7 of 10: %+v", res)
	}
	res = check(1)
	if res.Allowed {
		t.Fatalf("one over at 10 of 10: %+v", res)
	}
	// 3 in this bucket, 10 before: 1 more fits once 10 * w <= 6, w = 0.6 at 24 s into
	// the bucket (the hint leaves out the floor, so it is never early)
	if res.RetryAfter != 9*time.Second {
		t.Errorf("RetryAfter = %v, want 9s (until 24 s into the bucket)", res.RetryAfter)
	}
	clock.Add(res.RetryAfter)
	if res := check(1); !res.Allowed {
		t.Errorf("after RetryAfter the unit does not fit: %+v", res)
	}

	clock.Add(time.Minute) // the bucket with 10 has ended twice over: only the last 4 weigh
	if res := check(0); res.Levels[0].Used != 2 {
		t.Errorf("a minute later: used %d, want floor(4 * 36/60) = 2", res.Levels[0].Used)
	}
	clock.Add(2 * time.Minute)
	if res := check(0); res.Levels[0].Used != 0 {
		t.Errorf("three minutes later: used %d, want 0", res.Levels[0].Used)
	}
}

// A check sent again (after hydrating the org's counters here; on a cluster, after a
// refusal) is built again at the time it is sent: it counts in the window bucket of
// that moment, not of its first attempt. Hydration reads Postgres and a cluster
// re-send may come up to RetryBudget later, so a bucket can end in between; the check
// used to count in the bucket of its first attempt, where it weighed less.
func TestResendCountsAtItsOwnTime(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "Check", true: "CheckBatch"}[batch], func(t *testing.T) {
			t.Parallel()
			clock := testenv.NewClock(time.Now()) // the engine measures the time elapsed since its Redis TIME sample on it
			hydrator := quota.HydratorFunc(func(context.Context, string, vocab.Period) (map[quota.Counter]int64, error) {
				clock.Add(time.Minute) // hydration takes a whole bucket
				return nil, nil
			})
			r := MustRig(t, "", quota.Config{Clock: clock.Now, ClockSync: time.Hour, Hydrator: hydrator})
			// 10 s into a minute bucket, and not near the end of a month. Time only
			// runs forward: a clock set back (it went 72 h back from the 28th on) ran
			// behind Redis's, and the counter's expiry, set at the engine's time, was
			// already past for Redis, which dropped the key (used 0 on those days).
			if d := r.e.Now().Day(); d >= 28 {
				clock.Add(96 * time.Hour) // the 1st to the 4th of the next month
			}
			now := r.e.Now()
			clock.Add(now.Truncate(time.Minute).Add(70 * time.Second).Sub(now))
			req := quota.Request{Org: testenv.ID(t, "org"), Team: "eng", User: "ann", Metric: "requests", Cost: 6,
				Limits: quota.LevelLimits{User: []vocab.Limit{lim(vocab.Minute, 10)}}}
			check := func() vocab.Result {
				t.Helper()
				if !batch {
					return r.MustCheck(t, req)
				}
				res, errs := r.e.CheckBatch(context.Background(), []quota.Request{req})
				if errs[0] != nil {
					t.Fatal(errs[0])
				}
				return res[0]
			}
			if res := check(); !res.Allowed || res.Levels[0].Used != 6 {
				t.Fatalf("first check (hydrates, then is sent again a minute later): %+v", res)
			}
			// Still 10 s into the bucket it was counted in: all 6 weigh. Counted in the
			// bucket before, only 6 * 50/60 = 5 would.
			req.Cost = 0
			if res := check(); res.Levels[0].Used != 6 {
				t.Errorf("used %d right after, want 6: the check counted in the bucket of its first attempt", res.Levels[0].Used)
			}
		})
	}
}
