package checks_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// world is the tenancy the service's unit tests resolve against, in a fresh Postgres
// database, and the time its fake engines say it is:
//
//   - plan p: requests 100/minute and 1000/month, tokens 50000/month; images and
//     m00 to m16 (one more than a check may name) metered; features sso and tier.
//   - acme (on p, its minute raised to 200): team eng (requests 600/month, tokens
//     20000/month; users 100/month and 10/minute of requests), whose alice has her own
//     5/minute and bob none; team ops (requests 300/month; users 50/month), refusing
//     unknown users, whose carol is registered.
//   - strict (on p): refuses unknown users, leases off, precise windows, billing anchor
//     day 15; its team a follows the org, team b allows unknown users.
//   - calm (on p): warn mode. slow (on p, plus a bucket of 10 requests/second, burst
//     31): throttled to 0.5 until an hour from now.
//   - shop (on plan pm, USD): tokens.in at 2.50, tokens.cached at 1.25 and tokens.out
//     at 10 per million,
//     requests 1000/month, spend 100000/month; team eng spend 20000/month, its users
//     4000/month, and dave, its registered user, 3000/month.
type world struct {
	cache *tenants.Cache
	now   time.Time
}

func newWorld(t *testing.T) *world {
	t.Helper()
	ctx := context.Background()
	ten := tenants.NewService(testenv.Postgres(t))
	op := tenants.Actor{Name: "operator"}
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	lim := func(metric string, w vocab.Window, n int64) vocab.Limit {
		return vocab.Limit{Metric: metric, Window: w, Limit: n}
	}
	metered := []string{"images"}
	for i := range quota.MaxMetrics + 1 {
		metered = append(metered, fmt.Sprintf("m%02d", i))
	}
	must(ten.CreatePlan(ctx, op, tenants.PlanInput{ID: "p", Name: "P", FailMode: vocab.FailClosed, Metered: metered,
		Features: tenants.Features{"sso": true, "tier": "gold"},
		Limits:   []vocab.Limit{lim("requests", vocab.Minute, 100), lim("requests", vocab.Month, 1000), lim("tokens", vocab.Month, 50000)}}))
	must(ten.CreateOrg(ctx, op, tenants.OrgInput{ID: "acme", Name: "Acme", PlanID: "p", Limits: []vocab.Limit{lim("requests", vocab.Minute, 200)}}))
	must(ten.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: "eng", Name: "Eng",
		Limits:     []vocab.Limit{lim("requests", vocab.Month, 600), lim("tokens", vocab.Month, 20000)},
		UserLimits: []vocab.Limit{lim("requests", vocab.Minute, 10), lim("requests", vocab.Month, 100)}}))
	must(ten.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: "ops", Name: "Ops", UnknownUsers: tenants.UnknownUsersRefuse,
		Limits: []vocab.Limit{lim("requests", vocab.Month, 300)}, UserLimits: []vocab.Limit{lim("requests", vocab.Month, 50)}}))
	must(ten.CreateUser(ctx, op, "acme", "eng", tenants.UserInput{ID: "alice", Limits: []vocab.Limit{lim("requests", vocab.Minute, 5)}}))
	must(ten.CreateUser(ctx, op, "acme", "eng", tenants.UserInput{ID: "bob"}))
	must(ten.CreateUser(ctx, op, "acme", "ops", tenants.UserInput{ID: "carol"}))

	must(ten.CreateOrg(ctx, op, tenants.OrgInput{ID: "strict", Name: "Strict", PlanID: "p", UnknownUsers: tenants.UnknownUsersRefuse,
		Leases: tenants.LeasesOff, SlidingWindows: tenants.WindowsPrecise, BillingAnchorDay: 15}))
	must(ten.CreateTeam(ctx, op, "strict", tenants.TeamInput{ID: "a", Name: "A"}))
	must(ten.CreateTeam(ctx, op, "strict", tenants.TeamInput{ID: "b", Name: "B", UnknownUsers: tenants.UnknownUsersAllow}))

	must(ten.CreateOrg(ctx, op, tenants.OrgInput{ID: "calm", Name: "Calm", PlanID: "p", Mode: vocab.Warn}))
	must(ten.CreateOrg(ctx, op, tenants.OrgInput{ID: "slow", Name: "Slow", PlanID: "p",
		Limits: []vocab.Limit{{Metric: "requests", Window: vocab.Second, Limit: 10, Burst: 31}}}))
	hour := int64(3600)
	must(ten.SetThrottle(ctx, op, tenants.ThrottleOrg, "slow", tenants.ThrottleInput{Factor: 0.5, TTLSeconds: &hour, Reason: "a test"}))

	must(ten.CreatePlan(ctx, op, tenants.PlanInput{ID: "pm", Name: "Money", FailMode: vocab.FailClosed, Currency: "USD",
		Rates: []tenants.Rate{{Metric: "tokens.in", Price: "2.50", Per: 1_000_000}, {Metric: "tokens.out", Price: "10", Per: 1_000_000},
			{Metric: "tokens.cached", Price: "1.25", Per: 1_000_000}},
		Limits: []vocab.Limit{lim("requests", vocab.Month, 1000), lim(tenants.SpendMetric, vocab.Month, 100000)}}))
	must(ten.CreateOrg(ctx, op, tenants.OrgInput{ID: "shop", Name: "Shop", PlanID: "pm"}))
	must(ten.CreateTeam(ctx, op, "shop", tenants.TeamInput{ID: "eng", Name: "Eng",
		Limits: []vocab.Limit{lim(tenants.SpendMetric, vocab.Month, 20000)}, UserLimits: []vocab.Limit{lim(tenants.SpendMetric, vocab.Month, 4000)}}))
	must(ten.CreateUser(ctx, op, "shop", "eng", tenants.UserInput{ID: "dave", Limits: []vocab.Limit{lim(tenants.SpendMetric, vocab.Month, 3000)}}))

	return &world{cache: tenants.NewCache(ten, tenants.CacheOptions{TTL: time.Hour, KeyTTL: time.Hour}), now: time.Now().UTC()}
}

