package httpapi

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/httpapi/problem"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Checker decides checks on the Redis an org's route names. *quota.Router satisfies it.
type Checker interface {
	Check(ctx context.Context, route quota.Route, req quota.Request) (quota.Result, quota.Outcome, error)
	CheckBatch(ctx context.Context, routes []quota.Route, reqs []quota.Request) ([]quota.Result, []quota.Outcome, []error)
}

// MaxBatch is the most checks one /v1/check/batch may carry.
const MaxBatch = 100

var idempotencyPattern = regexp.MustCompile(`^[A-Za-z0-9._:@-]{8,128}$`)

// The check routes are not validated against the spec (hot path), so the handler
// checks here everything the spec says of a CheckRequest.
func validateCheck(in api.CheckRequest) error {
	idMsg := "must match " + "^[a-zA-Z0-9][a-zA-Z0-9._:@-]{0,127}$"
	switch {
	case !tenants.ValidID(in.Org):
		return derrors.Field("org", idMsg)
	case in.Team != nil && !tenants.ValidID(*in.Team):
		return derrors.Field("team", idMsg)
	case in.User != nil && !tenants.ValidID(*in.User):
		return derrors.Field("user", idMsg)
	case in.Metric != nil && !tenants.ValidID(*in.Metric):
		return derrors.Field("metric", idMsg)
	case in.Cost != nil && (*in.Cost < 0 || *in.Cost > quota.MaxValue):
		return derrors.Field("cost", fmt.Sprintf("must be 0 to %d", quota.MaxValue))
	case in.IdempotencyKey != nil && !idempotencyPattern.MatchString(*in.IdempotencyKey):
		return derrors.Field("idempotency_key", "must be 8 to 128 characters of A-Z a-z 0-9 . _ : @ -")
	}
	return nil
}

// limitsFor appends the limits of metric in ls, throttled by th, to buf and returns
// them (nil when there are none) and the grown buf. A check's three levels share one
// buf: one allocation. The zero th changes nothing.
func limitsFor(buf []quota.Limit, metric string, ls []tenants.Limit, th tenants.Throttle) ([]quota.Limit, []quota.Limit) {
	start := len(buf)
	for _, l := range ls {
		if l.Metric == metric {
			buf = append(buf, quota.Limit{Window: quota.Window(l.Window), Limit: th.Apply(l.Window, l.Limit)})
		}
	}
	if len(buf) == start {
		return nil, buf
	}
	return buf[start:len(buf):len(buf)], buf
}

// checkAnswer is what a check's answer says besides the engine's result: the org's
// mode, and the throttle its limits were multiplied by (PPM 0: none).
type checkAnswer struct {
	mode     tenants.Mode
	throttle tenants.Throttle
}

// resolveCheck authorizes a check and resolves its org, team, user and their limits
// from the cache.
func (s *Server) resolveCheck(ctx context.Context, p principal, in api.CheckRequest) (quota.Request, quota.Route, checkAnswer, error) {
	req, org, th, cerr := s.resolveRequest(ctx, p, in)
	if cerr != nil {
		return req, quota.Route{}, checkAnswer{}, cerr
	}
	route := quota.Route{Pool: org.Pool, RedisURL: org.Org.RedisURL, FailMode: quota.FailMode(org.FailMode), Plan: org.Org.PlanID}
	return req, route, checkAnswer{mode: org.Org.Mode, throttle: th}, nil
}

