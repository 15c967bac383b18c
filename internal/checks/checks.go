package checks

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"slices"
	"time"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Input names one check. Nil pointers are absent fields: the defaults apply.
type Input struct {
	Org            string
	Team           *string
	User           *string
	Metric         *string // default "requests"
	Cost           *int64  // default 1
	IdempotencyKey *string
	// Costs names several metrics (1 to quota.MaxMetrics) and their costs instead of
	// Metric and Cost: one decision, all or nothing. Decided in the order of the
	// metrics' names.
	Costs map[string]int64
}

// Caller is who asks: the operator, or an org API key.
type Caller struct {
	Operator bool
	Key      tenants.APIKey
}

// Authorize is the check scope's test, the one of every transport: the operator may
// check any org; an org API key only its own org (another org is not found, as it is
// to every other route), and only with the check scope. Errors: derrors NotFound and
// Forbidden.
func (c Caller) Authorize(org string) error {
	if c.Operator {
		return nil
	}
	if c.Key.OrgID != org {
		return derrors.E(derrors.NotFound, fmt.Sprintf("org %s not found", vocab.Quote(org)), nil)
	}
	if !c.Key.HasScope(tenants.ScopeCheck) {
		return errNoCheckScope
	}
	return nil
}

// errNoCheckScope refuses a key without the check scope.
var errNoCheckScope = derrors.E(derrors.Forbidden, "this key lacks the scope this operation needs: check", nil)

// IdempotencyPattern is what an idempotency key must match.
var IdempotencyPattern = regexp.MustCompile(`^[A-Za-z0-9._:@-]{8,128}$`)

const idMsg = vocab.IDRule

// msgRequired is what a required field that was not given says (the admin API's
// request validator says the same).
const msgRequired = "is required"

// Validate checks everything the API's CheckRequest schema says of a check; the
// problem names the field (org, team, user, metric, cost, idempotency_key). A
// missing org (or "") is "is required", as the admin API's validator words a
// missing required field, not the pattern an absent value cannot match.
func (in Input) Validate() error {
	switch {
	case in.Org == "":
		return derrors.Field("org", msgRequired)
	case !vocab.ValidID(in.Org):
		return derrors.Field("org", idMsg)
	case in.Team != nil && !vocab.ValidID(*in.Team):
		return derrors.Field("team", idMsg)
	case in.User != nil && !vocab.ValidID(*in.User):
		return derrors.Field("user", idMsg)
	case in.Metric != nil && !vocab.ValidID(*in.Metric):
		return derrors.Field("metric", idMsg)
	case in.Cost != nil && (*in.Cost < 0 || *in.Cost > vocab.MaxUnits):
		return derrors.Field("cost", fmt.Sprintf("must be 0 to %d", vocab.MaxUnits))
	case in.IdempotencyKey != nil && !IdempotencyPattern.MatchString(*in.IdempotencyKey):
		return derrors.Field("idempotency_key", "must be 8 to 128 characters of A-Z a-z 0-9 . _ : @ -")
	}
	if in.Costs != nil {
		return validCosts("costs", in.Costs, in.Metric != nil, in.Cost != nil, "metric", "cost")
	}
	return nil
}

// validCosts checks a costs object (field: costs, amounts or used): 1 to
// quota.MaxMetrics metrics, each a valid id, each cost 0 to vocab.MaxUnits, and not
// given beside the one-metric fields (metric and cost, or amount).
func validCosts(field string, costs map[string]int64, hasMetric, hasCost bool, metricField, costField string) error {
	if hasMetric || hasCost {
		var fs []derrors.FieldError
		msg := fmt.Sprintf("give either %s or %s and %s, not both", field, metricField, costField)
		fs = append(fs, derrors.FieldError{Field: field, Message: msg})
		if hasMetric && metricField != "" {
			fs = append(fs, derrors.FieldError{Field: metricField, Message: msg})
		}
		if hasCost {
			fs = append(fs, derrors.FieldError{Field: costField, Message: msg})
		}
		return derrors.E(derrors.Invalid, msg, nil, fs...)
	}
	if n := len(costs); n < 1 || n > quota.MaxMetrics {
		return derrors.Field(field, fmt.Sprintf("must name 1 to %d metrics, not %d", quota.MaxMetrics, n))
	}
	for _, m := range sortedMetrics(costs) {
		if !vocab.ValidID(m) {
			return derrors.Field(field, fmt.Sprintf("metric %s: %s", vocab.Quote(m), idMsg))
		}
		if c := costs[m]; c < 0 || c > vocab.MaxUnits {
			return derrors.Field(field, fmt.Sprintf("%s: must be 0 to %d", m, vocab.MaxUnits))
		}
	}
	return nil
}

