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
// amount before the handler, and settles when the handler is done (not when the
// client goes away: a stream that goes on after a disconnect counts what it
// reported): it commits what the handler reported with ReportUsage, which adds (the
// whole amount if it reported nothing), giving the rest back. A handler that fails
// (panics, or writes a 5xx) commits what it reported so far, and releases everything
// if it reported nothing. The settlement runs off the response path, after the
// handler returned, without the request's cancellation (context.WithoutCancel) and
// bounded by WithSettleTimeout.
//
// Every middleware takes a Quota: a *client.Client, or in tests
// quotaplanetest.Noop or a client of quotaplanetest's fake server. Options shape it
// as express-rate-limit's do: WithSkip, WithOnDenied, WithErrorHandler (whose default
// writes a problem document and never answers the API's 4xx with a 500), WithLogger
// (every cause of an error is logged); the handler reads the decision with
// DecisionFrom, and warn mode's Quotaplane-Warning is passed on. The check or
// reservation before the handler runs under the request's context, so a client that
// goes away cancels it (nothing is written); the settlement after does not.
//
// Concurrency holds a slot of a concurrent limit (API.md "Concurrency limits") for as
// long as the handler runs: it extends the reservation while the handler streams (and
// the client is there), and gives it back when the handler returns or panics.
package middleware

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
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
	onDenied      func(w http.ResponseWriter, r *http.Request, d *Decision)
	onSettled     func(r *http.Request, s Settlement)
	skip          func(r *http.Request) bool
	log           *slog.Logger
	heartbeat     time.Duration // Concurrency: between extends; 0 is a third of the ttl
	settleTimeout time.Duration // a commit or release after the handler, all attempts
}

// WithErrorHandler answers the requests that could not be checked: err wraps
// ErrRequest (the mapping function failed), ErrNotDecided (the fail policy denied),
// client.ErrUnavailable (no decision, no fail policy), client.ErrConfiguration, the
// request's context error (the client went away, a timeout), or is a *client.Error
// (the API refused the check: an unregistered user without a team, an unknown
// metric, a bad key). The middleware has logged err before calling it. See
// DefaultErrorHandler.
func WithErrorHandler(h func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return func(c *config) { c.onError = h }
}

// WithOnDenied answers the requests Quotaplane denied, instead of DefaultOnDenied's
// 429 problem document; RateLimit-Policy is already set. d is the decision.
func WithOnDenied(h func(w http.ResponseWriter, r *http.Request, d *Decision)) Option {
	return func(c *config) { c.onDenied = h }
}

// WithSkip lets the requests skip reports true for through unchecked (a health
// probe, an internal caller), as a CheckFunc returning ErrSkip does.
func WithSkip(skip func(r *http.Request) bool) Option { return func(c *config) { c.skip = skip } }

// WithOnSettled calls f once the reservation of a request under Reserve or
// Concurrency is settled (or its settlement failed): for metrics, and for tests that
// wait for a settlement off the response path.
func WithOnSettled(f func(r *http.Request, s Settlement)) Option {
	return func(c *config) { c.onSettled = f }
}

// WithLogger logs the cause of every error the error handler answers, and what
// cannot be answered to the request any more: a commit or release that failed after
// the handler ran (slog.Default otherwise).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