// resolveRequest builds the check's request; its limits are throttled by the
// throttle the org is under at this moment (expired ones are ignored here, by the
// clock of the check, so a throttle lifts on every replica without any change).
func (s *Server) resolveRequest(ctx context.Context, p principal, in api.CheckRequest) (quota.Request, tenants.ResolvedOrg, tenants.Throttle, error) {
	var none tenants.ResolvedOrg
	var th tenants.Throttle
	if e := validateCheck(in); e != nil {
		return quota.Request{}, none, th, e
	}
	if !p.operator {
		if p.key.OrgID != in.Org {
			return quota.Request{}, none, th, derrors.E(derrors.NotFound, fmt.Sprintf("org %q not found", in.Org), nil)
		}
		if !p.key.HasScope(tenants.ScopeCheck) {
			return quota.Request{}, none, th, derrors.E(derrors.Forbidden, "this key lacks the scope this operation needs: check", nil)
		}
	}
	org, err := s.cache.Org(ctx, in.Org)
	if errors.Is(err, tenants.ErrNotFound) {
		return quota.Request{}, none, th, derrors.E(derrors.NotFound, fmt.Sprintf("org %q not found", in.Org), nil)
	}
	if err != nil {
		return quota.Request{}, none, th, derrors.E(derrors.Unavailable, "the tenancy store is unavailable and the org is not cached; retry shortly", err)
	}
	req := quota.Request{Org: in.Org, Metric: "requests", Cost: 1, Mode: quota.Mode(org.Org.Mode),
		AnchorDay: org.Org.BillingAnchorDay, NoLease: org.Leases == tenants.LeasesOff}
	if in.Metric != nil {
		req.Metric = *in.Metric
	}
	if err := org.Metrics.Check(req.Metric); err != nil {
		return quota.Request{}, none, th, err // *tenants.UnknownMetricError: 422 naming the org's metrics
	}
	if in.Cost != nil {
		req.Cost = *in.Cost
	}
	if in.IdempotencyKey != nil {
		req.IdempotencyKey = *in.IdempotencyKey
	}
	if in.Team != nil {
		req.Team = *in.Team
	}
	var user tenants.ResolvedUser
	if in.User != nil {
		req.User = *in.User
		if user, err = s.cache.User(ctx, org, req.User); err != nil {
			return quota.Request{}, none, th, derrors.E(derrors.Unavailable, "the tenancy store is unavailable; retry shortly", err)
		}
		switch {
		case user.Registered && req.Team == "":
			req.Team = user.TeamID
		case user.Registered && req.Team != user.TeamID:
			return quota.Request{}, none, th, derrors.Field("team", fmt.Sprintf("user %q is registered in team %q", req.User, user.TeamID))
		case !user.Registered && req.Team == "":
			return quota.Request{}, none, th, derrors.Field("team", fmt.Sprintf("user %q is not registered: name its team", req.User))
		}
	}
	var team tenants.Team
	var userLimits []tenants.Limit
	if req.Team != "" {
		var ok bool
		if team, ok = org.Teams[req.Team]; !ok {
			return quota.Request{}, none, th, derrors.E(derrors.NotFound, fmt.Sprintf("team %q of org %q not found", req.Team, in.Org), nil)
		}
		if req.User != "" {
			userLimits = team.UserLimits // normalized by the store, as MergeLimits's result would be
			if len(user.Limits) > 0 {
				userLimits = tenants.MergeLimits(team.UserLimits, user.Limits)
			}
		}
	}
	if len(org.Throttles) > 0 {
		th, _ = org.ThrottleOf(time.Now())
	}
	buf := make([]quota.Limit, 0, len(org.Org.EffectiveLimits)+len(team.Limits)+len(userLimits))
	req.Limits.Org, buf = limitsFor(buf, req.Metric, org.Org.EffectiveLimits, th)
	req.Limits.Team, buf = limitsFor(buf, req.Metric, team.Limits, th)
	req.Limits.User, _ = limitsFor(buf, req.Metric, userLimits, th)
	return req, org, th, nil
}

func fromResult(res quota.Result, oc quota.Outcome, ans checkAnswer) api.CheckResult {
	return fromResultInto(make([]api.LevelStatus, len(res.Levels)), res, oc, ans)
}

