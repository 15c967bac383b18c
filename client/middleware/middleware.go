// Package middleware puts a Quotaplane check in front of net/http handlers. Check and
// Reserve return the func(http.Handler) http.Handler that chi's Use takes and that
// wraps any handler of the standard ServeMux.
//
// Check maps each request to a check (a CheckFunc). A denied check answers 429 with
// Retry-After, RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset and a problem
// document (application/problem+json) saying which level refused and when to retry;
// an allowed one sets the RateLimit-* headers and calls the handler.
//
// Reserve is for work whose cost is known only after it (LLM tokens): it reserves an
// amount before the handler, and commits, after it, what the handler reported with
// ReportUsage (the whole amount if it reported nothing), giving the rest back.
//
// Concurrency holds a slot of a concurrent limit (API.md "Concurrency limits") for as
// long as the handler runs: it extends the reservation while the handler streams, and
// gives it back the moment the handler returns or panics, or the request's context
// ends (the client went away).
package middleware

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/quotaplane/quotaplane/client"
)

// A CheckFunc maps a request to the check it needs: typically the org is the
// service's, the user and team come from the request's authentication, and the cost
// from the route. It returns ErrSkip to let a request through unchecked (a health
// probe); any other error answers 400 (see WithErrorHandler).
type CheckFunc func(r *http.Request) (client.CheckRequest, error)

// A ReserveFunc maps a request to the reservation it needs: Amount is the most the
// work may cost (e.g. the request's max_tokens).
type ReserveFunc func(r *http.Request) (client.ReserveRequest, error)

// ErrSkip, returned by a CheckFunc or ReserveFunc, lets a request through without a
// check.
var ErrSkip = errors.New("no quota check for this request")

// ErrRequest wraps the error of a CheckFunc or ReserveFunc: the request does not say
// what the check needs. The default error handler answers it 400.
var ErrRequest = errors.New("the request does not name its quota")

// ErrNotDecided is what the error handler gets when Quotaplane could not decide and
// the client's FailPolicy denied: the default handler answers 503, not 429, since no
// quota was found exhausted.
var ErrNotDecided = errors.New("the quota service could not decide")

// An Option configures a middleware.
type Option func(*config)

type config struct {
	onError       func(w http.ResponseWriter, r *http.Request, err error)
	log           *slog.Logger
	heartbeat     time.Duration // Concurrency: between extends; 0 is a third of the ttl
	settleTimeout time.Duration // a commit or release after the handler, all attempts
}

// WithErrorHandler answers the requests that could not be checked: err wraps
// ErrRequest (the mapping function failed), ErrNotDecided (the fail policy denied),
// client.ErrUnavailable (no decision, no fail policy) or is a *client.Error (the API
// refused the check: a bad key, an unknown metric). The default writes a problem
// document: 400 for ErrRequest, 503 for no decision, else 500.
func WithErrorHandler(h func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return func(c *config) { c.onError = h }
}

// WithLogger logs what cannot be answered to the request any more: a commit or
// release that failed after the handler ran (slog.Default otherwise).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

func newConfig(opts []Option) *config {
	c := &config{onError: DefaultErrorHandler, log: slog.Default(), settleTimeout: commitTimeout}
	for _, o := range opts {
		o(c)
	}
	return c
}

// ProblemType is the type URI of the problem documents the middleware writes, as the
// API's own: https://quotaplane.dev/problems/<status in kebab case>.
const ProblemType = "https://quotaplane.dev/problems/"

// Problem is the problem document of a refused request: RFC 9457 members, and, for a
// denial, retry_after_seconds and the level that refused it.
type Problem struct {
	Type              string           `json:"type"`
	Title             string           `json:"title"`
	Status            int              `json:"status"`
	Detail            string           `json:"detail,omitempty"`
	RetryAfterSeconds int64            `json:"retry_after_seconds,omitempty"`
	BlockedAt         *client.LevelRef `json:"blocked_at,omitempty"`
	// ViolatedPolicies names the policy that refused (draft-11's quota-exceeded
	// member), when Quotaplane's answer named it.
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
}

func writeProblem(w http.ResponseWriter, p Problem) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

func problemOf(status int, detail string) Problem {
	slug := []byte(http.StatusText(status))
	for i, b := range slug {
		switch {
		case b == ' ':
			slug[i] = '-'
		case b >= 'A' && b <= 'Z':
			slug[i] = b + 'a' - 'A'
		}
	}
	return Problem{Type: ProblemType + string(slug), Title: http.StatusText(status), Status: status, Detail: detail}
}

// DefaultErrorHandler is the error handler of a middleware without WithErrorHandler.
func DefaultErrorHandler(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, ErrRequest):
		writeProblem(w, problemOf(http.StatusBadRequest, err.Error()))
	case errors.Is(err, ErrNotDecided), errors.Is(err, client.ErrUnavailable):
		w.Header().Set("Retry-After", "1")
		writeProblem(w, problemOf(http.StatusServiceUnavailable, "the quota of this request cannot be checked now; retry shortly"))
	default: // the API refused the check itself: the service's configuration is wrong
		writeProblem(w, problemOf(http.StatusInternalServerError, "the quota of this request cannot be checked"))
	}
}

