package checks_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// said is a check as the engine was asked it: "team/user metric:cost ...", its
// metrics by name, a derived one starred.
func said(c quota.Check) string { return saidReq(c.Request) }

// saidReq is said of a request.
func saidReq(r quota.Request) string {
	ms := []string{fmt.Sprintf("%s:%d", r.Metric, r.Cost)}
	for _, m := range r.More {
		name := m.Metric
		if m.Derived {
			name += "*"
		}
		ms = append(ms, fmt.Sprintf("%s:%d", name, m.Cost))
	}
	slices.Sort(ms)
	return r.Team + "/" + r.User + " " + strings.Join(ms, " ")
}

// saidAll is every check the engine was asked, sorted; it fails unless they were
// asked in one Decide call (none when none was asked).
func saidAll(t *testing.T, f *fakeEngine) []string {
	t.Helper()
	if len(f.calls) > 1 {
		t.Errorf("Decide called %d times, want once", len(f.calls))
	}
	var out []string
	for _, c := range f.asked() {
		out = append(out, said(c))
	}
	slices.Sort(out)
	return out
}

func metricsOn(org, team string, from, to int) []checks.Input {
	var ins []checks.Input
	for i := from; i <= to; i++ {
		ins = append(ins, in(org, team, "", fmt.Sprintf("m%02d", i), 1))
	}
	return ins
}

