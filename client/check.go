package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// CheckRequest asks whether Cost units of Metric may be spent now by Org, Team and
// User, and if so counts them (POST /v1/check).
type CheckRequest struct {
	Org    string // required; must be the key's org
	Team   string // may be omitted for a registered user, or for an org-level check
	User   string // may be omitted for a team- or org-level check
	Metric string // "" is the API's default, "requests"
	// Cost is the units to consume; 0 is the API's default, 1. Set Query to consume
	// nothing and only read the levels (cost 0).
	Cost  int64
	Query bool
	// Costs names several metrics decided at once, all or nothing (API.md "Several
	// metrics in one decision"): {"requests": 1, "tokens": 1200}. It replaces Metric
	// and Cost (setting both is a 400); 1 to 16 metrics. With Query, each is sent as 0.
	Costs map[string]int64
	// IdempotencyKey makes a repeat of the check (8 to 128 of A-Z a-z 0-9 . _ : @ -)
	// answer the first decision again without counting; "" lets the client generate
	// one for this call, sent on each of its attempts. A query needs none.
	IdempotencyKey string
}

// checkBody is a CheckRequest as the API reads it.
type checkBody struct {
	Org            string           `json:"org"`
	Team           string           `json:"team,omitempty"`
	User           string           `json:"user,omitempty"`
	Metric         string           `json:"metric,omitempty"`
	Cost           *int64           `json:"cost,omitempty"`
	Costs          map[string]int64 `json:"costs,omitempty"`
	IdempotencyKey string           `json:"idempotency_key,omitempty"`
}

// body is the request as sent, with its idempotency key generated if it has none.
func (r CheckRequest) body() checkBody {
	b := checkBody{Org: r.Org, Team: r.Team, User: r.User, Metric: r.Metric, Costs: r.Costs, IdempotencyKey: r.IdempotencyKey}
	switch {
	case r.Query && r.Costs != nil:
		b.Costs = make(map[string]int64, len(r.Costs))
		for m := range r.Costs {
			b.Costs[m] = 0
		}
	case r.Costs != nil: // the costs say it all; a Cost too is the caller's 400
		if r.Cost != 0 {
			b.Cost = &r.Cost
		}
	case r.Query:
		zero := int64(0)
		b.Cost = &zero
	case r.Cost != 0:
		b.Cost = &r.Cost
	}
	if b.IdempotencyKey == "" && !r.Query {
		b.IdempotencyKey = NewIdempotencyKey()
	}
	return b
}

// Level is the state of one level and window of a check, after it.
type Level struct {
	Level  string `json:"level"` // org, team or user
	ID     string `json:"id"`
	Metric string `json:"metric,omitempty"` // the metric of this limit (a check of Costs has several)
	Window string `json:"window"`           // second, minute, hour, day, month or concurrent
	Limit  int64  `json:"limit"`
	// Burst is a token bucket's size (Limit is then its rate per Window, Remaining the
	// whole tokens in it now and ResetAt when it is full again); 0 for any other limit.
	Burst     int64     `json:"burst,omitempty"`
	Used      int64     `json:"used"`
	Remaining int64     `json:"remaining"`
	ResetAt   time.Time `json:"reset_at"`
}

// LevelRef names a level and window, and the metric of its limit.
type LevelRef struct {
	Level  string `json:"level"`
	ID     string `json:"id"`
	Metric string `json:"metric,omitempty"`
	Window string `json:"window"`
}

// is reports whether l is the level and window r names (and its metric, when both
// name one).
func (r *LevelRef) is(l Level) bool {
	return l.Level == r.Level && l.ID == r.ID && l.Window == r.Window && (r.Metric == "" || l.Metric == "" || l.Metric == r.Metric)
}

