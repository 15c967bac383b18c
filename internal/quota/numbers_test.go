package quota_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// monthKey is the org's month counters hash of the current period (KEYS.md).
func monthKey(prefix, org string) string {
	return fmt.Sprintf("%s:{%s}|m|%s", prefix, org, vocab.PeriodAt(time.Now(), 0).ID)
}

// A counter stored at or past 2^53 (or as text that is no number), as old data written
// before the bound, does not lock the org out: checks are decided (over the limit: 429
// in enforce; allowed and not counted in shadow), never a malformed reply or a 503, the
// org's other counters are unaffected, and the checks that met it show in
// quotaplane_counters_at_bound_total. On the old code every check of the metric failed
// ("quota: malformed script reply") whatever the fail mode.
func TestCounterStoredPastTheBoundIsReadSafely(t *testing.T) {
	t.Parallel()
	prefix := testenv.ID(t, "nb")
	r, reg := MustEngines(t, quota.EnginesConfig{Engine: quota.Config{KeyPrefix: prefix}})
	ctx := context.Background()
	rdb := testenv.Redis(t)
	org := testenv.ID(t, "org")
	route := vocab.Route{FailMode: vocab.FailClosed}
	limits := quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 1000), lim(vocab.Minute, 100)},
		Team: []vocab.Limit{lim(vocab.Month, 500)}}
	req := func(metric, team string, cost int64, mode vocab.Mode) quota.Request {
		l := limits
		if team == "" {
			l.Team = nil
		}
		return quota.Request{Org: org, Team: team, Metric: metric, Cost: cost, Mode: mode, Limits: l}
	}
	if _, _, err := r.Check(ctx, route, req("tokens", "eng", 1, "")); err != nil { // hydrated, marker set
		t.Fatal(err)
	}
	// Old data: 2^53 + 1 in the org's counter, text in a team's.
	if err := rdb.HSet(ctx, monthKey(prefix, org), "tokens|o", "9007199254740993", "tokens|t|ops", "lots").Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		req        quota.Request
		allowed    bool
		wouldBlock bool
	}{
		{"enforce", req("tokens", "eng", 1, vocab.Enforce), false, false},
		{"enforce, cost 0", req("tokens", "eng", 0, vocab.Enforce), false, false},
		{"shadow", req("tokens", "eng", 5, vocab.Shadow), true, true},
		{"a team's text value", req("tokens", "ops", 1, vocab.Enforce), false, false},
	} {
		res, out, err := r.Check(ctx, route, tc.req)
		if err != nil || out.Degraded {
			t.Fatalf("%s: %v (degraded %v): a stored value out of range must not fail the check", tc.name, err, out.Degraded)
		}
		if res.Allowed != tc.allowed || (res.WouldBlock != nil) != tc.wouldBlock || res.Levels[0].Used != quota.MaxCounter {
			t.Errorf("%s: allowed %v, would-block %v, org used %d; want %v, %v, %d (the bound)", tc.name, res.Allowed,
				res.WouldBlock, res.Levels[0].Used, tc.allowed, tc.wouldBlock, quota.MaxCounter)
		}
	}
	// Nothing was counted on top of the stored values.
	if v := rdb.HGet(ctx, monthKey(prefix, org), "tokens|o").Val(); v != "9007199254740993" {
		t.Errorf("org counter now %s: a count past the bound was stored", v)
	}
	// The org's other metrics answer as ever.
	if res, _, err := r.Check(ctx, route, req("requests", "eng", 1, "")); err != nil || !res.Allowed || res.Levels[0].Used != 1 {
		t.Errorf("another metric: %+v, %v", res, err)
	}
	if got := metricValue(t, reg, "quotaplane_counters_at_bound_total", map[string]string{"pool": quota.DefaultPool}); got < 4 {
		t.Errorf("quotaplane_counters_at_bound_total = %v, want >= 4", got)
	}
	if got := metricValue(t, reg, "quotaplane_script_reply_errors_total", map[string]string{"pool": quota.DefaultPool}); got > 0 {
		t.Errorf("quotaplane_script_reply_errors_total = %v, want 0: the values were read safely", got)
	}
}

