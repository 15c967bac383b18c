package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/problem"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Checker decides checks on the Redis an org's route names. *quota.Engines satisfies it.
type Checker interface {
	Check(ctx context.Context, route vocab.Route, req quota.Request) (quota.Result, quota.Outcome, error)
	CheckBatch(ctx context.Context, routes []vocab.Route, reqs []quota.Request) ([]quota.Result, []quota.Outcome, []error)
	// Now is the time route's checks are decided at (the engine's Redis time), which
	// judges a throttle's expiry and the seconds until a reset.
	Now(route vocab.Route) time.Time
}

// MaxBatch is the most checks one /v1/check/batch may carry.
const MaxBatch = 100

// resolveCheck authorizes a check and resolves its org, team, user and their limits
// from the cache: checks.Resolver, shared with the gRPC rate limit service.
func (s *Server) resolveCheck(ctx context.Context, p principal, in api.CheckRequest) (quota.Request, vocab.Route, checks.Answer, error) {
	return checks.Resolver{Cache: s.cache, Clock: s.checker}.Resolve(ctx, checks.Caller{Operator: p.operator, Key: p.key}, toCheckInput(in))
}

// toCheckInput converts the API's check to the resolver's.
func toCheckInput(in api.CheckRequest) checks.Input {
	return checks.Input{Org: in.Org, Team: in.Team, User: in.User, Metric: in.Metric, Cost: in.Cost, IdempotencyKey: in.IdempotencyKey}
}

func fromResult(res quota.Result, oc quota.Outcome, ans checks.Answer) api.CheckResult {
	return fromResultInto(make([]api.LevelStatus, len(res.Levels)), res, oc, ans)
}

// fromResultInto is fromResult with the levels written into levels, which must hold
// len(res.Levels): /v1/check reuses them from a pool.
func fromResultInto(levels []api.LevelStatus, res quota.Result, oc quota.Outcome, ans checks.Answer) api.CheckResult {
	out := api.CheckResult{Allowed: res.Allowed, Mode: api.Mode(ans.Mode), Levels: levels[:len(res.Levels)]}
	if th := ans.Throttle; th.PPM > 0 {
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
		secs := checks.RetryAfterSeconds(res)
		out.RetryAfterSeconds = &secs
	}
	if res.Allowed && res.WouldBlock != nil {
		out.WouldBlock = ref(res.WouldBlock)
		if w := checks.Warning(res, ans.Mode); w != "" {
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

// setRateLimitHeaders sets RateLimit-Limit, -Remaining and -Reset as checks.Tightest
// describes the decision.
func setRateLimitHeaders(h http.Header, res quota.Result, now time.Time) {
	t, ok := checks.Tightest(res, now)
	if !ok {
		return
	}
	// Set verbatim: Header.Set would send "Ratelimit-Limit". Names are case-insensitive,
	// but the spelling of the IETF draft is what people grep for. The three values
	// share one backing array, each capped at its own element.
	v := []string{strconv.FormatInt(t.Limit, 10), strconv.FormatInt(t.Remaining, 10), strconv.FormatInt(t.Reset, 10)}
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
	if !checks.IdempotencyPattern.MatchString(k) {
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
	setRateLimitHeaders(w.Header(), res, checks.Now(s.checker, route))
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
	routes := make([]vocab.Route, 0, len(in.Checks))
	answers := make([]checks.Answer, 0, len(in.Checks))
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
