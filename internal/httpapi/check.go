package httpapi

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/problem"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// MaxBatch is the most checks one /v1/check/batch may carry.
const MaxBatch = 100

// toCheckInput converts the API's check to the check service's.
func toCheckInput(in api.CheckRequest) checks.Input {
	out := checks.Input{Org: in.Org, Team: in.Team, User: in.User, Metric: in.Metric, Cost: in.Cost, IdempotencyKey: in.IdempotencyKey}
	if in.Costs != nil {
		out.Costs = *in.Costs
		if out.Costs == nil { // "costs": null is given, and empty
			out.Costs = map[string]int64{}
		}
	}
	return out
}

// callerOfCheck is the check service's caller of a request.
func callerOfCheck(r *http.Request) checks.Caller {
	p := callerOf(r)
	return checks.Caller{Operator: p.operator, Key: p.key}
}

func fromDecision(d *checks.Decision) api.CheckResult {
	return fromDecisionInto(make([]api.LevelStatus, len(d.Result.Levels)), d)
}

// fromDecisionInto is fromDecision with the levels written into levels, which must
// hold len(d.Result.Levels): /v1/check reuses them from a pool.
func fromDecisionInto(levels []api.LevelStatus, d *checks.Decision) api.CheckResult {
	res := &d.Result
	out := api.CheckResult{Allowed: res.Allowed, Mode: d.Mode, Levels: levels[:len(res.Levels)]}
	if th := d.Throttle; th.PPM > 0 {
		out.Throttled = &api.Throttled{Factor: th.Factor(), ExpiresAt: th.ExpiresAt.UTC(), Scope: api.ThrottleScope(th.Scope)}
	}
	if d.Outcome.Degraded {
		t := true
		out.Degraded = &t
	}
	for i := range res.Levels {
		l := &res.Levels[i]
		out.Levels[i] = api.LevelStatus{Level: l.Level, Id: l.ID, Window: l.Window, Limit: l.Limit,
			Used: l.Used, Remaining: l.Remaining, ResetAt: l.ResetAt.UTC()}
		if l.Burst > 0 { // a token bucket
			out.Levels[i].Burst = &l.Burst
		}
		if d.Multi { // a multi-metric decision's levels name their metric
			out.Levels[i].Metric = &l.Metric
		}
	}
	ref := func(b *vocab.Blocked) *api.LevelRef {
		if b == nil {
			return nil
		}
		r := &api.LevelRef{Level: b.Level, Id: b.ID, Window: b.Window}
		if d.Multi || b.Level == vocab.LevelCapacity { // a capacity counts one metric: the answer names it
			r.Metric = &b.Metric
		}
		if b.FairShare {
			r.FairShare = &fairShareTrue
		}
		return r
	}
	if !res.Allowed {
		out.BlockedAt = ref(res.BlockedAt)
		if secs := d.RetryAfter; secs > 0 { // 0: it can never pass (a cost above a bucket's burst)
			out.RetryAfterSeconds = &secs
		}
		if v := d.Violated(); v != "" { // the draft's quota-exceeded member: the policy that refused it
			vp := []string{v}
			out.ViolatedPolicies = &vp
		}
	}
	if res.Allowed && res.WouldBlock != nil {
		out.WouldBlock = ref(res.WouldBlock)
		if d.Warning != "" {
			w := d.Warning
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

// setRetryAfter sets the Retry-After of a denied decision: none when it can never
// pass (its cost is above a token bucket's burst, RetryAfter 0), for no wait helps.
func setRetryAfter(h http.Header, d *checks.Decision) {
	if d.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(d.RetryAfter, 10))
	}
}

// setRateLimitHeaders sets the RateLimit header fields of the decision, as mode
// says: the legacy RateLimit-Limit, -Remaining and -Reset of draft-06, and the
// RateLimit-Policy and RateLimit fields of draft-ietf-httpapi-ratelimit-headers-11
// (internal/checks/headers.go says how they are named and filled).
func setRateLimitHeaders(h http.Header, d *checks.Decision, mode checks.HeaderMode) {
	if !d.HasRateLimit {
		return
	}
	t := d.RateLimit
	// Set verbatim: Header.Set would send "Ratelimit-Limit". Names are case-insensitive,
	// but the spelling of the IETF draft is what people grep for. The values are
	// written into one buffer and made one string, and share one backing array, each
	// capped at its own element: two allocations for all five (BenchmarkServerCheck).
	var buf [256]byte
	b := buf[:0]
	var end [5]int
	n := 0
	if mode.Legacy() {
		b = strconv.AppendInt(b, t.Limit, 10)
		end[0] = len(b)
		b = strconv.AppendInt(b, t.Remaining, 10)
		end[1] = len(b)
		b = strconv.AppendInt(b, t.Reset, 10)
		end[2] = len(b)
		n = 3
	}
	if mode.Draft() {
		b = checks.AppendPolicyField(b, d.Result.Levels, d.Metric)
		end[n] = len(b)
		b = checks.AppendLimitField(b, t)
		end[n+1] = len(b)
		n += 2
	}
	if n == 0 {
		return
	}
	all := string(b)
	v := make([]string, n)
	for i, from := 0, 0; i < n; i++ {
		v[i], from = all[from:end[i]], end[i]
	}
	if mode.Legacy() {
		h["RateLimit-Limit"] = v[0:1:1]
		h["RateLimit-Remaining"] = v[1:2:2]
		h["RateLimit-Reset"] = v[2:3:3]
		v = v[3:]
	}
	if mode.Draft() {
		h["RateLimit-Policy"] = v[0:1:1]
		h["RateLimit"] = v[1:2:2]
	}
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
	d, err := s.checks.Check(r.Context(), callerOfCheck(r), toCheckInput(in))
	if err != nil {
		s.fail(w, r, err) // logged there when it is not the caller's
		return
	}
	lp := levelsPool.Get().(*[]api.LevelStatus)
	if cap(*lp) < len(d.Result.Levels) {
		*lp = make([]api.LevelStatus, len(d.Result.Levels))
	}
	out := fromDecisionInto((*lp)[:len(d.Result.Levels)], &d)
	defer func() {
		clear(out.Levels) // no ids kept alive in the pool
		if cap(*lp) <= 64 {
			levelsPool.Put(lp)
		}
	}()
	setRateLimitHeaders(w.Header(), &d, s.headers)
	status := http.StatusOK
	if !out.Allowed {
		status = problem.Status(derrors.RateLimited) // a denial answers as the rate-limited kind
		setRetryAfter(w.Header(), &d)
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
	ins := make([]checks.Input, len(in.Checks))
	for i, c := range in.Checks {
		ins[i] = toCheckInput(c)
	}
	decided, err := s.checks.CheckBatch(r.Context(), callerOfCheck(r), ins)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if k := checks.TightestItem(decided); k >= 0 {
		setRateLimitHeaders(w.Header(), &decided[k].Decision, s.headers)
	}
	items := make([]api.BatchCheckItem, len(decided))
	for i := range decided {
		if decided[i].Err != nil {
			var q bytes.Buffer // as writeJSON would write it, <, > and & as they are
			_ = problem.Encoder(&q).Encode(itemProblem(decided[i].Err))
			_ = items[i].UnmarshalJSON(bytes.TrimSuffix(q.Bytes(), []byte("\n")))
			continue
		}
		out := fromDecision(&decided[i].Decision)
		b := appendCheckResult(nil, &out)
		_ = items[i].UnmarshalJSON(b[:len(b)-1]) // the item's JSON, without the newline
	}
	writeBatchResult(w, items)
}