// CheckPaths decides Envoy's descriptors as paths: the inputs on one org -> team ->
// user path of one metric are one check of the deepest, at the largest of their
// costs; the paths ending at one org, team and user are one multi-metric check; a
// path of more metrics than a check may name is refused whole; an input at fault is
// refused alone, the rest decided as if it had not been given; every decided path in
// one Decide call.
func TestCheckPathsMerges(t *testing.T) {
	w := newWorld(t)
	type fault struct {
		at   int
		want refusal
	}
	whole := refusal{derrors.Invalid, "", "refused whole"}
	var seventeenRefused []fault
	for i := range quota.MaxMetrics + 1 {
		seventeenRefused = append(seventeenRefused, fault{i, whole})
	}
	for _, tc := range []struct {
		name   string
		caller checks.Caller
		ins    []checks.Input
		asked  []string
		faults []fault
	}{
		{name: "one path: the deepest, at the largest cost", caller: acmeKey,
			ins:   []checks.Input{in("acme", "", "", "", 1), in("acme", "eng", "", "", 4), in("acme", "eng", "alice", "", 2)},
			asked: []string{"eng/alice requests:4"}},
		{name: "a registered user's team joins its team's path", caller: acmeKey,
			ins:   []checks.Input{in("acme", "eng", "", "", 1), in("acme", "", "alice", "", 3)},
			asked: []string{"eng/alice requests:3"}},
		{name: "two paths, the org's input on one", caller: acmeKey,
			ins:   []checks.Input{in("acme", "eng", "alice", "", 1), in("acme", "ops", "carol", "", 1), in("acme", "", "", "", 1)},
			asked: []string{"eng/alice requests:1", "ops/carol requests:1"}},
		{name: "two users of one team: two paths", caller: acmeKey,
			ins:   []checks.Input{in("acme", "eng", "alice", "", 1), in("acme", "eng", "bob", "", 2)},
			asked: []string{"eng/alice requests:1", "eng/bob requests:2"}},
		{name: "two metrics ending at one team: one check", caller: acmeKey,
			ins:   []checks.Input{in("acme", "eng", "", "", 1), in("acme", "eng", "", "tokens", 300)},
			asked: []string{"eng/ requests:1 tokens:300"}},
		{name: "two metrics ending at one user, each with its team's", caller: acmeKey,
			ins: []checks.Input{in("acme", "eng", "", "tokens", 500), in("acme", "eng", "alice", "tokens", 300), in("acme", "eng", "", "", 1),
				in("acme", "eng", "alice", "", 1)},
			asked: []string{"eng/alice requests:1 tokens:500"}},
		{name: "a team's metric beside a user's path: two checks", caller: acmeKey,
			ins:   []checks.Input{in("acme", "eng", "alice", "", 1), in("acme", "eng", "", "tokens", 300)},
			asked: []string{"eng/ tokens:300", "eng/alice requests:1"}},
		{name: "sixteen metrics on a path: one check", caller: acmeKey, ins: metricsOn("acme", "eng", 0, 15),
			asked: []string{"eng/ m00:1 m01:1 m02:1 m03:1 m04:1 m05:1 m06:1 m07:1 m08:1 m09:1 m10:1 m11:1 m12:1 m13:1 m14:1 m15:1"}},
		{name: "seventeen metrics on a path: refused whole, the other path decided", caller: acmeKey,
			ins:    append(metricsOn("acme", "eng", 0, 16), in("acme", "ops", "", "", 1)),
			asked:  []string{"ops/ requests:1"},
			faults: seventeenRefused},
		{name: "faults refused alone", caller: acmeKey,
			ins: []checks.Input{in("acme", "eng", "", "", 1), {Org: "acme", Cost: ptr(int64(-1))}, in("acme", "sales", "", "", 1),
				in("acme", "eng", "", "gpu", 1), in("acme", "ops", "zed", "", 1), in("acme", "eng", "al ice", "", 1), in("strict", "", "", "", 1),
				in("acme", "ops", "alice", "", 1)},
			asked: []string{"eng/ requests:1"},
			faults: []fault{{1, refusal{derrors.Invalid, "cost", ""}}, {2, refusal{derrors.NotFound, "", "sales"}},
				{3, refusal{derrors.Unprocessable, "", "gpu"}}, {4, refusal{derrors.Unprocessable, "user", "refuses unknown users"}},
				{5, refusal{derrors.Invalid, "user", ""}}, {6, refusal{derrors.NotFound, "", "strict"}},
				{7, refusal{derrors.Invalid, "team", "registered in team"}}}},
		{name: "every input at fault: nothing asked", caller: noScope,
			ins:    []checks.Input{in("acme", "eng", "", "", 1), in("acme", "", "", "", 1)},
			faults: []fault{{0, refusal{derrors.Forbidden, "", ""}}, {1, refusal{derrors.Forbidden, "", ""}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, f := w.service()
			p, err := s.CheckPaths(context.Background(), tc.caller, tc.ins)
			if err != nil {
				t.Fatalf("CheckPaths: %v", err)
			}
			if got := saidAll(t, f); fmt.Sprint(got) != fmt.Sprint(tc.asked) {
				t.Errorf("asked %q, want %q", got, tc.asked)
			}
			if len(p.Checks) != len(tc.ins) || p.Refused != len(tc.faults) {
				t.Fatalf("%d checks, %d refused; want %d, %d", len(p.Checks), p.Refused, len(tc.ins), len(tc.faults))
			}
			for i, c := range p.Checks {
				j := slices.IndexFunc(tc.faults, func(f fault) bool { return f.at == i })
				switch {
				case j >= 0:
					if why := tc.faults[j].want.is(c.Err); why != "" || c.Allowed || !checks.InputFault(c.Err) {
						t.Errorf("input %d: %v (allowed %v): %s", i, c.Err, c.Allowed, why)
					}
				case c.Err != nil || !c.Allowed:
					t.Errorf("input %d: %v (allowed %v), want allowed", i, c.Err, c.Allowed)
				}
			}
			if !p.Allowed {
				t.Error("the call is denied, though no path was")
			}
		})
	}
}

// A merged path takes the limits of its deepest input (a user's own over its team's
// defaults) and of every metric it names.
func TestCheckPathsLimits(t *testing.T) {
	w := newWorld(t)
	s, f := w.service()
	_, err := s.CheckPaths(context.Background(), acmeKey, []checks.Input{in("acme", "eng", "", "tokens", 10), in("acme", "", "", "", 1),
		in("acme", "eng", "alice", "", 1), in("acme", "eng", "alice", "tokens", 3)})
	if err != nil {
		t.Fatal(err)
	}
	cs := f.asked()
	if len(cs) != 1 {
		t.Fatalf("asked %d checks, want 1", len(cs))
	}
	r := cs[0].Request
	byMetric := map[string]quota.LevelLimits{r.Metric: r.Limits}
	for _, m := range r.More {
		byMetric[m.Metric] = m.Limits
	}
	checkLevels(t, "requests", byMetric["requests"], lvls{limits(vocab.Minute, 200, vocab.Month, 1000), limits(vocab.Month, 600), limits(vocab.Minute, 5, vocab.Month, 100)})
	checkLevels(t, "tokens", byMetric["tokens"], lvls{limits(vocab.Month, 50000), limits(vocab.Month, 20000), nil})
	if len(byMetric) != 2 || r.Team != "eng" || r.User != "alice" {
		t.Errorf("asked %s, want one check of alice's requests and tokens", said(cs[0]))
	}
}

// CheckPaths describes each input by its path's result, its own level and those above
// it (and of a multi-metric path, its own metric's), and the whole by the first denied
// path, else the tightest level of all; a refused input is no denied path; the first
// warning of a warn-mode path and any degraded path are the whole's.
func TestCheckPathsDescribes(t *testing.T) {
	w := newWorld(t)
	at := func(d time.Duration) time.Time { return w.now.Add(d) }
	org, team, user := vocab.LevelOrg, vocab.LevelTeam, vocab.LevelUser
	// results by the path's team/user
	results := map[string]vocab.Result{
		"eng/alice": {Allowed: true, Levels: []vocab.LevelStatus{
			level("", org, "acme", vocab.Minute, 200, 10, at(30*time.Second)),
			level("", team, "eng", vocab.Month, 600, 500, at(72*time.Hour)),
			level("", user, "alice", vocab.Minute, 5, 4, at(20*time.Second))}},
		"eng/bob": {Levels: []vocab.LevelStatus{
			level("", org, "acme", vocab.Minute, 200, 10, at(30*time.Second)),
			level("", team, "eng", vocab.Month, 600, 600, at(72*time.Hour))},
			BlockedAt: &vocab.Blocked{Level: team, ID: "eng", Window: vocab.Month}, RetryAfter: 3200 * time.Millisecond},
		"ops/carol": {Levels: []vocab.LevelStatus{
			level("", user, "carol", vocab.Month, 50, 50, at(96*time.Hour))},
			BlockedAt: &vocab.Blocked{Level: user, ID: "carol", Window: vocab.Month}, RetryAfter: 10 * time.Second},
		"ops/": {Allowed: true, Levels: []vocab.LevelStatus{
			level("", team, "ops", vocab.Month, 300, 100, at(72*time.Hour))}},
		"eng/": {Allowed: true, Levels: []vocab.LevelStatus{ // a multi-metric path: levels name their metrics
			level("requests", org, "acme", vocab.Month, 1000, 400, at(time.Hour)),
			level("tokens", team, "eng", vocab.Month, 20000, 19950, at(2*time.Hour))}},
		"/": {Allowed: true, Levels: []vocab.LevelStatus{level("", org, "calm", vocab.Month, 1000, 1001, at(time.Hour))},
			WouldBlock: &vocab.Blocked{Level: org, ID: "calm", Window: vocab.Month}},
	}
	type rl struct {
		metric string
		level  vocab.Level
		window vocab.Window
		rem    int64
		reset  int64
	}
	none := rl{}
	for _, tc := range []struct {
		name     string
		ins      []checks.Input
		degrade  string // the path (team/user) answered degraded
		checks   []rl   // each input's RateLimit; none: no RateLimit
		allowed  []bool
		whole    rl
		allowedW bool
		retry    int64
		violated string
		levels   int
		warning  string
	}{
		{name: "one path, each input by its own level and those above",
			ins:     []checks.Input{in("acme", "", "", "", 1), in("acme", "eng", "", "", 1), in("acme", "eng", "alice", "", 1)},
			checks:  []rl{{"requests", org, vocab.Minute, 190, 30}, {"requests", team, vocab.Month, 100, 259200}, {"requests", user, vocab.Minute, 1, 20}},
			allowed: []bool{true, true, true}, allowedW: true, whole: rl{"requests", user, vocab.Minute, 1, 20}, levels: 3},
		{name: "the first denied path describes the whole",
			ins:     []checks.Input{in("acme", "eng", "bob", "", 1), in("acme", "ops", "carol", "", 1), in("acme", "eng", "alice", "", 1)},
			checks:  []rl{{"requests", team, vocab.Month, 0, 4}, {"requests", user, vocab.Month, 0, 10}, {"requests", user, vocab.Minute, 1, 20}},
			allowed: []bool{false, false, true}, whole: rl{"requests", team, vocab.Month, 0, 4}, retry: 4, violated: "team-month", levels: 6},
		{name: "a refused input is no denial",
			ins:    []checks.Input{in("acme", "ops", "", "", 1), in("acme", "sales", "", "", 1)},
			checks: []rl{{"requests", team, vocab.Month, 200, 259200}, none}, allowed: []bool{true, false},
			allowedW: true, whole: rl{"requests", team, vocab.Month, 200, 259200}, levels: 1},
		{name: "a multi-metric path: each input by its metric's levels",
			ins:    []checks.Input{in("acme", "eng", "", "", 1), in("acme", "eng", "", "tokens", 30)},
			checks: []rl{{"requests", org, vocab.Month, 600, 3600}, {"tokens", team, vocab.Month, 50, 7200}}, allowed: []bool{true, true},
			allowedW: true, whole: rl{"tokens", team, vocab.Month, 50, 7200}, levels: 2},
		{name: "a warn-mode path's warning, a degraded path",
			ins:    []checks.Input{in("acme", "ops", "", "", 1), in("calm", "", "", "", 1)},
			checks: []rl{{"requests", team, vocab.Month, 200, 259200}, {"requests", org, vocab.Month, 0, 3600}}, allowed: []bool{true, true},
			allowedW: true, whole: rl{"requests", org, vocab.Month, 0, 3600}, levels: 2, warning: `"calm"`, degrade: "ops/"},
		{name: "every input refused: allowed, no limit",
			ins:    []checks.Input{in("acme", "sales", "", "", 1), in("acme", "eng", "", "gpu", 1)},
			checks: []rl{none, none}, allowed: []bool{false, false}, allowedW: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, f := w.service()
			f.decide = func(c *quota.Check) {
				k := c.Request.Team + "/" + c.Request.User
				c.Result, c.Outcome.Degraded = results[k], k == tc.degrade
			}
			p, err := s.CheckPaths(context.Background(), operator, tc.ins)
			if err != nil {
				t.Fatalf("CheckPaths: %v", err)
			}
			desc := func(has bool, r checks.RateLimit) rl {
				if !has {
					return none
				}
				return rl{r.Level.Metric, r.Level.Level, r.Level.Window, r.Remaining, r.Reset}
			}
			for i, c := range p.Checks {
				if got := desc(c.HasRateLimit, c.RateLimit); got != tc.checks[i] || c.Allowed != tc.allowed[i] {
					t.Errorf("input %d: %+v allowed %v, want %+v %v", i, got, c.Allowed, tc.checks[i], tc.allowed[i])
				}
			}
			if got := desc(p.HasRateLimit, p.RateLimit); got != tc.whole || p.Allowed != tc.allowedW || p.RetryAfter != tc.retry || p.Violated != tc.violated {
				t.Errorf("whole %+v allowed %v retry %d violated %q, want %+v %v %d %q", got, p.Allowed, p.RetryAfter, p.Violated,
					tc.whole, tc.allowedW, tc.retry, tc.violated)
			}
			if len(p.Levels) != tc.levels || slices.ContainsFunc(p.Levels, func(l vocab.LevelStatus) bool { return l.Metric == "" }) {
				t.Errorf("levels %+v, want %d, each naming its metric", p.Levels, tc.levels)
			}
			if !strings.Contains(p.Warning, tc.warning) || (p.Warning == "") != (tc.warning == "") {
				t.Errorf("warning %q, want one of %q", p.Warning, tc.warning)
			}
			if p.Degraded != (tc.degrade != "") {
				t.Errorf("degraded %v, want %v", p.Degraded, tc.degrade != "")
			}
		})
	}
}