// RateLimit is what the RateLimit header fields of an answer say: the tightest level
// and window (on a denial, the one that refused, and Reset is the Retry-After). Read
// from the legacy RateLimit-Limit, -Remaining and -Reset when the answer has them,
// else from the draft-11 RateLimit field (Limit then from RateLimit-Policy); computed
// from the levels when the answer has neither.
type RateLimit struct {
	Limit     int64
	Remaining int64
	Reset     time.Duration
	// Policy names the limit as the draft-11 fields do ("user-minute"); "" when the
	// answer carried no RateLimit field.
	Policy string
}

// CheckResult is Quotaplane's decision of a check, or the fail policy's.
type CheckResult struct {
	Allowed bool
	Mode    string  // the org's mode: enforce, shadow or warn
	Levels  []Level // one per level and window that has a limit
	// Set when denied: the level and window that refused, and when the same check
	// may pass.
	BlockedAt  *LevelRef
	RetryAfter time.Duration
	RateLimit  RateLimit
	Replayed   bool      // the first decision of this idempotency key, counted then
	Degraded   bool      // decided without Redis, under the plan's fail mode
	WouldBlock *LevelRef // shadow and warn modes: the level that would have denied
	Warning    string    // warn mode
	// Policies is the answer's RateLimit-Policy field: one item per limit of the path
	// (nil without the field). ViolatedPolicies, when denied, names the policy that
	// refused (the draft's quota-exceeded member, from the body).
	Policies         []Policy
	ViolatedPolicies []string
	// IdempotencyKey is the key the check was sent with (the caller's or generated).
	IdempotencyKey string
	// NotDecided is set when Quotaplane did not decide and the client's FailPolicy
	// did (Allowed is its answer); Cause is why (wraps ErrUnavailable).
	NotDecided bool
	Cause      error
	// Leased is set when the check was decided in this process from a lease of its
	// path (WithLeases), with no request: Levels and RateLimit are then the lease's,
	// as it was taken, shared by the checks it admits (read them only).
	Leased bool
}

// checkAnswer is a CheckResult as the API writes it.
type checkAnswer struct {
	Allowed           bool      `json:"allowed"`
	Mode              string    `json:"mode"`
	Levels            []Level   `json:"levels"`
	BlockedAt         *LevelRef `json:"blocked_at"`
	RetryAfterSeconds *int64    `json:"retry_after_seconds"`
	Replayed          bool      `json:"replayed"`
	Degraded          bool      `json:"degraded"`
	WouldBlock        *LevelRef `json:"would_block"`
	Warning           string    `json:"warning"`
	ViolatedPolicies  []string  `json:"violated-policies"`
}

func (a *checkAnswer) result(key string, now time.Time) *CheckResult {
	res := &CheckResult{Allowed: a.Allowed, Mode: a.Mode, Levels: a.Levels, BlockedAt: a.BlockedAt,
		Replayed: a.Replayed, Degraded: a.Degraded, WouldBlock: a.WouldBlock, Warning: a.Warning, IdempotencyKey: key,
		ViolatedPolicies: a.ViolatedPolicies}
	if a.RetryAfterSeconds != nil {
		res.RetryAfter = time.Duration(*a.RetryAfterSeconds) * time.Second
	}
	res.RateLimit = tightest(res.Levels, res.Allowed, res.BlockedAt, res.RetryAfter, now)
	return res
}

// tightest is the RateLimit of levels as the API computes its headers: of an allowed
// check, the level and window with the least remaining, then the soonest reset; of a
// denied one, the level and window that refused it, with Reset its retry-after.
func tightest(levels []Level, allowed bool, blocked *LevelRef, retryAfter time.Duration, now time.Time) RateLimit {
	if len(levels) == 0 {
		return RateLimit{}
	}
	t := levels[0]
	for _, l := range levels[1:] {
		if l.Remaining < t.Remaining || (l.Remaining == t.Remaining && l.ResetAt.Before(t.ResetAt)) {
			t = l
		}
	}
	reset := time.Duration(math.Ceil(t.ResetAt.Sub(now).Seconds())) * time.Second
	if !allowed && blocked != nil {
		for _, l := range levels {
			if blocked.is(l) {
				t = l
				break
			}
		}
		reset = retryAfter
	}
	return RateLimit{Limit: t.Limit, Remaining: max(t.Remaining, 0), Reset: max(reset, 0)}
}