func newConfig(opts []Option) *config {
	c := &config{onError: DefaultErrorHandler, onDenied: DefaultOnDenied, log: slog.Default(), settleTimeout: commitTimeout}
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
// It writes a problem document (application/problem+json):
//
//   - ErrRequest: 400, with the mapping function's error;
//   - the API refused the service's own key (a *client.Error 401 or 403): 500, without
//     the detail: the caller cannot fix it (the log says it), as the TypeScript
//     middleware answers;
//   - the API refused what the request named (any other 4xx: an unregistered user
//     without a team, an unknown metric): 403, never a 500, with the API's detail for
//     a 400, 404, 409 or 422;
//   - ErrNotDecided, client.ErrUnavailable or the request's deadline: 503 with
//     Retry-After: 1;
//   - the client went away (context.Canceled): nothing is written;
//   - anything else (client.ErrConfiguration): 500.
func DefaultErrorHandler(w http.ResponseWriter, r *http.Request, err error) {
	var pe *client.Error
	switch {
	case errors.Is(err, ErrRequest):
		writeProblem(w, problemOf(http.StatusBadRequest, err.Error()))
	case errors.As(err, &pe) && (pe.StatusCode == http.StatusUnauthorized || pe.StatusCode == http.StatusForbidden):
		// the api refused the service's own key: the service's fault, not the caller's
		// (as the TypeScript middleware answers it)
		writeProblem(w, problemOf(http.StatusInternalServerError, "the quota service refused this service's credentials"))
	case errors.As(err, &pe) && pe.StatusCode < 500:
		detail := "the quota service refused this request's check"
		if s := pe.StatusCode; (s == 400 || s == 404 || s == 409 || s == 422) && pe.Problem.Detail != "" {
			detail += ": " + pe.Problem.Detail
		}
		writeProblem(w, problemOf(http.StatusForbidden, detail))
	case errors.Is(err, context.Canceled):
		// the client went away: no one to answer
	case errors.Is(err, ErrNotDecided), errors.Is(err, client.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		w.Header().Set("Retry-After", "1")
		writeProblem(w, problemOf(http.StatusServiceUnavailable, "the quota of this request cannot be checked now; retry shortly"))
	default: // the client is misconfigured: the service's own fault
		writeProblem(w, problemOf(http.StatusInternalServerError, "the quota of this request cannot be checked"))
	}
}

// DefaultOnDenied answers a denied request: Deny's 429.
func DefaultOnDenied(w http.ResponseWriter, r *http.Request, d *Decision) {
	Deny(w, d.BlockedAt, d.RetryAfter, d.RateLimit)
}

// fail logs err, then answers it with the error handler.
func (cfg *config) fail(w http.ResponseWriter, r *http.Request, err error) {
	var pe *client.Error
	level := slog.LevelError
	switch {
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil, errors.Is(err, ErrRequest):
		level = slog.LevelDebug
	case errors.As(err, &pe) && (pe.StatusCode == http.StatusUnauthorized || pe.StatusCode == http.StatusForbidden):
		// the service's own key: an error for its operator
	case errors.Is(err, ErrNotDecided), errors.Is(err, client.ErrUnavailable), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &pe) && pe.StatusCode < 500:
		level = slog.LevelWarn
	}
	cfg.log.Log(r.Context(), level, "quotaplane: the request's quota could not be checked", "method", r.Method, "path", r.URL.Path, "err", err)
	cfg.onError(w, r, err)
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
// naming the level and window that refused and when to retry. A refusal by a level
// with no wait (a cost above a token bucket's burst can never fit) has no Retry-After
// and says so; without a level either, the wait is at least 1 s.
func Deny(w http.ResponseWriter, blocked *client.LevelRef, retryAfter time.Duration, rl client.RateLimit) {
	if blocked != nil && retryAfter <= 0 {
		SetRateLimitHeaders(w.Header(), rl)
		p := problemOf(http.StatusTooManyRequests,
			fmt.Sprintf("over quota at %s %q (%s window); the cost can never fit", blocked.Level, blocked.ID, blocked.Window))
		p.BlockedAt = blocked
		if rl.Policy != "" {
			p.ViolatedPolicies = []string{rl.Policy}
		}
		writeProblem(w, p)
		return
	}
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

// Quota is what the middlewares need of Quotaplane. *client.Client implements it; so
// do quotaplanetest.Noop (allows everything, for tests of a handler without an api)
// and any fake of a test's own. Its errors are the client's: see client.Client.
type Quota interface {
	Check(ctx context.Context, req client.CheckRequest) (*client.CheckResult, error)
	Reserve(ctx context.Context, req client.ReserveRequest) (*client.Reservation, error)
	Commit(ctx context.Context, id string, used int64) (*client.Reservation, error)
	CommitUsed(ctx context.Context, id string, used map[string]int64) (*client.Reservation, error)
	Release(ctx context.Context, id string) (*client.Reservation, error)
	Extend(ctx context.Context, id string, ttl time.Duration) (*client.Reservation, error)
}

var _ Quota = (*client.Client)(nil)

// Decision is what the middleware decided about a request, as the handler reads it
// with DecisionFrom (express-rate-limit's req.rateLimit), and as WithOnDenied gets it.
type Decision struct {
	Allowed bool
	// NotDecided: Quotaplane could not decide and the client's fail policy did
	// (Allowed is its answer); Cause says why.
	NotDecided bool
	Cause      error
	Mode       string           // enforce, shadow or warn (of a check)
	Warning    string           // warn mode: passed on as Quotaplane-Warning
	WouldBlock *client.LevelRef // shadow and warn modes
	BlockedAt  *client.LevelRef // when denied
	RetryAfter time.Duration
	RateLimit  client.RateLimit
	Policies   []client.Policy
	Levels     []client.Level
	// Check is the check's result (Check); Reservation the reservation (Reserve,
	// Concurrency; its ID is "" when the fail policy let the request through).
	Check       *client.CheckResult
	Reservation *client.Reservation
}

type decisionKey struct{}

// DecisionFrom returns the decision the middleware made about the request of ctx
// (false outside Check, Reserve and Concurrency, or for a skipped request).
func DecisionFrom(ctx context.Context) (*Decision, bool) {
	d, ok := ctx.Value(decisionKey{}).(*Decision)
	return d, ok
}

func checkDecision(res *client.CheckResult) *Decision {
	return &Decision{Allowed: res.Allowed, NotDecided: res.NotDecided, Cause: res.Cause, Mode: res.Mode, Warning: res.Warning,
		WouldBlock: res.WouldBlock, BlockedAt: res.BlockedAt, RetryAfter: res.RetryAfter, RateLimit: res.RateLimit,
		Policies: res.Policies, Levels: res.Levels, Check: res}
}

func reservationDecision(res *client.Reservation) *Decision {
	return &Decision{Allowed: res.Allowed, NotDecided: res.NotDecided, Cause: res.Cause, BlockedAt: res.BlockedAt,
		RetryAfter: res.RetryAfter, RateLimit: res.RateLimit, Policies: res.Policies, Levels: res.Levels, Reservation: res}
}

// Check returns a middleware that checks each request with c before next: see the
// package documentation.
func Check(c Quota, fn CheckFunc, opts ...Option) func(http.Handler) http.Handler {
	cfg := newConfig(opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req, ok := request(cfg, w, r, next, fn)
			if !ok {
				return
			}
			res, err := c.Check(r.Context(), req)
			if err != nil {
				cfg.fail(w, r, err)
				return
			}
			d := checkDecision(res)
			if cfg.pass(w, r, d) {
				next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), decisionKey{}, d)))
			}
		})
	}
}