// fromResultInto is fromResult with the levels written into levels, which must hold
// len(res.Levels): /v1/check reuses them from a pool.
func fromResultInto(levels []api.LevelStatus, res quota.Result, oc quota.Outcome, ans checkAnswer) api.CheckResult {
	mode := ans.mode
	out := api.CheckResult{Allowed: res.Allowed, Mode: api.Mode(mode), Levels: levels[:len(res.Levels)]}
	if th := ans.throttle; th.PPM > 0 {
		out.Throttled = &api.Throttled{Factor: th.Factor(), ExpiresAt: th.ExpiresAt.UTC(), Scope: api.ThrottleScope(th.Scope)}
	}
	if oc.Degraded {
		t := true
		out.Degraded = &t
	}
	for i, l := range res.Levels {
		out.Levels[i] = api.LevelStatus{Level: api.Level(l.Level), Id: l.ID, Window: api.Window(l.Window), Limit: l.Limit,
			Used: l.Used, Remaining: l.Remaining, ResetAt: l.ResetAt.UTC()}
	}
	ref := func(b *quota.Blocked) *api.LevelRef {
		if b == nil {
			return nil
		}
		return &api.LevelRef{Level: api.Level(b.Level), Id: b.ID, Window: api.Window(b.Window)}
	}
	if !res.Allowed {
		out.BlockedAt = ref(res.BlockedAt)
		secs := int64(math.Ceil(res.RetryAfter.Seconds()))
		out.RetryAfterSeconds = &secs
	}
	if res.Allowed && res.WouldBlock != nil {
		out.WouldBlock = ref(res.WouldBlock)
		if mode == tenants.Warn {
			w := fmt.Sprintf("over quota at %s %q (%s); allowed because the org is in warn mode", res.WouldBlock.Level, res.WouldBlock.ID, res.WouldBlock.Window)
			out.Warning = &w
		}
	}
	if res.Replayed {
		t := true
		out.Replayed = &t
	}
	if res.Leased {
		out.Leased = &leasedTrue
	}
	return out
}

// setRateLimitHeaders describes the tightest level and window of an allowed check:
// the least remaining, then the soonest reset. A denied check describes the level and
// window that refused it, and its RateLimit-Reset is its Retry-After: when a retry of
// the same cost can succeed (a sliding window frees units gradually, so the end of its
// current bucket, its reset_at, is too early).
func setRateLimitHeaders(h http.Header, res api.CheckResult, now time.Time) {
	if len(res.Levels) == 0 {
		return
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
			if l.Level == b.Level && l.Id == b.Id && l.Window == b.Window {
				t = l
				break
			}
		}
		if res.RetryAfterSeconds != nil {
			reset = *res.RetryAfterSeconds
		}
	}
	// Set verbatim: Header.Set would send "Ratelimit-Limit". Names are case-insensitive,
	// but the spelling of the IETF draft is what people grep for. The three values
	// share one backing array, each capped at its own element.
	v := []string{strconv.FormatInt(t.Limit, 10), strconv.FormatInt(max(t.Remaining, 0), 10), strconv.FormatInt(max(reset, 0), 10)}
	h["RateLimit-Limit"] = v[0:1:1]
	h["RateLimit-Remaining"] = v[1:2:2]
	h["RateLimit-Reset"] = v[2:3:3]
}

// leasedTrue is every leased answer's Leased: it is only read.
var leasedTrue = true

// levelsPool holds the levels of /v1/check answers between requests.
var levelsPool = sync.Pool{New: func() any { l := make([]api.LevelStatus, 0, 8); return &l }}

// idempotencyHeader puts the key of the Idempotency-Key header (a structured-field
// string, "key", as the IETF draft writes it, or the bare key) into in, unless the
// body already gives a different one.
func idempotencyHeader(h *string, in *api.CheckRequest) error {
	if h == nil {
		return nil
	}
	k := *h
	if len(k) >= 2 && k[0] == '"' && k[len(k)-1] == '"' {
		k = k[1 : len(k)-1]
	}
	if !idempotencyPattern.MatchString(k) {
		return derrors.Field("Idempotency-Key", "must be 8 to 128 characters of A-Z a-z 0-9 . _ : @ -, bare or in double quotes")
	}
	if in.IdempotencyKey != nil && *in.IdempotencyKey != k {
		msg := "the Idempotency-Key header and the idempotency_key field give different keys; give one, or the same in both"
		return invalid(msg, FieldError{Field: "Idempotency-Key", Message: msg}, FieldError{Field: "idempotency_key", Message: msg})
	}
	in.IdempotencyKey = &k
	return nil
}