// headerRateLimit reads the RateLimit header fields: the legacy RateLimit-Limit,
// -Remaining and -Reset when present, else the draft-11 RateLimit (and its policy's
// q); Policy and policies from the draft's fields when present. ok is false without
// either generation.
func headerRateLimit(h http.Header) (RateLimit, []Policy, bool) {
	draft, policies, hasDraft := draftRateLimit(h)
	limit, err1 := strconv.ParseInt(h.Get("RateLimit-Limit"), 10, 64)
	remaining, err2 := strconv.ParseInt(h.Get("RateLimit-Remaining"), 10, 64)
	if err1 != nil || err2 != nil {
		return draft, policies, hasDraft
	}
	return RateLimit{Limit: limit, Remaining: remaining, Reset: seconds(h.Get("RateLimit-Reset")), Policy: draft.Policy}, policies, true
}

// Check asks Quotaplane whether req may go ahead and counts it if so. A denial is a
// result (Allowed false, 429 on the wire), not an error. Errors: a *Error for an
// answer that decided nothing (400, 401, 403, 404, 422), or, when Quotaplane could
// not decide and the client has no FailPolicy, an error wrapping ErrUnavailable.
//
// With WithLeases, a check of a hot path may be decided from its lease (Leased);
// with WithBatching, the checks sent at about the same time go out in one request.
func (c *Client) Check(ctx context.Context, req CheckRequest) (*CheckResult, error) {
	if c.leases != nil {
		if res, ok := c.leases.admit(ctx, &req); ok {
			if c.hooks.OnDecision != nil {
				c.decided(ctx, DecisionInfo{Op: "check", Request: req, Allowed: true, Mode: res.Mode, Leased: true})
			}
			return res, nil
		}
	}
	if c.batch != nil {
		return c.batch.check(ctx, req)
	}
	return c.check(ctx, req)
}

// check is one POST /v1/check.
func (c *Client) check(ctx context.Context, req CheckRequest) (*CheckResult, error) {
	body := req.body()
	r, err := c.do(ctx, c.budget, http.MethodPost, "/v1/check", body)
	if err != nil {
		return c.undecided(ctx, "check", req, body.IdempotencyKey, err)
	}
	if r.status != http.StatusOK && r.status != http.StatusTooManyRequests {
		return nil, errorOf(r)
	}
	var a checkAnswer
	if err := decode(r, &a); err != nil {
		return nil, err
	}
	res := a.result(body.IdempotencyKey, time.Now())
	rl, policies, ok := headerRateLimit(r.header)
	if ok {
		res.RateLimit = rl
	}
	res.Policies = policies
	if ra := r.header.Get("Retry-After"); ra != "" && !res.Allowed {
		res.RetryAfter = retryAfter(ra)
	}
	if w := r.header.Get("Quotaplane-Warning"); w != "" && res.Warning == "" {
		res.Warning = w
	}
	c.decided(ctx, DecisionInfo{Op: "check", Request: req, Allowed: res.Allowed, Mode: res.Mode, Warning: res.Warning})
	return res, nil
}

// undecided answers a check Quotaplane did not decide: the fail policy's result, or
// err without one, or when err is not ErrUnavailable (the caller gave up, a
// configuration error).
func (c *Client) undecided(ctx context.Context, op string, req CheckRequest, key string, err error) (*CheckResult, error) {
	if c.policy == nil || !errors.Is(err, ErrUnavailable) {
		return nil, err
	}
	allowed := c.policy(ctx, req, err)
	c.decided(ctx, DecisionInfo{Op: op, Request: req, Allowed: allowed, NotDecided: true, Cause: err})
	return &CheckResult{Allowed: allowed, IdempotencyKey: key, NotDecided: true, Cause: err}, nil
}