// No count takes a counter past quota.MaxCounter, even forced: shadow mode is allowed
// and counts nothing, enforce is denied, on a level without a limit too; the counters
// stay exact below it. On the old code shadow mode counted on past 2^53.
func TestCountersStopAtTheBound(t *testing.T) {
	t.Parallel()
	prefix := testenv.ID(t, "nb")
	r, _ := MustEngines(t, quota.EnginesConfig{Engine: quota.Config{KeyPrefix: prefix}})
	ctx := context.Background()
	rdb := testenv.Redis(t)
	org := testenv.ID(t, "org")
	route := vocab.Route{FailMode: vocab.FailOpen}
	base := quota.Request{Org: org, Team: "eng", Metric: "tokens", Cost: 1,
		Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 1000)}}} // the team has no limit
	if _, _, err := r.Check(ctx, route, base); err != nil {
		t.Fatal(err)
	}
	near := strconv.FormatInt(quota.MaxCounter-vocab.MaxUnits/2, 10)
	if err := rdb.HSet(ctx, monthKey(prefix, org), "tokens|o", near, "tokens|t|eng", near).Err(); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []vocab.Mode{vocab.Shadow, vocab.Warn, vocab.Enforce} {
		req := base
		req.Mode, req.Cost = mode, vocab.MaxUnits
		res, out, err := r.Check(ctx, route, req)
		if err != nil || out.Degraded {
			t.Fatalf("%s: %v, degraded %v", mode, err, out.Degraded)
		}
		if res.Allowed != (mode != vocab.Enforce) {
			t.Errorf("%s: allowed %v", mode, res.Allowed)
		}
		for _, f := range []string{"tokens|o", "tokens|t|eng"} {
			if v := rdb.HGet(ctx, monthKey(prefix, org), f).Val(); v != near {
				t.Errorf("%s: %s = %s, want %s: nothing counted past the bound", mode, f, v, near)
			}
		}
	}
	// Below the bound, counting is exact.
	req := base
	req.Mode, req.Cost = vocab.Shadow, vocab.MaxUnits/2
	if _, _, err := r.Check(ctx, route, req); err != nil {
		t.Fatal(err)
	}
	if v := rdb.HGet(ctx, monthKey(prefix, org), "tokens|o").Val(); v != strconv.FormatInt(quota.MaxCounter, 10) {
		t.Errorf("counted to %s, want exactly %d", v, quota.MaxCounter)
	}
}

// A reply the engine cannot read (here an idempotency record stored malformed, as old
// or foreign data) fails that one check: answered by the plan's fail mode (open:
// allowed, degraded; closed: an error wrapping quota.ErrBadReply), counted in
// quotaplane_script_reply_errors_total, and never trips the pool's breaker: other
// orgs', and the org's other checks, are decided as ever. On the old code it was an
// error under every fail mode.
func TestMalformedReplyFailsOnlyItsCheck(t *testing.T) {
	t.Parallel()
	prefix := testenv.ID(t, "nb")
	r, reg := MustEngines(t, quota.EnginesConfig{Engine: quota.Config{KeyPrefix: prefix}})
	ctx := context.Background()
	rdb := testenv.Redis(t)
	org, other := testenv.ID(t, "org"), testenv.ID(t, "org")
	limits := quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 1000)}}
	const key = "idem-broken-1"
	if err := rdb.Set(ctx, fmt.Sprintf("%s:{%s}|i|%s", prefix, org, key), "A;garbage", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	broken := quota.Request{Org: org, Metric: "tokens", Cost: 1, Limits: limits, IdempotencyKey: key}
	for i := range 30 { // more than the breaker's 5 consecutive failures
		res, out, err := r.Check(ctx, vocab.Route{FailMode: vocab.FailOpen}, broken)
		if err != nil || !out.Degraded || !res.Allowed {
			t.Fatalf("open, try %d: %+v %+v %v, want allowed, degraded", i, res, out, err)
		}
		_, out, err = r.Check(ctx, vocab.Route{FailMode: vocab.FailClosed}, broken)
		if !errors.Is(err, quota.ErrBadReply) || !out.Degraded {
			t.Fatalf("closed, try %d: %v (degraded %v), want ErrBadReply", i, err, out.Degraded)
		}
	}
	if s := r.PoolStates()[quota.DefaultPool]; s != "closed" {
		t.Errorf("breaker %s after malformed replies, want closed", s)
	}
	for _, o := range []string{org, other} {
		res, out, err := r.Check(ctx, vocab.Route{FailMode: vocab.FailClosed}, quota.Request{Org: o, Metric: "tokens", Cost: 1, Limits: limits})
		if err != nil || out.Degraded || !res.Allowed || res.Levels[0].Used != 1 {
			t.Errorf("org %s's next check: %+v %+v %v", o, res, out, err)
		}
	}
	if got := metricValue(t, reg, "quotaplane_script_reply_errors_total", map[string]string{"pool": quota.DefaultPool}); got != 60 {
		t.Errorf("quotaplane_script_reply_errors_total = %v, want 60", got)
	}
}