// SetRateLimitHeaders sets RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset
// (whole seconds) from rl, spelt as the IETF draft spells them, and, when rl names its
// policy (Quotaplane sent the draft-11 fields), the draft-11 RateLimit field of it:
// "<policy>";r=<remaining>;t=<reset>.
func SetRateLimitHeaders(h http.Header, rl client.RateLimit) {
	reset := strconv.FormatInt(ceilSeconds(rl.Reset), 10)
	h["RateLimit-Limit"] = []string{strconv.FormatInt(rl.Limit, 10)}
	h["RateLimit-Remaining"] = []string{strconv.FormatInt(rl.Remaining, 10)}
	h["RateLimit-Reset"] = []string{reset}
	if rl.Policy != "" && plainName(rl.Policy) {
		h["RateLimit"] = []string{`"` + rl.Policy + `";r=` + strconv.FormatInt(max(rl.Remaining, 0), 10) + ";t=" + reset}
	}
}

// plainName reports whether s can be written as a structured-field String without
// escapes (Quotaplane's policy names always can).
func plainName(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

func ceilSeconds(d time.Duration) int64 { return int64(math.Ceil(d.Seconds())) }

// Deny answers a denied check: 429, Retry-After, RateLimit-* and a problem document
// naming the level and window that refused and when to retry.
func Deny(w http.ResponseWriter, blocked *client.LevelRef, retryAfter time.Duration, rl client.RateLimit) {
	secs := max(ceilSeconds(retryAfter), 1)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	rl.Reset = time.Duration(secs) * time.Second // on a denial RateLimit-Reset is Retry-After, as the API's
	SetRateLimitHeaders(w.Header(), rl)
	detail := fmt.Sprintf("over quota; retry in %d s", secs)
	if blocked != nil {
		detail = fmt.Sprintf("over quota at %s %q (%s window); retry in %d s", blocked.Level, blocked.ID, blocked.Window, secs)
	}
	p := problemOf(http.StatusTooManyRequests, detail)
	p.RetryAfterSeconds, p.BlockedAt = secs, blocked
	if rl.Policy != "" {
		p.ViolatedPolicies = []string{rl.Policy}
	}
	writeProblem(w, p)
}

// Check returns a middleware that checks each request with c before next: see the
// package documentation.
func Check(c *client.Client, fn CheckFunc, opts ...Option) func(http.Handler) http.Handler {
	cfg := newConfig(opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req, ok := request(cfg, w, r, next, fn)
			if !ok {
				return
			}
			res, err := c.Check(r.Context(), req)
			if err != nil {
				cfg.onError(w, r, err)
				return
			}
			if cfg.pass(w, r, verdict{res.Allowed, res.NotDecided, res.Cause, res.BlockedAt, res.RetryAfter, res.RateLimit, res.Policies, len(res.Levels)}) {
				next.ServeHTTP(w, r)
			}
		})
	}
}

// request maps r with fn: ok false when the request is already answered (by next,
// when fn skips it, or as an ErrRequest error).
func request[T any](cfg *config, w http.ResponseWriter, r *http.Request, next http.Handler, fn func(*http.Request) (T, error)) (T, bool) {
	req, err := fn(r)
	if errors.Is(err, ErrSkip) {
		next.ServeHTTP(w, r)
		return req, false
	}
	if err != nil {
		cfg.onError(w, r, fmt.Errorf("%w: %w", ErrRequest, err))
		return req, false
	}
	return req, true
}

// verdict is what Check and Reserve answer about letting a request through.
type verdict struct {
	allowed, notDecided bool
	cause               error
	blockedAt           *client.LevelRef
	retryAfter          time.Duration
	rateLimit           client.RateLimit
	policies            []client.Policy // RateLimit-Policy, passed on
	levels              int
}

// pass answers a request v does not let through (a fail policy's refusal, a denial)
// and reports whether it does, with its RateLimit headers set when there are levels.
func (cfg *config) pass(w http.ResponseWriter, r *http.Request, v verdict) bool {
	switch {
	case v.notDecided && !v.allowed:
		cfg.onError(w, r, fmt.Errorf("%w: %w", ErrNotDecided, v.cause))
		return false
	case !v.allowed:
		setPolicies(w.Header(), v.policies)
		Deny(w, v.blockedAt, v.retryAfter, v.rateLimit)
		return false
	}
	if v.levels > 0 {
		setPolicies(w.Header(), v.policies)
		SetRateLimitHeaders(w.Header(), v.rateLimit)
	}
	return true
}

// usage is what a handler under Reserve or Concurrency reported, and its reservation.
type usage struct {
	id       string // the reservation
	mu       sync.Mutex
	n        int64            // ReportUsage's sum
	per      map[string]int64 // ReportMetricUsage's sums
	reported bool
}

type usageKey struct{}

func withUsage(ctx context.Context, id string) (context.Context, *usage) {
	u := &usage{id: id}
	return context.WithValue(ctx, usageKey{}, u), u
}