// BatchItem is the outcome of one check of a batch: its Result, or Err when the API
// refused the item (a 4xx: invalid, an unknown metric; never a denial, which is a
// Result with Allowed false). An item the API could not decide (a 5xx: Redis down
// under a plan that fails closed) goes to the client's FailPolicy like a whole check
// (a Result with NotDecided set); without a policy it is an Err too.
type BatchItem struct {
	Result *CheckResult
	Err    *Error
}

// CheckBatch decides up to 100 checks in one call (POST /v1/check/batch), each on its
// own, and returns one item per check, in order. Each check without an idempotency key
// gets one, so a retried batch counts nothing twice. When Quotaplane cannot be reached
// the client's FailPolicy decides every check (without one, the error wraps
// ErrUnavailable); a *Error is an answer refusing the batch as a whole (400, 401).
// The caller's cancellation and configuration errors are returned as by Check.
func (c *Client) CheckBatch(ctx context.Context, reqs []CheckRequest) ([]BatchItem, error) {
	in := struct {
		Checks []checkBody `json:"checks"`
	}{Checks: make([]checkBody, len(reqs))}
	for i, req := range reqs {
		in.Checks[i] = req.body()
	}
	r, err := c.do(ctx, c.budget, http.MethodPost, "/v1/check/batch", in)
	if err != nil {
		if c.policy == nil || !errors.Is(err, ErrUnavailable) {
			return nil, err
		}
		items := make([]BatchItem, len(reqs))
		for i, req := range reqs {
			items[i].Result, _ = c.undecided(ctx, "batch", req, in.Checks[i].IdempotencyKey, err)
		}
		return items, nil
	}
	if r.status != http.StatusOK {
		return nil, errorOf(r)
	}
	answers, err := batchAnswers(r, len(reqs))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	items := make([]BatchItem, len(reqs))
	for i, a := range answers {
		if e := a.problem; e != nil {
			if e.StatusCode >= 500 && c.policy != nil { // not decided: as a check would be
				items[i].Result, _ = c.undecided(ctx, "batch", reqs[i], in.Checks[i].IdempotencyKey,
					fmt.Errorf("%w: check %d of the batch: %w", ErrUnavailable, i, e))
				continue
			}
			items[i].Err = e
			continue
		}
		items[i].Result = a.answer.result(in.Checks[i].IdempotencyKey, now)
		c.decided(ctx, DecisionInfo{Op: "batch", Request: reqs[i], Allowed: items[i].Result.Allowed, Mode: items[i].Result.Mode,
			Warning: items[i].Result.Warning})
	}
	return items, nil
}

// batchAnswer is one result of a batch: an answer, or the problem refusing it.
type batchAnswer struct {
	answer  checkAnswer
	problem *Error
}

// batchAnswers reads the n results of a batch's 200 answer.
func batchAnswers(r *reply, n int) ([]batchAnswer, error) {
	var out struct {
		Results []json.RawMessage `json:"results"`
	}
	if err := decode(r, &out); err != nil {
		return nil, err
	}
	if len(out.Results) != n {
		return nil, fmt.Errorf("quotaplane client: %d results for %d checks", len(out.Results), n)
	}
	answers := make([]batchAnswer, n)
	for i, raw := range out.Results {
		var a struct {
			checkAnswer
			Status int `json:"status"`
		}
		if err := json.Unmarshal(raw, &a); err != nil {
			return nil, fmt.Errorf("quotaplane client: decode result %d: %w", i, err)
		}
		if a.Status != 0 { // a problem document
			answers[i].problem = errorOf(&reply{status: a.Status, header: http.Header{}, body: raw})
			continue
		}
		answers[i].answer = a.checkAnswer
	}
	return answers, nil
}