// The errors of CheckPaths: no input is invalid; an engine refusal for a fault of the
// path's own (an idempotency conflict) refuses its inputs alone; any other engine
// error fails the whole call with its kind; the tenancy store down fails it with an
// *InputError naming the input, before the engine is asked.
func TestCheckPathsErrors(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	t.Run("no inputs", func(t *testing.T) {
		s, f := w.service()
		if _, err := s.CheckPaths(ctx, acmeKey, nil); derrors.KindOf(err) != derrors.Invalid || len(f.calls) != 0 {
			t.Errorf("CheckPaths(none): %v, want invalid", err)
		}
	})
	two := []checks.Input{in("acme", "eng", "", "", 1), in("acme", "ops", "carol", "", 1)}
	for _, tc := range []struct {
		name    string
		err     error
		fails   derrors.Kind // the call's; Internal: it answers
		refused refusal
	}{
		{"an idempotency conflict", quota.ErrIdempotencyConflict, derrors.Internal, refusal{derrors.Unprocessable, "idempotency_key", ""}},
		{"a bound", &quota.BoundError{Org: "acme", Bound: quota.BoundUnregisteredUsers, Limit: 3}, derrors.Internal, refusal{derrors.Unprocessable, "user", ""}},
		{"overloaded", quota.ErrOverloaded, derrors.Overloaded, refusal{}},
		{"unavailable", quota.ErrUnavailable, derrors.Unavailable, refusal{}},
		{"unforeseen", errEngine, derrors.Unavailable, refusal{}},
		{"canceled", context.Canceled, derrors.Canceled, refusal{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, f := w.service()
			f.decide = func(c *quota.Check) {
				if c.Request.Team == "ops" {
					c.Err = tc.err
				} else {
					c.Result.Allowed = true
				}
			}
			p, err := s.CheckPaths(ctx, acmeKey, two)
			if tc.fails != derrors.Internal {
				var ie *checks.InputError
				if derrors.KindOf(err) != tc.fails || errors.As(err, &ie) {
					t.Errorf("CheckPaths: %v, want the engine's %v", err, tc.fails)
				}
				return
			}
			if err != nil {
				t.Fatalf("CheckPaths: %v", err)
			}
			if why := tc.refused.is(p.Checks[1].Err); why != "" || p.Refused != 1 || !p.Checks[0].Allowed || p.Checks[1].Allowed || !p.Allowed {
				t.Errorf("checks %+v (refused %d): %s", p.Checks, p.Refused, why)
			}
		})
	}
	t.Run("the tenancy store down", func(t *testing.T) {
		pool, err := pgxpool.New(ctx, testenv.PostgresURL(t))
		if err != nil {
			t.Fatal(err)
		}
		pool.Close()
		f := newFake(w.now)
		s := checks.NewService(checks.Config{Cache: tenants.NewCache(tenants.NewService(pool), tenants.CacheOptions{}), Engine: f})
		_, err = s.CheckPaths(ctx, acmeKey, []checks.Input{{Org: "acme", Cost: ptr(int64(-1))}, in("acme", "eng", "", "", 1)})
		var ie *checks.InputError
		if !errors.As(err, &ie) || ie.Index != 1 || derrors.KindOf(err) != derrors.Unavailable {
			t.Errorf("CheckPaths: %v, want input 1 unavailable", err)
		}
		if _, err := s.Check(ctx, acmeKey, in("acme", "eng", "", "", 1)); derrors.KindOf(err) != derrors.Unavailable {
			t.Errorf("Check: %v, want unavailable", err)
		}
		if len(f.calls) != 0 {
			t.Errorf("the engine was asked %d times", len(f.calls))
		}
	})
}

// InputFault: an input's own fault refuses it alone; the service's (a store down, too
// much in flight, the caller gone, a bug) fail a CheckPaths call.
func TestInputFault(t *testing.T) {
	for _, tc := range []struct {
		err   error
		fault bool
	}{
		{derrors.Field("cost", "must be 0 to 1"), true},
		{derrors.E(derrors.NotFound, "team not found", nil), true},
		{derrors.E(derrors.Forbidden, "no scope", nil), true},
		{&tenants.UnknownMetricError{Metric: "gpu"}, true},
		{quota.ErrIdempotencyConflict, true},
		{quota.ErrUnavailable, false},
		{quota.ErrOverloaded, false},
		{fmt.Errorf("wait: %w", context.Canceled), false},
		{errEngine, false},
	} {
		if got := checks.InputFault(tc.err); got != tc.fault {
			t.Errorf("InputFault(%v) = %v, want %v", tc.err, got, tc.fault)
		}
	}
}