// request maps r with fn: ok false when the request is already answered (by next,
// when it is skipped, or as an ErrRequest error).
func request[T any](cfg *config, w http.ResponseWriter, r *http.Request, next http.Handler, fn func(*http.Request) (T, error)) (T, bool) {
	var req T
	if cfg.skip != nil && cfg.skip(r) {
		next.ServeHTTP(w, r)
		return req, false
	}
	req, err := fn(r)
	if errors.Is(err, ErrSkip) {
		next.ServeHTTP(w, r)
		return req, false
	}
	if err != nil {
		cfg.fail(w, r, fmt.Errorf("%w: %w", ErrRequest, err))
		return req, false
	}
	return req, true
}

// pass answers a request d does not let through (a fail policy's refusal, a denial)
// and reports whether it does, with its RateLimit headers set when there are levels
// and warn mode's warning passed on.
func (cfg *config) pass(w http.ResponseWriter, r *http.Request, d *Decision) bool {
	switch {
	case d.NotDecided && !d.Allowed:
		cfg.fail(w, r, fmt.Errorf("%w: %w", ErrNotDecided, d.Cause))
		return false
	case !d.Allowed:
		setPolicies(w.Header(), d.Policies)
		cfg.onDenied(w, r, d)
		return false
	}
	if len(d.Levels) > 0 {
		setPolicies(w.Header(), d.Policies)
		SetRateLimitHeaders(w.Header(), d.RateLimit)
	}
	if d.Warning != "" {
		w.Header().Set("Quotaplane-Warning", d.Warning)
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

// Settlement is how the reservation of a request under Reserve or Concurrency was
// settled (WithOnSettled).
type Settlement struct {
	ReservationID string
	How           string           // "commit" or "release"
	Used          int64            // committed, of a reservation of one metric
	UsedByMetric  map[string]int64 // committed, of several (ReportMetricUsage)
	// Failed: the handler panicked or wrote a 5xx; what it reported was committed
	// (nothing reported: released).
	Failed bool
	Err    error // the commit or release failed (the reservation's on_expiry settles it)
}

// settle settles reservation res with what u reported: per metric, one number, or,
// when nothing was reported, whole (all its amounts) if whole, else released.
func (u *usage) settle(ctx context.Context, c Quota, res *client.Reservation, whole bool) Settlement {
	u.mu.Lock()
	reported, n, per := u.reported, u.n, maps.Clone(u.per)
	u.mu.Unlock()
	s := Settlement{ReservationID: res.ID, How: "commit"}
	switch {
	case per != nil:
		s.UsedByMetric = per
		_, s.Err = c.CommitUsed(ctx, res.ID, per)
	case reported:
		s.Used = n
		_, s.Err = c.Commit(ctx, res.ID, n)
	case whole && res.Amounts != nil:
		s.UsedByMetric = res.Amounts
		_, s.Err = c.CommitUsed(ctx, res.ID, res.Amounts)
	case whole:
		s.Used = res.Amount
		_, s.Err = c.Commit(ctx, res.ID, res.Amount)
	default:
		s.How = "release"
		_, s.Err = c.Release(ctx, res.ID)
	}
	return s
}

// settled logs a failed settlement and tells WithOnSettled.
func (cfg *config) settled(r *http.Request, s Settlement) {
	if s.Err != nil {
		cfg.log.Warn("quotaplane: "+s.How+" failed; the reservation's on_expiry settles it", "reservation", s.ReservationID, "err", s.Err)
	}
	if cfg.onSettled != nil {
		cfg.onSettled(r, s)
	}
}

// commitTimeout bounds the commit or release after the handler.
const commitTimeout = 10 * time.Second

// Reserve returns a middleware that reserves with c before next and settles after
// it, when next is done (not when the client goes away):
//
//   - next succeeded: what it reported with ReportUsage or ReportMetricUsage (they
//     add) is committed, the whole amount when it reported nothing;
//   - next failed (it panicked, then the panic goes on, or wrote a 5xx): what it
//     reported so far is committed, and everything released if it reported nothing.
//
// The settlement runs in a goroutine of its own once next has returned, so the
// response never waits for it, with the request's values but not its cancellation
// (context.WithoutCancel), bounded by WithSettleTimeout; WithOnSettled tells when it
// is done. A process that stops before leaves the reservation to its on_expiry. A
// denied reservation answers as a denied check. A reservation the FailPolicy allowed
// (Quotaplane did not decide) has nothing to commit: next runs uncounted.
func Reserve(c Quota, fn ReserveFunc, opts ...Option) func(http.Handler) http.Handler {
	cfg := newConfig(opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req, ok := request(cfg, w, r, next, fn)
			if !ok {
				return
			}
			res, d, held := cfg.reserve(w, r, next, c, req)
			if !held {
				return
			}
			ctx, u := withUsage(context.WithValue(r.Context(), decisionKey{}, d), res.ID)
			sw := &statusWriter{ResponseWriter: w}
			returned := false
			defer func() {
				// Runs when next returned or panicked (the panic goes on after).
				failed := !returned || sw.status >= 500
				sctx := context.WithoutCancel(ctx)
				go func() {
					sctx, cancel := context.WithTimeout(sctx, cfg.settleTimeout)
					defer cancel()
					s := u.settle(sctx, c, res, !failed)
					s.Failed = failed
					cfg.settled(r, s)
				}()
			}()
			next.ServeHTTP(sw, r.WithContext(ctx))
			returned = true
		})
	}
}