// A Lua error (a held-units value that HINCRBY cannot add to) is the reservation's
// failure, not Redis's: quota.ErrBadReply, counted, and the breaker stays closed.
func TestScriptErrorIsNotAnOutage(t *testing.T) {
	t.Parallel()
	prefix := testenv.ID(t, "nb")
	r, reg := MustEngines(t, quota.EnginesConfig{Engine: quota.Config{KeyPrefix: prefix}})
	ctx := context.Background()
	rdb := testenv.Redis(t)
	org := testenv.ID(t, "org")
	limits := quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 1000)}}
	req := quota.Request{Org: org, Metric: "tokens", Cost: 1, Limits: limits}
	if _, _, err := r.Check(ctx, vocab.Route{}, req); err != nil {
		t.Fatal(err)
	}
	held := fmt.Sprintf("%s:{%s}|h|%s", prefix, org, vocab.PeriodAt(time.Now(), 0).ID)
	if err := rdb.HSet(ctx, held, "tokens|o", "not a number").Err(); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if _, _, err := r.Reserve(ctx, vocab.Route{}, req, quota.ReserveOptions{TTL: time.Minute}); !errors.Is(err, quota.ErrBadReply) {
			t.Fatalf("reserve over a broken held value: %v, want ErrBadReply", err)
		}
	}
	if s := r.PoolStates()[quota.DefaultPool]; s != "closed" {
		t.Errorf("breaker %s after script errors, want closed", s)
	}
	if res, out, err := r.Check(ctx, vocab.Route{}, req); err != nil || out.Degraded || !res.Allowed {
		t.Errorf("check after: %+v %+v %v", res, out, err)
	}
	if got := metricValue(t, reg, "quotaplane_script_reply_errors_total", map[string]string{"pool": quota.DefaultPool}); got != 10 {
		t.Errorf("quotaplane_script_reply_errors_total = %v, want 10", got)
	}
}