// sortedMetrics is the metrics of costs in order of their names.
func sortedMetrics(costs map[string]int64) []string {
	ms := make([]string, 0, len(costs))
	for m := range costs {
		ms = append(ms, m)
	}
	slices.Sort(ms)
	return ms
}

// now is the time of route's checks by e (the engine's clock: the last Redis TIME
// sample plus the monotonic time since, so a stepped local clock moves no throttle's
// expiry), or the local clock when e is nil.
func now(e Engine, route vocab.Route) time.Time {
	if e == nil {
		return time.Now()
	}
	return e.Now(route)
}

// resolved is one input resolved: the engine's request and the route to its org's
// Redis (its limits throttled by the throttle the org is under at this moment), and
// what describes its decision.
type resolved struct {
	req      quota.Request
	route    vocab.Route
	mode     vocab.Mode
	throttle tenants.Throttle
	price    pricing // its org's rates and its path's spend limits (money.go)
}

// decision is the Decision of r with what resolving it knows; the engine's answer
// completes it.
func (r *resolved) decision(multi bool) Decision {
	req := &r.req
	return Decision{Mode: r.mode, Throttle: r.throttle, Multi: multi || len(req.More) > 0, Metric: req.Metric}
}

// resolve validates and authorizes in, and resolves it into the engine's check: the
// request of in's own metrics and costs, and the pricing it needs (price adds its
// spend; CheckPaths prices each path once its checks are merged). An expired throttle
// is ignored by the clock of the check's engine, so a throttle lifts on every replica
// at once and a stepped local clock lifts none early or late. The limits go into
// *slab when it has room (CheckPaths gives its inputs one: one allocation, not one
// each).
func (s *Service) resolve(ctx context.Context, c Caller, in Input, slab *[]vocab.Limit) (resolved, error) {
	if err := in.Validate(); err != nil {
		return resolved{}, err
	}
	if err := c.Authorize(in.Org); err != nil {
		return resolved{}, err
	}
	org, err := s.org(ctx, in.Org)
	if err != nil {
		return resolved{}, err
	}
	req := quota.Request{Org: in.Org, Metric: "requests", Cost: 1, Mode: org.Org.Mode,
		AnchorDay: org.Org.BillingAnchorDay, NoLease: org.Leases == tenants.LeasesOff,
		Precise: org.SlidingWindows == tenants.WindowsPrecise}
	if in.Metric != nil {
		req.Metric = *in.Metric
	}
	if in.Cost != nil {
		req.Cost = *in.Cost
	}
	if in.Costs != nil { // several metrics: the first by name is Metric, the rest More
		ms := sortedMetrics(in.Costs)
		req.Metric, req.Cost = ms[0], in.Costs[ms[0]]
		for _, m := range ms[1:] {
			req.More = append(req.More, quota.MetricCost{Metric: m, Cost: in.Costs[m]})
		}
	}
	if err := org.Metrics.Check(req.Metric); err != nil {
		return resolved{}, err // *tenants.UnknownMetricError: names the org's metrics
	}
	for _, m := range req.More {
		if err := org.Metrics.Check(m.Metric); err != nil {
			return resolved{}, err
		}
	}
	if in.IdempotencyKey != nil {
		req.IdempotencyKey = *in.IdempotencyKey
	}
	if in.Team != nil {
		req.Team = *in.Team
	}
	user, err := s.user(ctx, org, in.User, &req)
	if err != nil {
		return resolved{}, err
	}
	var team tenants.Team
	var userLimits []vocab.Limit
	if req.Team != "" {
		var ok bool
		if team, ok = org.Teams[req.Team]; !ok {
			return resolved{}, derrors.E(derrors.NotFound, fmt.Sprintf("team %s of org %s not found", vocab.Quote(req.Team), vocab.Quote(in.Org)), nil)
		}
		if req.Unregistered && tenants.RefusesUnknownUsers(org.Org, team) {
			return resolved{}, unknownUserRefused(req.User, req.Team)
		}
		if req.User != "" {
			userLimits = team.UserLimits // normalized by the store, as MergeLimits's result would be
			if len(user.Limits) > 0 {
				userLimits = tenants.MergeLimits(team.UserLimits, user.Limits)
			}
		}
	}
	r := resolved{mode: org.Org.Mode}
	r.route = org.Route()
	if len(org.Throttles) > 0 {
		r.throttle, _ = org.ThrottleOf(now(s.engine, r.route))
	}
	th := r.throttle
	n := len(org.Org.EffectiveLimits) + len(team.Limits) + len(userLimits)
	var buf []vocab.Limit
	if slab != nil && cap(*slab)-len(*slab) >= n {
		buf = (*slab)[len(*slab):len(*slab)]
	} else {
		buf = make([]vocab.Limit, 0, n)
	}
	req.Limits.Org, buf = limitsFor(buf, req.Metric, org.Org.EffectiveLimits, th)
	req.Limits.Team, buf = limitsFor(buf, req.Metric, team.Limits, th)
	req.Limits.User, buf = limitsFor(buf, req.Metric, userLimits, th)
	if slab != nil && cap(*slab)-len(*slab) >= n {
		*slab = (*slab)[:len(*slab)+len(buf)]
	}
	for i := range req.More {
		m := &req.More[i]
		m.Limits.Org, _ = limitsFor(nil, m.Metric, org.Org.EffectiveLimits, th)
		m.Limits.Team, _ = limitsFor(nil, m.Metric, team.Limits, th)
		m.Limits.User, _ = limitsFor(nil, m.Metric, userLimits, th)
	}
	caps, err := s.capacitiesOf(ctx)
	if err != nil {
		return resolved{}, err
	}
	drawCapacities(&req, caps, org, team, th)
	if len(org.Rates) > 0 { // money: the rates, and spend's limits at each level
		r.price.rates = org.Rates
		r.price.limits.Org, _ = limitsFor(nil, tenants.SpendMetric, org.Org.EffectiveLimits, th)
		r.price.limits.Team, _ = limitsFor(nil, tenants.SpendMetric, team.Limits, th)
		r.price.limits.User, _ = limitsFor(nil, tenants.SpendMetric, userLimits, th)
	}
	r.req = req
	return r, nil
}