// statusWriter records the status a handler wrote, for Reserve to tell a failure;
// Flush, Hijack and http.ResponseController reach the writer it wraps.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Flush() { _ = http.NewResponseController(s.ResponseWriter).Flush() }

func (s *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(s.ResponseWriter).Hijack()
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// setPolicies passes Quotaplane's RateLimit-Policy field on, beside RateLimit and the
// legacy fields, when it sent one.
func setPolicies(h http.Header, policies []client.Policy) {
	if len(policies) > 0 {
		h["RateLimit-Policy"] = []string{client.FormatPolicies(policies)}
	}
}

// reserve reserves req for Reserve and Concurrency and reports whether a reservation
// is held. When not, the request has been dealt with: answered (an error, a denial, a
// fail policy's refusal) or, when the fail policy let it through holding nothing,
// served by next.
func (cfg *config) reserve(w http.ResponseWriter, r *http.Request, next http.Handler, c Quota, req client.ReserveRequest) (*client.Reservation, *Decision, bool) {
	res, err := c.Reserve(r.Context(), req)
	if err != nil {
		cfg.fail(w, r, err)
		return nil, nil, false
	}
	d := reservationDecision(res)
	if !cfg.pass(w, r, d) {
		return nil, nil, false
	}
	if res.ID == "" { // decided by the fail policy: nothing is held
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), decisionKey{}, d)))
		return nil, nil, false
	}
	return res, d, true
}
