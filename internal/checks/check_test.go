package checks_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/platform/problem"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// A check the service refuses is never asked of the engine, and its error says why in
// a kind and, for a field at fault, the field's name: the rules of Input.Validate (the
// API's CheckRequest schema), the check scope, and the org's tenancy.
func TestCheckRefusals(t *testing.T) {
	w := newWorld(t)
	seventeen := map[string]int64{}
	for i := range quota.MaxMetrics + 1 {
		seventeen[fmt.Sprintf("m%02d", i)] = 1
	}
	withKey := func(c checks.Input, k string) checks.Input { c.IdempotencyKey = &k; return c }
	withCosts := func(c checks.Input, cs map[string]int64) checks.Input { c.Costs = cs; return c }
	for _, tc := range []struct {
		name   string
		caller checks.Caller
		in     checks.Input
		want   refusal
	}{
		// Validate, field by field
		{"no org", operator, in("", "eng", "", "", -1), refusal{derrors.Invalid, "org", "is required"}},
		{"bad org", operator, in("acme corp", "", "", "", -1), refusal{derrors.Invalid, "org", ""}},
		{"bad team", acmeKey, in("acme", "-eng", "", "", -1), refusal{derrors.Invalid, "team", ""}},
		{"bad user", acmeKey, in("acme", "eng", "al ice", "", -1), refusal{derrors.Invalid, "user", ""}},
		{"empty metric", acmeKey, checks.Input{Org: "acme", Metric: ptr("")}, refusal{derrors.Invalid, "metric", ""}},
		{"negative cost", acmeKey, checks.Input{Org: "acme", Cost: ptr(int64(-1))}, refusal{derrors.Invalid, "cost", ""}},
		{"cost past the bound", acmeKey, in("acme", "eng", "", "", vocab.MaxUnits+1), refusal{derrors.Invalid, "cost", fmt.Sprint(vocab.MaxUnits)}},
		{"short idempotency key", acmeKey, withKey(in("acme", "", "", "", -1), "k-1234"), refusal{derrors.Invalid, "idempotency_key", ""}},
		{"long idempotency key", acmeKey, withKey(in("acme", "", "", "", -1), strings.Repeat("k", 129)), refusal{derrors.Invalid, "idempotency_key", ""}},
		{"idempotency key of a space", acmeKey, withKey(in("acme", "", "", "", -1), "key with space"), refusal{derrors.Invalid, "idempotency_key", ""}},
		{"costs beside metric", acmeKey, withCosts(in("acme", "", "", "tokens", -1), map[string]int64{"tokens": 1}), refusal{derrors.Invalid, "metric", "not both"}},
		{"costs beside cost", acmeKey, withCosts(in("acme", "", "", "", 3), map[string]int64{"tokens": 1}), refusal{derrors.Invalid, "cost", "not both"}},
		{"costs empty", acmeKey, costs("acme", "", "", map[string]int64{}), refusal{derrors.Invalid, "costs", "1 to 16"}},
		{"costs of 17 metrics", acmeKey, costs("acme", "", "", seventeen), refusal{derrors.Invalid, "costs", "not 17"}},
		{"costs of a bad metric", acmeKey, costs("acme", "", "", map[string]int64{"to kens": 1}), refusal{derrors.Invalid, "costs", "to kens"}},
		{"costs of a negative cost", acmeKey, costs("acme", "", "", map[string]int64{"tokens": -1}), refusal{derrors.Invalid, "costs", "tokens"}},
		// the check scope
		{"another org's key", acmeKey, in("strict", "", "", "", -1), refusal{derrors.NotFound, "", "strict"}},
		{"a key without the check scope", noScope, in("acme", "", "", "", -1), refusal{derrors.Forbidden, "", "check"}},
		{"the operator, an unknown org", operator, in("nope", "", "", "", -1), refusal{derrors.NotFound, "", "nope"}},
		{"a key of an unknown org", keyOf("gone", tenants.ScopeCheck), in("gone", "", "", "", -1), refusal{derrors.NotFound, "", "gone"}},
		// tenancy
		{"unknown team", acmeKey, in("acme", "sales", "", "", -1), refusal{derrors.NotFound, "", `"sales"`}},
		{"unknown metric", acmeKey, in("acme", "eng", "", "gpu", 1), refusal{derrors.Unprocessable, "", "gpu"}},
		{"unknown metric among costs", acmeKey, costs("acme", "eng", "", map[string]int64{"requests": 1, "gpu": 1}), refusal{derrors.Unprocessable, "", "gpu"}},
		{"a user registered in another team", acmeKey, in("acme", "ops", "alice", "", -1), refusal{derrors.Invalid, "team", `registered in team "eng"`}},
		{"an unregistered user without a team", acmeKey, in("acme", "", "zed", "", -1), refusal{derrors.Invalid, "team", "name its team"}},
		{"an unregistered user of a team refusing them", acmeKey, in("acme", "ops", "zed", "", -1), refusal{derrors.Unprocessable, "user", "refuses unknown users"}},
		{"an unregistered user of a team following its refusing org", strictKey, in("strict", "a", "zed", "", -1), refusal{derrors.Unprocessable, "user", `team "a"`}},
		{"an unknown team of an org refusing unknown users", strictKey, in("strict", "c", "zed", "", -1), refusal{derrors.NotFound, "", `"c"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, f := w.service()
			d, err := s.Check(context.Background(), tc.caller, tc.in)
			if why := tc.want.is(err); why != "" {
				t.Errorf("Check: %v: %s", err, why)
			}
			if d.Result.Allowed || d.HasRateLimit {
				t.Errorf("a refused check answered a decision: %+v", d)
			}
			if n := len(f.asked()); n != 0 {
				t.Errorf("the engine was asked %d checks", n)
			}
		})
	}
}

// A check is resolved into the engine's request: the org's effective limits (the
// plan's with its overrides), the team's allocation, a user's limits (its team's user
// defaults, each replaced by the user's own), the registered user's team, the org's
// mode, anchor, lease and window settings, and the limits of each metric it names,
// throttled by the org's throttle while the engine's clock says it is in force.
func TestCheckResolves(t *testing.T) {
	w := newWorld(t)
	acmeOrg := limits(vocab.Minute, 200, vocab.Month, 1000)
	for _, tc := range []struct {
		name   string
		caller checks.Caller
		in     checks.Input
		now    time.Duration // the engine's clock, after the world's now
		want   quota.Request // Org, Team, User, Metric, Cost, IdempotencyKey, Mode, AnchorDay, NoLease, Precise, Unregistered
		lim    lvls
		more   map[string]lvls // More's metrics and limits (their costs in costs)
		costs  map[string]int64
		multi  bool
		ppm    int64 // Decision.Throttle.PPM
	}{
		{name: "org of the operator", caller: operator, in: in("acme", "", "", "", -1),
			want: quota.Request{Org: "acme", Metric: "requests", Cost: 1}, lim: lvls{org: acmeOrg}},
		{name: "team", caller: acmeKey, in: in("acme", "eng", "", "", 7),
			want: quota.Request{Org: "acme", Team: "eng", Metric: "requests", Cost: 7}, lim: lvls{acmeOrg, limits(vocab.Month, 600), nil}},
		{name: "a user's own limits over its team's defaults", caller: acmeKey, in: in("acme", "eng", "alice", "", -1),
			want: quota.Request{Org: "acme", Team: "eng", User: "alice", Metric: "requests", Cost: 1},
			lim:  lvls{acmeOrg, limits(vocab.Month, 600), limits(vocab.Minute, 5, vocab.Month, 100)}},
		{name: "a registered user's team found", caller: acmeKey, in: in("acme", "", "alice", "", 0),
			want: quota.Request{Org: "acme", Team: "eng", User: "alice", Metric: "requests", Cost: 0},
			lim:  lvls{acmeOrg, limits(vocab.Month, 600), limits(vocab.Minute, 5, vocab.Month, 100)}},
		{name: "a user of its team's defaults", caller: acmeKey, in: in("acme", "eng", "bob", "", -1),
			want: quota.Request{Org: "acme", Team: "eng", User: "bob", Metric: "requests", Cost: 1},
			lim:  lvls{acmeOrg, limits(vocab.Month, 600), limits(vocab.Minute, 10, vocab.Month, 100)}},
		{name: "an unregistered user of a team that allows them", caller: acmeKey, in: in("acme", "eng", "zed", "", -1),
			want: quota.Request{Org: "acme", Team: "eng", User: "zed", Metric: "requests", Cost: 1, Unregistered: true},
			lim:  lvls{acmeOrg, limits(vocab.Month, 600), limits(vocab.Minute, 10, vocab.Month, 100)}},
		{name: "a registered user of a team refusing unknown users", caller: acmeKey, in: in("acme", "ops", "carol", "", -1),
			want: quota.Request{Org: "acme", Team: "ops", User: "carol", Metric: "requests", Cost: 1},
			lim:  lvls{acmeOrg, limits(vocab.Month, 300), limits(vocab.Month, 50)}},
		{name: "another metric's limits", caller: acmeKey, in: in("acme", "eng", "alice", "tokens", 250),
			want: quota.Request{Org: "acme", Team: "eng", User: "alice", Metric: "tokens", Cost: 250},
			lim:  lvls{limits(vocab.Month, 50000), limits(vocab.Month, 20000), nil}},
		{name: "a metered metric: no limits", caller: acmeKey, in: in("acme", "eng", "", "images", 3),
			want: quota.Request{Org: "acme", Team: "eng", Metric: "images", Cost: 3}},
		{name: "an idempotency key", caller: acmeKey, in: func() checks.Input {
			c := in("acme", "", "", "", -1)
			c.IdempotencyKey = ptr("order:42-retry")
			return c
		}(),
			want: quota.Request{Org: "acme", Metric: "requests", Cost: 1, IdempotencyKey: "order:42-retry"}, lim: lvls{org: acmeOrg}},
		{name: "several metrics, the first by name first", caller: acmeKey, in: costs("acme", "eng", "", map[string]int64{"tokens": 1200, "requests": 1}),
			want: quota.Request{Org: "acme", Team: "eng", Metric: "requests", Cost: 1}, lim: lvls{acmeOrg, limits(vocab.Month, 600), nil},
			more: map[string]lvls{"tokens": {limits(vocab.Month, 50000), limits(vocab.Month, 20000), nil}}, costs: map[string]int64{"tokens": 1200}, multi: true},
		{name: "one metric given as costs", caller: acmeKey, in: costs("acme", "", "", map[string]int64{"tokens": 5}),
			want: quota.Request{Org: "acme", Metric: "tokens", Cost: 5}, lim: lvls{org: limits(vocab.Month, 50000)}, multi: true},
		{name: "an org of no leases, precise windows, anchor 15", caller: strictKey, in: in("strict", "b", "zed", "", -1),
			want: quota.Request{Org: "strict", Team: "b", User: "zed", Metric: "requests", Cost: 1, Unregistered: true, NoLease: true, Precise: true, AnchorDay: 15},
			lim:  lvls{org: limits(vocab.Minute, 100, vocab.Month, 1000)}},
		{name: "a warn-mode org", caller: operator, in: in("calm", "", "", "", -1),
			want: quota.Request{Org: "calm", Metric: "requests", Cost: 1, Mode: vocab.Warn}, lim: lvls{org: limits(vocab.Minute, 100, vocab.Month, 1000)}},
		{name: "a throttled org: its sliding windows and bucket halved, not its month", caller: operator, in: in("slow", "", "", "", -1),
			want: quota.Request{Org: "slow", Metric: "requests", Cost: 1},
			lim:  lvls{org: append(limits(vocab.Minute, 50, vocab.Month, 1000), vocab.Limit{Window: vocab.Second, Limit: 5, Burst: 15})}, ppm: 500_000},
		{name: "a throttle expired by the engine's clock", caller: operator, in: in("slow", "", "", "", -1), now: 2 * time.Hour,
			want: quota.Request{Org: "slow", Metric: "requests", Cost: 1},
			lim:  lvls{org: append(limits(vocab.Minute, 100, vocab.Month, 1000), vocab.Limit{Window: vocab.Second, Limit: 10, Burst: 31})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, f := w.service()
			f.now = w.now.Add(tc.now)
			d, err := s.Check(context.Background(), tc.caller, tc.in)
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if len(f.calls) != 1 || len(f.calls[0]) != 1 {
				t.Fatalf("Decide calls %d, want one of one check", len(f.calls))
			}
			got := f.calls[0][0].Request
			want := tc.want
			if want.Mode == "" {
				want.Mode = vocab.Enforce
			}
			if want.AnchorDay == 0 {
				want.AnchorDay = 1
			}
			if got.Org != want.Org || got.Team != want.Team || got.User != want.User || got.Metric != want.Metric || got.Cost != want.Cost ||
				got.IdempotencyKey != want.IdempotencyKey || got.Mode != want.Mode || got.AnchorDay != want.AnchorDay ||
				got.NoLease != want.NoLease || got.Precise != want.Precise || got.Unregistered != want.Unregistered {
				t.Errorf("request\n %+v\nwant\n %+v", got, want)
			}
			checkLevels(t, got.Metric, got.Limits, tc.lim)
			if len(got.More) != len(tc.more) {
				t.Errorf("More = %+v, want %d metrics", got.More, len(tc.more))
			}
			for _, m := range got.More {
				l, ok := tc.more[m.Metric]
				if !ok || m.Cost != tc.costs[m.Metric] || m.Derived {
					t.Errorf("More has %+v, want %v", m, tc.costs)
					continue
				}
				checkLevels(t, m.Metric, m.Limits, l)
			}
			if d.Multi != tc.multi || d.Metric != want.Metric || d.Mode != want.Mode || d.Throttle.PPM != tc.ppm {
				t.Errorf("decision Multi %v Metric %q Mode %q Throttle %d, want %v %q %q %d", d.Multi, d.Metric, d.Mode, d.Throttle.PPM,
					tc.multi, want.Metric, want.Mode, tc.ppm)
			}
		})
	}
}

// lvls is a metric's limits at each level.
type lvls struct{ org, team, user []vocab.Limit }

func checkLevels(t *testing.T, metric string, got quota.LevelLimits, want lvls) {
	t.Helper()
	for _, l := range []struct {
		name      string
		got, want []vocab.Limit
	}{{"org", got.Org, want.org}, {"team", got.Team, want.team}, {"user", got.User, want.user}} {
		if !sameLimits(l.got, l.want) {
			t.Errorf("%s's %s limits %v, want %v", metric, l.name, l.got, l.want)
		}
	}
}

// The engine's errors answer with the kinds of engineError's one rule: its own kind
// when it says what is wrong, else unavailable (worth a retry); an idempotency
// conflict and the org's bounds are unprocessable, naming the field to change; a
// failed check answers no decision.
func TestCheckEngineErrors(t *testing.T) {
	w := newWorld(t)
	for _, tc := range []struct {
		name string
		err  error
		want refusal
	}{
		{"overloaded", fmt.Errorf("check acme: %w", quota.ErrOverloaded), refusal{derrors.Overloaded, "", "retry shortly"}},
		{"unavailable", fmt.Errorf("redis: %w", quota.ErrUnavailable), refusal{derrors.Unavailable, "", "quota store"}},
		{"not hydrated", quota.ErrNotHydrated, refusal{derrors.Unavailable, "", "quota store"}},
		{"unforeseen", errEngine, refusal{derrors.Unavailable, "", "quota store"}},
		{"deadline", context.DeadlineExceeded, refusal{derrors.Unavailable, "", ""}},
		{"canceled", fmt.Errorf("wait: %w", context.Canceled), refusal{derrors.Canceled, "", ""}},
		{"invalid", fmt.Errorf("%w: cost", quota.ErrInvalid), refusal{derrors.Invalid, "", ""}},
		{"idempotency conflict", fmt.Errorf("check: %w", quota.ErrIdempotencyConflict), refusal{derrors.Unprocessable, "idempotency_key", "different request"}},
		{"idempotency records bound", &quota.BoundError{Org: "acme", Bound: quota.BoundIdempotencyRecords, Limit: 77}, refusal{derrors.Unprocessable, "idempotency_key", "77 idempotency records"}},
		{"unregistered users bound", &quota.BoundError{Org: "acme", Bound: quota.BoundUnregisteredUsers, Limit: 9}, refusal{derrors.Unprocessable, "user", "9 distinct unregistered users"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, f := w.service()
			f.decide = func(c *quota.Check) { c.Err = tc.err }
			d, err := s.Check(context.Background(), acmeKey, in("acme", "eng", "zed", "", -1))
			if why := tc.want.is(err); why != "" {
				t.Errorf("Check: %v: %s", err, why)
			}
			if !errors.Is(err, tc.err) { // the cause is kept, for the logs
				t.Errorf("%v does not wrap %v", err, tc.err)
			}
			if k := tc.want.kind; (k == derrors.Unavailable || k == derrors.Overloaded) && problem.From(err).Detail == tc.err.Error() {
				t.Errorf("%v: the engine's words are the caller's", err)
			}
			if d.Result.Allowed || d.HasRateLimit || d.Metric != "" {
				t.Errorf("a failed check answered %+v", d)
			}
		})
	}
}

// A decision is described as every transport says it: RateLimit is the tightest
// level (least remaining, then soonest reset) of an allowed check, or the limit that
// denied it with its Reset the Retry-After; Retry-After is whole seconds rounded up;
// remaining is never below 0; a level without a metric is the check's; a warn-mode
// org's allowed check that would have been denied carries a warning; Violated names
// the policy that denied.
func TestCheckDescribes(t *testing.T) {
	w := newWorld(t)
	at := func(d time.Duration) time.Time { return w.now.Add(d) }
	org, team, user := vocab.LevelOrg, vocab.LevelTeam, vocab.LevelUser
	type rl struct {
		metric string
		level  vocab.Level
		window vocab.Window
		limit  int64
		rem    int64
		reset  int64
	}
	for _, tc := range []struct {
		name     string
		in       checks.Input
		res      vocab.Result
		rl       *rl // nil: no RateLimit
		retry    int64
		warning  []string // words of the warning; nil: none
		violated string
		multi    bool
	}{
		{name: "allowed: the least remaining", in: in("acme", "eng", "alice", "", -1),
			res: vocab.Result{Allowed: true, Levels: []vocab.LevelStatus{
				level("", org, "acme", vocab.Minute, 200, 10, at(30*time.Second)),
				level("", team, "eng", vocab.Month, 600, 590, at(72*time.Hour)),
				level("", user, "alice", vocab.Minute, 5, 2, at(20200*time.Millisecond))}},
			rl: &rl{"requests", user, vocab.Minute, 5, 3, 21}},
		{name: "allowed: equal remaining, the soonest reset", in: in("acme", "eng", "alice", "", -1),
			res: vocab.Result{Allowed: true, Levels: []vocab.LevelStatus{
				level("", org, "acme", vocab.Minute, 200, 197, at(50*time.Second)),
				level("", user, "alice", vocab.Month, 100, 97, at(10*time.Second))}},
			rl: &rl{"requests", user, vocab.Month, 100, 3, 10}},
		{name: "allowed: a tie kept by the first", in: in("acme", "eng", "", "", -1),
			res: vocab.Result{Allowed: true, Levels: []vocab.LevelStatus{
				level("", org, "acme", vocab.Minute, 200, 100, at(40*time.Second)),
				level("", team, "eng", vocab.Month, 600, 500, at(40*time.Second))}},
			rl: &rl{"requests", org, vocab.Minute, 200, 100, 40}},
		{name: "allowed without limits: no RateLimit", in: in("acme", "eng", "", "images", 1), res: vocab.Result{Allowed: true}},
		{name: "denied: the blocking level, reset at the retry", in: in("acme", "eng", "alice", "", -1),
			res: vocab.Result{Levels: []vocab.LevelStatus{
				level("", org, "acme", vocab.Minute, 200, 10, at(30*time.Second)),
				level("", team, "eng", vocab.Month, 600, 600, at(72*time.Hour)),
				level("", user, "alice", vocab.Minute, 5, 1, at(20*time.Second))},
				BlockedAt: &vocab.Blocked{Level: team, ID: "eng", Window: vocab.Month}, RetryAfter: 1200 * time.Millisecond},
			rl: &rl{"requests", team, vocab.Month, 600, 0, 2}, retry: 2, violated: "team-month"},
		{name: "denied past the limit: remaining 0", in: in("acme", "eng", "", "tokens", 500),
			res: vocab.Result{Levels: []vocab.LevelStatus{level("", team, "eng", vocab.Month, 20000, 20300, at(time.Hour))},
				BlockedAt: &vocab.Blocked{Level: team, ID: "eng", Window: vocab.Month}, RetryAfter: time.Millisecond},
			rl: &rl{"tokens", team, vocab.Month, 20000, 0, 1}, retry: 1, violated: "tokens-team-month"},
		{name: "denied: whole seconds stay whole", in: in("acme", "", "", "", -1),
			res: vocab.Result{Levels: []vocab.LevelStatus{level("", org, "acme", vocab.Minute, 200, 200, at(7*time.Second))},
				BlockedAt: &vocab.Blocked{Level: org, ID: "acme", Window: vocab.Minute}, RetryAfter: 7 * time.Second},
			rl: &rl{"requests", org, vocab.Minute, 200, 0, 7}, retry: 7, violated: "org-minute"},
		{name: "denied of several metrics: the blocking metric's level", in: costs("acme", "eng", "", map[string]int64{"requests": 1, "tokens": 900}),
			res: vocab.Result{Levels: []vocab.LevelStatus{
				level("requests", org, "acme", vocab.Month, 1000, 400, at(time.Hour)),
				level("tokens", org, "acme", vocab.Month, 50000, 49500, at(time.Hour)),
				level("tokens", team, "eng", vocab.Month, 20000, 100, at(time.Hour))},
				BlockedAt: &vocab.Blocked{Metric: "tokens", Level: org, ID: "acme", Window: vocab.Month}, RetryAfter: 90 * time.Second},
			rl: &rl{"tokens", org, vocab.Month, 50000, 500, 90}, retry: 90, violated: "tokens-org-month", multi: true},
		{name: "warn mode: allowed with a warning", in: in("calm", "", "", "", -1),
			res: vocab.Result{Allowed: true, Levels: []vocab.LevelStatus{level("", org, "calm", vocab.Month, 1000, 1001, at(time.Hour))},
				WouldBlock: &vocab.Blocked{Level: org, ID: "calm", Window: vocab.Month}},
			rl: &rl{"requests", org, vocab.Month, 1000, 0, 3600}, warning: []string{"org", `"calm"`, "month", "warn mode"}},
		{name: "warn mode under its limits: no warning", in: in("calm", "", "", "", -1),
			res: vocab.Result{Allowed: true, Levels: []vocab.LevelStatus{level("", org, "calm", vocab.Month, 1000, 10, at(time.Hour))}},
			rl:  &rl{"requests", org, vocab.Month, 1000, 990, 3600}},
		{name: "enforce mode: no warning for would-block", in: in("acme", "", "", "", -1),
			res: vocab.Result{Allowed: true, Levels: []vocab.LevelStatus{level("", org, "acme", vocab.Month, 1000, 1001, at(time.Hour))},
				WouldBlock: &vocab.Blocked{Level: org, ID: "acme", Window: vocab.Month}},
			rl: &rl{"requests", org, vocab.Month, 1000, 0, 3600}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, f := w.service()
			f.decide = func(c *quota.Check) { c.Result = tc.res; c.Outcome = quota.Outcome{Degraded: true} }
			d, err := s.Check(context.Background(), operator, tc.in)
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if d.Result.Allowed != tc.res.Allowed || len(d.Result.Levels) != len(tc.res.Levels) || !d.Outcome.Degraded {
				t.Errorf("result %+v %+v, want the engine's", d.Result, d.Outcome)
			}
			if tc.rl == nil {
				if d.HasRateLimit {
					t.Errorf("RateLimit %+v, want none", d.RateLimit)
				}
			} else {
				got := rl{d.RateLimit.Level.Metric, d.RateLimit.Level.Level, d.RateLimit.Level.Window, d.RateLimit.Limit, d.RateLimit.Remaining, d.RateLimit.Reset}
				if !d.HasRateLimit || got != *tc.rl {
					t.Errorf("RateLimit %+v (%v), want %+v", got, d.HasRateLimit, *tc.rl)
				}
			}
			if d.RetryAfter != tc.retry {
				t.Errorf("RetryAfter %d, want %d", d.RetryAfter, tc.retry)
			}
			if (d.Warning != "") != (tc.warning != nil) {
				t.Errorf("warning %q, want one of %q", d.Warning, tc.warning)
			}
			for _, word := range tc.warning {
				if !strings.Contains(d.Warning, word) {
					t.Errorf("warning %q without %q", d.Warning, word)
				}
			}
			if got := d.Violated(); got != tc.violated {
				t.Errorf("Violated %q, want %q", got, tc.violated)
			}
			if d.Multi != tc.multi {
				t.Errorf("Multi %v, want %v", d.Multi, tc.multi)
			}
		})
	}
}

// A service built without an engine refuses every check and reservation as
// unavailable (ErrNoEngine), asking nothing.
func TestNoEngine(t *testing.T) {
	w := newWorld(t)
	s := checks.NewService(checks.Config{Cache: w.cache})
	ctx := context.Background()
	one := in("acme", "eng", "", "", -1)
	_, checkErr := s.Check(ctx, acmeKey, one)
	_, batchErr := s.CheckBatch(ctx, acmeKey, []checks.Input{one})
	_, pathsErr := s.CheckPaths(ctx, acmeKey, []checks.Input{one})
	_, reserveErr := s.Reserve(ctx, acmeKey, checks.ReserveInput{Check: one, Amount: 1})
	_, readErr := s.Reservation(ctx, acmeKey, "r1")
	_, commitErr := s.Commit(ctx, acmeKey, "r1", 1)
	_, inFlightErr := s.InFlight(ctx, "acme")
	_, _, openErr := s.OpenReservations(ctx, "acme", "", "", "", 10)
	for name, err := range map[string]error{"Check": checkErr, "CheckBatch": batchErr, "CheckPaths": pathsErr, "Reserve": reserveErr,
		"Reservation": readErr, "Commit": commitErr, "InFlight": inFlightErr, "OpenReservations": openErr} {
		if !errors.Is(err, checks.ErrNoEngine) || derrors.KindOf(err) != derrors.Unavailable {
			t.Errorf("%s: %v, want ErrNoEngine", name, err)
		}
	}
	// An input refused on its own is refused for its own fault, not for the missing
	// engine: a key without the check scope is Forbidden, a bad field Invalid, with
	// or without an engine.
	if _, err := s.Check(ctx, noScope, one); derrors.KindOf(err) != derrors.Forbidden {
		t.Errorf("Check by a key without the check scope: %v, want Forbidden", err)
	}
	if _, err := s.Check(ctx, acmeKey, in("", "", "", "", -1)); derrors.KindOf(err) != derrors.Invalid {
		t.Errorf("Check without an org: %v, want Invalid", err)
	}
	items, err := s.CheckBatch(ctx, noScope, []checks.Input{one})
	if err != nil || len(items) != 1 || derrors.KindOf(items[0].Err) != derrors.Forbidden {
		t.Errorf("CheckBatch by a key without the check scope: %v %+v, want its item Forbidden", err, items)
	}
}