// user resolves the check's user (nil: none) into req: its team when the check names
// none, and whether the org's bound on unregistered users applies. A registered user
// checked under another team, or an unregistered one without a team, is Invalid.
func (s *Service) user(ctx context.Context, org tenants.ResolvedOrg, id *string, req *quota.Request) (tenants.ResolvedUser, error) {
	if id == nil {
		return tenants.ResolvedUser{}, nil
	}
	req.User = *id
	user, err := s.cache.User(ctx, org, req.User)
	if err != nil {
		return user, derrors.E(derrors.Unavailable, "the tenancy store is unavailable; retry shortly", err)
	}
	switch {
	case user.Registered && req.Team == "":
		req.Team = user.TeamID
	case user.Registered && req.Team != user.TeamID:
		return user, derrors.Field("team", fmt.Sprintf("user %s is registered in team %s", vocab.Quote(req.User), vocab.Quote(user.TeamID)))
	case !user.Registered && req.Team == "":
		return user, derrors.Field("team", fmt.Sprintf("user %s is not registered: name its team", vocab.Quote(req.User)))
	}
	req.Unregistered = !user.Registered
	return user, nil
}

// unknownUserRefused refuses a check naming user, not registered, under team, which
// (or whose org) refuses unknown users: a rule, not a malformed field, so it is
// Unprocessable, which every transport answers as a check it cannot decide (HTTP 422,
// gRPC a descriptor that names no check of the org).
func unknownUserRefused(user, team string) error {
	msg := fmt.Sprintf("user %s is not registered in team %s, which refuses unknown users; nothing was counted. Register the user, or name a registered one", vocab.Quote(user), vocab.Quote(team))
	return derrors.E(derrors.Unprocessable, msg, nil, derrors.FieldError{Field: "user", Message: msg})
}

