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