// Check handles POST /v1/check.
func (s *Server) Check(w http.ResponseWriter, r *http.Request, params api.CheckParams) {
	var in api.CheckRequest
	if !decodeCheck(w, r, &in) {
		return
	}
	if err := idempotencyHeader(params.IdempotencyKey, &in); err != nil {
		refuse(w, r, err)
		return
	}
	req, route, ans, cerr := s.resolveCheck(r.Context(), callerOf(r), in)
	if cerr == nil && s.checker == nil {
		cerr = errNoEngine
	}
	if cerr != nil {
		s.fail(w, r, cerr)
		return
	}
	res, oc, err := s.checker.Check(r.Context(), route, req)
	if err != nil {
		s.fail(w, r, engineError(err)) // logged there when it is not the caller's
		return
	}
	lp := levelsPool.Get().(*[]api.LevelStatus)
	if cap(*lp) < len(res.Levels) {
		*lp = make([]api.LevelStatus, len(res.Levels))
	}
	out := fromResultInto((*lp)[:len(res.Levels)], res, oc, ans)
	defer func() {
		clear(out.Levels) // no ids kept alive in the pool
		if cap(*lp) <= 64 {
			levelsPool.Put(lp)
		}
	}()
	setRateLimitHeaders(w.Header(), out, time.Now())
	status := http.StatusOK
	if !out.Allowed {
		status = problem.Status(derrors.RateLimited) // a denial answers as the rate-limited kind
		w.Header().Set("Retry-After", strconv.FormatInt(*out.RetryAfterSeconds, 10))
	}
	if out.Warning != nil {
		w.Header().Set("Quotaplane-Warning", *out.Warning)
	}
	writeCheckResult(w, status, &out)
}

// CheckBatch handles POST /v1/check/batch: each check decided on its own, in order,
// all sent to Redis in one pipeline.
func (s *Server) CheckBatch(w http.ResponseWriter, r *http.Request) {
	var in api.BatchCheckRequest
	if !decodeBatch(w, r, &in) {
		return
	}
	if r.Header.Get("Idempotency-Key") != "" {
		msg := "applies to POST /v1/check; give each check of a batch its own idempotency_key"
		refuse(w, r, invalid("Idempotency-Key: "+msg, FieldError{Field: "Idempotency-Key", Message: msg}))
		return
	}
	if n := len(in.Checks); n < 1 || n > MaxBatch {
		refuse(w, r, invalid(fmt.Sprintf("checks: must hold 1 to %d checks, not %d", MaxBatch, n),
			FieldError{Field: "checks", Message: fmt.Sprintf("must hold 1 to %d checks", MaxBatch)}))
		return
	}
	if s.checker == nil {
		s.fail(w, r, errNoEngine)
		return
	}
	p := callerOf(r)
	items := make([]api.BatchCheckItem, len(in.Checks))
	reqs := make([]quota.Request, 0, len(in.Checks))
	routes := make([]quota.Route, 0, len(in.Checks))
	answers := make([]checkAnswer, 0, len(in.Checks))
	slot := make([]int, 0, len(in.Checks))
	for i, c := range in.Checks {
		req, route, ans, cerr := s.resolveCheck(r.Context(), p, c)
		if cerr != nil {
			_ = items[i].FromProblem(itemProblem(cerr))
			continue
		}
		reqs, routes, answers, slot = append(reqs, req), append(routes, route), append(answers, ans), append(slot, i)
	}
	if len(reqs) > 0 {
		results, outcomes, errs := s.checker.CheckBatch(r.Context(), routes, reqs)
		for j, i := range slot {
			if errs[j] != nil {
				if k := derrors.KindOf(errs[j]); k == derrors.Unavailable || k == derrors.Internal {
					s.log.Warn("batch check not decided", "org", reqs[j].Org, "err", errs[j].Error())
				}
				_ = items[i].FromProblem(itemProblem(engineError(errs[j])))
				continue
			}
			out := fromResult(results[j], outcomes[j], answers[j])
			b := appendCheckResult(nil, &out)
			_ = items[i].UnmarshalJSON(b[:len(b)-1]) // the item's JSON, without the newline
		}
	}
	writeBatchResult(w, items)
}

// errNoEngine answers the checks of a server built without a quota engine.
var errNoEngine = derrors.E(derrors.Unavailable, "no quota engine is configured", nil)