// service is a check service over the world's tenancy and a new fake engine.
func (w *world) service() (*checks.Service, *fakeEngine) {
	f := newFake(w.now)
	return checks.NewService(checks.Config{Cache: w.cache, Engine: f, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}), f
}

// The callers of the tests.
var (
	operator  = checks.Caller{Operator: true}
	acmeKey   = keyOf("acme", tenants.ScopeCheck)
	shopKey   = keyOf("shop", tenants.ScopeCheck)
	noScope   = keyOf("acme", tenants.ScopeAdmin, tenants.ScopeBilling)
	strictKey = keyOf("strict", tenants.ScopeCheck)
)

func keyOf(org string, scopes ...tenants.Scope) checks.Caller {
	return checks.Caller{Key: tenants.APIKey{ID: "k-" + org, OrgID: org, Scopes: scopes}}
}

func ptr[T any](v T) *T { return &v }

// in is a check of org, and of team, user and metric unless "", of cost (-1: none).
func in(org, team, user, metric string, cost int64) checks.Input {
	c := checks.Input{Org: org}
	if team != "" {
		c.Team = &team
	}
	if user != "" {
		c.User = &user
	}
	if metric != "" {
		c.Metric = &metric
	}
	if cost >= 0 {
		c.Cost = &cost
	}
	return c
}

// costs is a check of several metrics.
func costs(org, team, user string, cs map[string]int64) checks.Input {
	c := in(org, team, user, "", -1)
	c.Costs = cs
	return c
}

// refusal is what an error should be: its kind, the field it names ("" for none)
// and words its text holds.
type refusal struct {
	kind  derrors.Kind
	field string
	words string
}

// is reports how err differs from r, "" when it does not.
func (r refusal) is(err error) string {
	switch {
	case err == nil:
		return "no error"
	case derrors.KindOf(err) != r.kind:
		return "kind " + derrors.KindOf(err).Error() + ", want " + r.kind.Error()
	case r.field != "" && !hasField(err, r.field):
		return "no field " + r.field
	case !strings.Contains(err.Error(), r.words):
		return "text without " + `"` + r.words + `"`
	}
	return ""
}

// answered fails t when err is not the refusal r (nil: when err is not nil), and
// says whether it was a refusal, after which the case has nothing more to check.
func (r *refusal) answered(t *testing.T, err error) bool {
	t.Helper()
	if r == nil {
		if err != nil {
			t.Fatal(err)
		}
		return false
	}
	if why := r.is(err); why != "" {
		t.Errorf("%v: %s", err, why)
	}
	return true
}

func hasField(err error, field string) bool {
	for _, f := range derrors.FieldsOf(err) {
		if f.Field == field {
			return true
		}
	}
	return false
}

// limits is a level's limits as a check's request carries them.
func limits(ls ...any) []vocab.Limit {
	var out []vocab.Limit
	for i := 0; i < len(ls); i += 2 {
		out = append(out, vocab.Limit{Window: ls[i].(vocab.Window), Limit: int64(ls[i+1].(int))})
	}
	return out
}

// sameLimits compares two levels' limits as sets of (window, limit, burst).
func sameLimits(a, b []vocab.Limit) bool {
	if len(a) != len(b) {
		return false
	}
	for _, l := range a {
		found := false
		for _, m := range b {
			if l.Window == m.Window && l.Limit == m.Limit && l.Burst == m.Burst {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// errEngine is an error the engine cannot place.
var errEngine = errors.New("the script said something unforeseen")

// level is a level's status after a check.
func level(metric string, lv vocab.Level, id string, w vocab.Window, limit, used int64, reset time.Time) vocab.LevelStatus {
	return vocab.LevelStatus{Metric: metric, Level: lv, ID: id, Window: w, Limit: limit, Used: used, Remaining: limit - used, ResetAt: reset}
}