// limitsFor appends the limits of metric in ls, throttled by th (a bucket's rate and
// burst alike), to buf and returns them (nil when there are none) and the grown buf. A
// check's three levels share one buf: one allocation. The zero th changes nothing.
func limitsFor(buf []vocab.Limit, metric string, ls []vocab.Limit, th tenants.Throttle) ([]vocab.Limit, []vocab.Limit) {
	start := len(buf)
	for _, l := range ls {
		if l.Metric == metric {
			// min: a limit stored above vocab.MaxUnits before the bound (old data) is
			// checked as MaxUnits, never refused on every check
			t := vocab.Limit{Window: l.Window, Limit: min(th.Apply(l.Window, l.Limit), vocab.MaxUnits)}
			if l.Bucket() {
				// a throttle scales a bucket's size with its rate; it stays a bucket
				t.Burst = max(min(th.Apply(l.Window, l.Burst), vocab.MaxUnits), 1)
			}
			buf = append(buf, t)
		}
	}
	if len(buf) == start {
		return nil, buf
	}
	return buf[start:len(buf):len(buf)], buf
}

// retryAfterSeconds is a denied check's Retry-After in whole seconds, rounded up.
func retryAfterSeconds(res vocab.Result) int64 {
	return int64(math.Ceil(res.RetryAfter.Seconds()))
}

// warning is the warning a warn-mode org's answer carries when the check would have
// been denied; "" otherwise.
func warning(res vocab.Result, mode vocab.Mode) string {
	if mode != vocab.Warn || !res.Allowed || res.WouldBlock == nil {
		return ""
	}
	w := res.WouldBlock
	return fmt.Sprintf("over quota at %s %s (%s); allowed because the org is in warn mode", w.Level, vocab.Quote(w.ID), w.Window)
}

// RateLimit is what the RateLimit-Limit, -Remaining and -Reset headers say of a
// decision: the limit of one level and window, what is left of it (never below 0)
// and in how many seconds it resets.
type RateLimit struct {
	Level     vocab.LevelStatus // its Metric is always set
	Limit     int64
	Remaining int64
	Reset     int64
}

// tightest describes the tightest level and window of an allowed check: the least
// remaining, then the soonest reset. A denied check is described by the level and
// window that refused it, and its Reset is its Retry-After: when a retry of the same
// cost can succeed (a sliding window frees units gradually, so the end of its
// current bucket, its ResetAt, is too early); a denial that can never pass (no
// Retry-After: a cost above a token bucket's burst) keeps that level's own reset, when
// the bucket is full again. ok is false when no level has a limit.
// metric is the metric of levels that do not name theirs.
func tightest(res vocab.Result, now time.Time, metric string) (rl RateLimit, ok bool) {
	if len(res.Levels) == 0 {
		return RateLimit{}, false
	}
	t := res.Levels[0]
	for _, l := range res.Levels[1:] {
		if l.Remaining < t.Remaining || (l.Remaining == t.Remaining && l.ResetAt.Before(t.ResetAt)) {
			t = l
		}
	}
	reset := int64(math.Ceil(t.ResetAt.Sub(now).Seconds()))
	if b := res.BlockedAt; !res.Allowed && b != nil {
		for _, l := range res.Levels {
			if l.Level == b.Level && l.ID == b.ID && l.Window == b.Window && (b.Metric == "" || l.Metric == "" || l.Metric == b.Metric) {
				t = l
				break
			}
		}
		if r := retryAfterSeconds(res); r > 0 {
			reset = r
		} else { // it can never pass (a cost above a bucket's burst): the limit's own reset
			reset = int64(math.Ceil(t.ResetAt.Sub(now).Seconds()))
		}
	}
	if t.Metric == "" {
		t.Metric = metric
	}
	return RateLimit{Level: t, Limit: t.Limit, Remaining: max(t.Remaining, 0), Reset: max(reset, 0)}, true
}