// ReportUsage adds n units to what the request of ctx used, for Reserve (or
// Concurrency) to commit after the handler: call it as the cost becomes known (once,
// or per chunk of a stream). It is for a reservation of one metric; one of several
// (Amounts) takes ReportMetricUsage. It reports whether ctx is a request under Reserve
// or Concurrency.
func ReportUsage(ctx context.Context, n int64) bool {
	u, ok := ctx.Value(usageKey{}).(*usage)
	if ok {
		u.mu.Lock()
		u.n += n
		u.reported = true
		u.mu.Unlock()
	}
	return ok
}

// ReportMetricUsage adds n units of metric to what the request of ctx used: a
// reservation of several metrics is committed with what was reported of each (a
// metric not reported used 0). It reports whether ctx is a request under Reserve or
// Concurrency.
func ReportMetricUsage(ctx context.Context, metric string, n int64) bool {
	u, ok := ctx.Value(usageKey{}).(*usage)
	if ok {
		u.mu.Lock()
		if u.per == nil {
			u.per = map[string]int64{}
		}
		u.per[metric] += n
		u.reported = true
		u.mu.Unlock()
	}
	return ok
}

// ReservationID is the id of the reservation Reserve or Concurrency holds for the
// request of ctx ("" outside them, or when the fail policy let the request through
// without one).
func ReservationID(ctx context.Context) string {
	if u, ok := ctx.Value(usageKey{}).(*usage); ok {
		return u.id
	}
	return ""
}

// settle settles reservation res with what u reported: per metric, one number, or,
// when nothing was reported, whole (all its amounts) if whole, else released.
func (u *usage) settle(ctx context.Context, c *client.Client, res *client.Reservation, whole bool) (string, error) {
	u.mu.Lock()
	reported, n, per := u.reported, u.n, u.per
	u.mu.Unlock()
	var err error
	switch {
	case per != nil:
		_, err = c.CommitUsed(ctx, res.ID, per)
		return "commit", err
	case reported:
		_, err = c.Commit(ctx, res.ID, n)
		return "commit", err
	case whole && res.Amounts != nil:
		_, err = c.CommitUsed(ctx, res.ID, res.Amounts)
		return "commit", err
	case whole:
		_, err = c.Commit(ctx, res.ID, res.Amount)
		return "commit", err
	}
	_, err = c.Release(ctx, res.ID)
	return "release", err
}

// commitTimeout bounds the commit or release after the handler.
const commitTimeout = 10 * time.Second

// Reserve returns a middleware that reserves with c before next and settles after
// it: it commits the units next reported with ReportUsage, or the whole amount when
// it reported none, and releases everything if next panics. A denied reservation
// answers as a denied check. A reservation the FailPolicy allowed (Quotaplane did not
// decide) has nothing to commit: next runs uncounted.
func Reserve(c *client.Client, fn ReserveFunc, opts ...Option) func(http.Handler) http.Handler {
	cfg := newConfig(opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req, ok := request(cfg, w, r, next, fn)
			if !ok {
				return
			}
			res, held := cfg.reserve(w, r, next, c, req)
			if !held {
				return
			}
			ctx, u := withUsage(r.Context(), res.ID)
			settled := false
			defer func() {
				if settled {
					return
				}
				// next panicked: give everything back, then let the panic go on.
				sctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), cfg.settleTimeout)
				defer cancel()
				if _, err := c.Release(sctx, res.ID); err != nil {
					cfg.log.Warn("quotaplane: release after a panic failed", "reservation", res.ID, "err", err)
				}
			}()
			next.ServeHTTP(w, r.WithContext(ctx))
			settled = true
			sctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), cfg.settleTimeout)
			defer cancel()
			if how, err := u.settle(sctx, c, res, true); err != nil {
				cfg.log.Warn("quotaplane: "+how+" failed", "reservation", res.ID, "err", err)
			}
		})
	}
}

// setPolicies passes Quotaplane's RateLimit-Policy field on (issue 27: only RateLimit
// and the legacy fields were), when it sent one.
func setPolicies(h http.Header, policies []client.Policy) {
	if len(policies) > 0 {
		h["RateLimit-Policy"] = []string{client.FormatPolicies(policies)}
	}
}

// reserve reserves req for Reserve and Concurrency and reports whether a reservation
// is held. When not, the request has been dealt with: answered (an error, a denial, a
// fail policy's refusal) or, when the fail policy let it through holding nothing,
// served by next.
func (cfg *config) reserve(w http.ResponseWriter, r *http.Request, next http.Handler, c *client.Client, req client.ReserveRequest) (*client.Reservation, bool) {
	res, err := c.Reserve(r.Context(), req)
	if err != nil {
		cfg.onError(w, r, err)
		return nil, false
	}
	if !cfg.pass(w, r, verdict{res.Allowed, res.NotDecided, res.Cause, res.BlockedAt, res.RetryAfter, res.RateLimit, res.Policies, len(res.Levels)}) {
		return nil, false
	}
	if res.ID == "" { // decided by the fail policy: nothing is held
		next.ServeHTTP(w, r)
		return nil, false
	}
	return res, true
}