// A counter no limit bounds (counted for usage and billing only) never denies: two
// checks of quota.MaxUnits take an unlimited metric's month counters to quota.MaxCounter,
// and from then on its checks are decided by the limited counters alone, the unlimited
// ones staying at the bound (the units past it not counted there) and each such check
// counted in quotaplane_counters_at_bound_total. A limited counter keeps the rule: at the
// bound it denies in enforce, naming itself in BlockedAt. A reservation saturates the same
// way and gives back only what it counted. On the old code the third check, of cost 1,
// was denied with no BlockedAt (the API's 429 without blocked_at) by any user, until the
// period's end, and so was every reservation.
func TestUnlimitedCounterSaturatesAndNeverDenies(t *testing.T) {
	t.Parallel()
	prefix := testenv.ID(t, "nb")
	r, reg := MustEngines(t, quota.EnginesConfig{Engine: quota.Config{KeyPrefix: prefix}})
	rig := MustRig(t, "", quota.Config{KeyPrefix: prefix})
	ctx := context.Background()
	org := testenv.ID(t, "org")
	route := vocab.Route{FailMode: vocab.FailClosed}
	gpu := func(user string, cost int64, l quota.LevelLimits) quota.Request {
		return quota.Request{Org: org, Team: "eng", User: user, Metric: "gpu_seconds", Cost: cost, Mode: vocab.Enforce, Limits: l}
	}
	check := func(name string, req quota.Request) vocab.Result {
		t.Helper()
		return mustDecide(t, r, route, name, req)
	}
	none := quota.LevelLimits{}
	for i := range 2 {
		if res := check("2^50", gpu("zed", vocab.MaxUnits, none)); !res.Allowed {
			t.Fatalf("check %d of 2^50: denied %+v", i+1, res.BlockedAt)
		}
	}
	org1, team1, zed := orgC("gpu_seconds"), teamC("gpu_seconds", "eng"), userC("gpu_seconds", "eng", "zed")
	for c, v := range rig.usage(t, org) {
		if v != quota.MaxCounter {
			t.Errorf("%v = %d after two checks of 2^50, want %d", c, v, quota.MaxCounter)
		}
	}
	// Any user, any cost in bounds: allowed, the unlimited counters stay at the bound.
	for _, tc := range []struct {
		user string
		cost int64
	}{{"zed", 1}, {"ann", 1}, {"ann", vocab.MaxUnits}} {
		res := check("unlimited", gpu(tc.user, tc.cost, none))
		if !res.Allowed || res.BlockedAt != nil || res.RetryAfter != 0 {
			t.Errorf("%s, cost %d: allowed %v, blocked at %+v, retry %v; want allowed: no limit to deny it",
				tc.user, tc.cost, res.Allowed, res.BlockedAt, res.RetryAfter)
		}
	}
	u := rig.usage(t, org)
	if u[org1] != quota.MaxCounter || u[team1] != quota.MaxCounter || u[zed] != quota.MaxCounter {
		t.Errorf("org %d, team %d, zed %d: want each saturated at %d", u[org1], u[team1], u[zed], quota.MaxCounter)
	}
	if ann := u[userC("gpu_seconds", "eng", "ann")]; ann != vocab.MaxUnits+1 {
		t.Errorf("ann = %d, want %d: a counter below the bound counts exactly", ann, vocab.MaxUnits+1)
	}
	if got := metricValue(t, reg, "quotaplane_counters_at_bound_total", map[string]string{"pool": quota.DefaultPool}); got < 3 {
		t.Errorf("quotaplane_counters_at_bound_total = %v, want >= 3: each saturating check counted", got)
	}
	// Decided by the limited counters: a team's day limit of 5 admits 5, then denies,
	// naming itself.
	day := quota.LevelLimits{Team: []vocab.Limit{lim(vocab.Day, 5)}}
	if res := check("day limit", gpu("zed", 5, day)); !res.Allowed {
		t.Errorf("5 of a day limit of 5: denied %+v", res.BlockedAt)
	}
	res := check("day limit", gpu("zed", 1, day))
	if b := res.BlockedAt; res.Allowed || b == nil || b.Level != vocab.LevelTeam || b.ID != "eng" || b.Window != vocab.Day || b.Metric != "gpu_seconds" {
		t.Errorf("6 of a day limit of 5: allowed %v, blocked at %+v; want denied at the team's day", res.Allowed, res.BlockedAt)
	}
	// A limited counter at the bound denies in enforce, naming itself, retry at the
	// period's end; shadow allows it and counts nothing.
	month := quota.LevelLimits{Team: []vocab.Limit{lim(vocab.Month, 1000)}}
	res = check("team at the bound", gpu("zed", 1, month))
	if b := res.BlockedAt; res.Allowed || b == nil || b.Level != vocab.LevelTeam || b.Window != vocab.Month || res.RetryAfter <= 0 ||
		len(res.Levels) != 1 || res.Levels[0].Used != quota.MaxCounter {
		t.Errorf("a limited counter at the bound: %+v, blocked at %+v; want denied at the team's month, used %d", res, res.BlockedAt, quota.MaxCounter)
	}
	shadow := gpu("zed", 1, month)
	shadow.Mode = vocab.Shadow
	if res := check("shadow", shadow); !res.Allowed || res.WouldBlock == nil {
		t.Errorf("shadow at the bound: allowed %v, would block %+v", res.Allowed, res.WouldBlock)
	}
	// Another metric of the org, limited, at its limit: denied as ever.
	tokens := quota.Request{Org: org, Team: "eng", User: "zed", Metric: "tokens", Cost: 10,
		Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 10)}}}
	if res := check("tokens", tokens); !res.Allowed {
		t.Errorf("tokens at 10 of 10: denied")
	}
	tokens.Cost = 1
	if res := check("tokens", tokens); res.Allowed || res.BlockedAt == nil || res.BlockedAt.Level != vocab.LevelOrg {
		t.Errorf("tokens past 10 of 10: allowed %v, blocked at %+v", res.Allowed, res.BlockedAt)
	}
	// Reservations: held, and settled giving back only what was counted: the saturated
	// counters stay at the bound, the user's (below it) counts what was used.
	for _, used := range []int64{40, -1} { // -1: released
		rv, res, err := r.Reserve(ctx, route, gpu("res", 100, none), quota.ReserveOptions{})
		if err != nil || !res.Allowed || rv.ID == "" {
			t.Fatalf("reserve 100 of an unlimited metric at the bound: %v, allowed %v, blocked at %+v", err, res.Allowed, res.BlockedAt)
		}
		if used < 0 {
			_, err = r.Release(ctx, route, org, 1, rv.ID)
		} else {
			_, err = r.Commit(ctx, route, org, 1, rv.ID, used)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	u = rig.usage(t, org)
	if u[org1] != quota.MaxCounter || u[team1] != quota.MaxCounter || u[userC("gpu_seconds", "eng", "res")] != 40 {
		t.Errorf("after the reservations: org %d, team %d, res %d; want %d, %d, 40", u[org1], u[team1],
			u[userC("gpu_seconds", "eng", "res")], quota.MaxCounter, quota.MaxCounter)
	}
}

// The rule holds on every path of check.lua: an unlimited sliding-window bucket (a
// window only another level limits: here each user's minute, at most 2^50, fills the
// team's and the org's buckets, which no row limits) saturates too, estimated and
// precise; so do a check with an idempotency key (its replay counts nothing) and a
// multi-metric check, whose limited metric still decides. On the old code the third
// user's check was denied with no BlockedAt.
func TestUnlimitedCounterSaturatesOnEveryPath(t *testing.T) {
	t.Parallel()
	for _, precise := range []bool{false, true} {
		t.Run(fmt.Sprintf("precise=%v", precise), func(t *testing.T) {
			prefix := testenv.ID(t, "nb")
			r, reg := MustEngines(t, quota.EnginesConfig{Engine: quota.Config{KeyPrefix: prefix}})
			rig := MustRig(t, "", quota.Config{KeyPrefix: prefix})
			org := testenv.ID(t, "org")
			route := vocab.Route{FailMode: vocab.FailClosed}
			perUser := quota.LevelLimits{User: []vocab.Limit{lim(vocab.Minute, vocab.MaxUnits)}}
			req := func(user string, cost int64) quota.Request {
				return quota.Request{Org: org, Team: "eng", User: user, Metric: "gpu_seconds", Cost: cost, Limits: perUser, Precise: precise}
			}
			check := func(name string, req quota.Request) vocab.Result {
				t.Helper()
				return mustDecide(t, r, route, name, req)
			}
			for _, user := range []string{"a", "b", "c"} {
				if res := check(user, req(user, vocab.MaxUnits)); !res.Allowed {
					t.Errorf("%s's 2^50 (its own minute limit): denied, blocked at %+v", user, res.BlockedAt)
				}
			}
			// the user's own limit still decides
			if res := check("a again", req("a", 1)); res.Allowed || res.BlockedAt == nil || res.BlockedAt.Level != vocab.LevelUser {
				t.Errorf("a's second unit in its minute: allowed %v, blocked at %+v", res.Allowed, res.BlockedAt)
			}
			// with an idempotency key: allowed; the replay too, counting nothing
			idem := req("d", 1)
			idem.IdempotencyKey = "saturate-1"
			for i := range 2 {
				if res := check("idempotent", idem); !res.Allowed || res.Replayed != (i == 1) {
					t.Errorf("idempotent check %d: allowed %v, replayed %v, blocked at %+v", i, res.Allowed, res.Replayed, res.BlockedAt)
				}
			}
			// several metrics: the saturated one never denies, the limited one decides
			multi := req("e", 1)
			multi.More = []quota.MetricCost{{Metric: "tokens", Cost: 3, Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 5)}}}}
			if res := check("multi", multi); !res.Allowed {
				t.Errorf("multi-metric within tokens' limit: denied, blocked at %+v", res.BlockedAt)
			}
			res := check("multi", multi)
			if b := res.BlockedAt; res.Allowed || b == nil || b.Metric != "tokens" || b.Level != vocab.LevelOrg {
				t.Errorf("multi-metric past tokens' limit: allowed %v, blocked at %+v; want denied at the org's tokens", res.Allowed, b)
			}
			u := rig.usage(t, org)
			if o, tm := u[orgC("gpu_seconds")], u[teamC("gpu_seconds", "eng")]; o != quota.MaxCounter || tm != quota.MaxCounter {
				t.Errorf("org %d, team %d: want both at the bound %d", o, tm, quota.MaxCounter)
			}
			if d, e := u[userC("gpu_seconds", "eng", "d")], u[userC("gpu_seconds", "eng", "e")]; d != 1 || e != 1 {
				t.Errorf("d %d, e %d: want 1 each (the replay and the denial counted nothing)", d, e)
			}
			if got := metricValue(t, reg, "quotaplane_counters_at_bound_total", map[string]string{"pool": quota.DefaultPool}); got < 3 {
				t.Errorf("quotaplane_counters_at_bound_total = %v, want >= 3", got)
			}
			// no bucket holds more than the bound
			for k, v := range rig.snapshot(t, org) {
				if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > quota.MaxCounter {
					t.Errorf("%s = %d, past the bound", k, n)
				}
			}
		})
	}
}

// mustDecide checks req on route and fails the test unless the engines decided it
// (no error, not degraded to the fail mode).
func mustDecide(t *testing.T, r *quota.Engines, route vocab.Route, name string, req quota.Request) vocab.Result {
	t.Helper()
	res, out, err := r.Check(context.Background(), route, req)
	if err != nil || out.Degraded {
		t.Fatalf("%s: %v (degraded %v)", name, err, out.Degraded)
	}
	return res
}
