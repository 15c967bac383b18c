// Package client is the Go client of Quotaplane's HTTP API: checks, batches of
// checks and reservations, with a timeout on every attempt, retries that never count
// twice, and a policy for when Quotaplane cannot decide. It needs only the standard
// library; github.com/quotaplane/quotaplane/client/middleware puts a check in front of
// net/http handlers and github.com/quotaplane/quotaplane/client/webhook verifies the
// webhooks Quotaplane sends.
//
// A check or a reservation may name several metrics, decided all or nothing
// (CheckRequest.Costs, ReserveRequest.Amounts, CommitUsed); Extend keeps a held
// reservation, such as a slot of a concurrent limit, alive while long work runs.
//
// A check that is denied is not an error: Check returns a result whose Allowed is
// false, with RetryAfter and the level that refused it. Errors are the answers that
// decide nothing: a *Error carries the API's problem document (errors.As), and
// ErrUnavailable (errors.Is) marks a Quotaplane that could not be reached, or
// answered 5xx, on every attempt. With a FailPolicy (WithFailPolicy) such a check
// returns a result instead, allowed or not by the policy, whose NotDecided is true.
//
// Time: every call has a budget, all its attempts together (WithBudget: 1 s for a
// check, a batch or a reservation, DefaultBudget; WithSettleBudget: 10 s for a commit,
// release, extend or read), each attempt a timeout (WithTimeout) within it, and the
// caller's context bounds both. A call is retried after a transport error or a 5xx
// answer (two retries by default, WithRetries), after the answer's Retry-After when
// it has one (seconds or an HTTP date), else after a capped exponential backoff with
// full jitter (WithBackoff, WithMaxBackoff); when that wait would pass the budget,
// the call ends at once (ErrUnavailable, so the fail policy answers). A check or a
// reservation is sent with an idempotency key, the caller's or one generated for the
// call, the same on every attempt: a retry of a check whose answer was lost on the
// way is answered from the first decision (Replayed) and counts nothing more.
//
// Not retried, and never given to the fail policy:
//
//   - the caller's own cancellation or deadline: the call returns an error wrapping
//     ctx.Err() (context.Canceled or context.DeadlineExceeded), meaning the caller
//     gave up, not that Quotaplane is down;
//   - configuration errors no retry can mend: a certificate that does not verify, a
//     TLS handshake refused, a host name that does not exist (errors.Is(err,
//     ErrConfiguration), and errors.As finds the cause), and the API's 4xx answers
//     (a bad key, a missing scope, a bad request: a *Error).
//
// WithLeases decides the checks of a hot path in the caller's process from a lease
// the server sized and took from every level (CheckResult.Leased), settled with what
// it admitted; WithBatching sends concurrent checks as one batch request. Close
// settles the leases (README.md "Client leases and batching").
//
// Hooks (WithHooks) see every attempt, retry and decision; WithLogger logs them with
// log/slog. Every request says User-Agent: quotaplane-go/<Version>, and carries the
// headers of WithHeaders and WithHeaderFunc (how a W3C traceparent is sent: see
// WithHeaderFunc).
package client

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Version is this module's version, as its client/vX.Y.Z tag names it; it is sent in
// the User-Agent (quotaplane-go/<Version>). See CHANGELOG.md.
const Version = "0.1.0"

// UserAgent is the User-Agent every request of the client carries.
const UserAgent = "quotaplane-go/" + Version

// DefaultTimeout bounds each attempt of a call unless WithTimeout says otherwise
// (and the call's budget bounds it too).
const DefaultTimeout = 2 * time.Second

// DefaultBudget bounds all the attempts of a Check, CheckBatch or Reserve together,
// waits included, unless WithBudget says otherwise: a hung Quotaplane costs a request
// at most this before the fail policy answers.
const DefaultBudget = time.Second

// DefaultSettleBudget bounds all the attempts of a Commit, CommitUsed, Release,
// Extend or GetReservation together unless WithSettleBudget says otherwise: they
// count what was used, and run off the request's path.
const DefaultSettleBudget = 10 * time.Second

// DefaultRetries is how many times a call is retried after a transport error or a
// 5xx answer unless WithRetries says otherwise.
const DefaultRetries = 2

// DefaultBackoff and DefaultMaxBackoff shape the wait before a retry of an answer
// without Retry-After: a random duration between 0 and DefaultBackoff doubled per
// attempt, at most DefaultMaxBackoff ("full jitter").
const (
	DefaultBackoff    = 100 * time.Millisecond
	DefaultMaxBackoff = time.Second
)

// maxBody bounds what is read of an answer.
const maxBody = 8 << 20

// Client calls one Quotaplane API with one API key. It is safe for concurrent use.
type Client struct {
	base         string // scheme://host[/prefix], without a trailing slash
	key          string
	hc           *http.Client
	timeout      time.Duration
	budget       time.Duration
	settleBudget time.Duration
	retries      int
	backoff      time.Duration
	maxBackoff   time.Duration
	policy       FailPolicy
	hooks        Hooks
	log          *slog.Logger
	headers      http.Header
	headerFunc   func(context.Context, http.Header)

	leasesOn       bool
	leaseThreshold float64
	leases         *leaser // nil without WithLeases
	batchWait      time.Duration
	batch          *batcher // nil without WithBatching
}

// An Option configures a Client.
type Option func(*Client)

// WithHTTPClient sends the requests through hc (its transport, its proxy settings)
// instead of http.DefaultClient.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithTimeout bounds each attempt of a call to d (DefaultTimeout otherwise); the
// call's budget and the context passed to it bound all its attempts together.
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// WithBudget bounds all the attempts of a Check, CheckBatch or Reserve together,
// waits included (DefaultBudget otherwise; 0 or less: no budget, only the context,
// the timeout per attempt and the retries bound a call). When it runs out, the call
// did not get a decision: ErrUnavailable, and the fail policy answers.
func WithBudget(d time.Duration) Option { return func(c *Client) { c.budget = d } }

// WithSettleBudget bounds all the attempts of a Commit, CommitUsed, Release, Extend
// or GetReservation together (DefaultSettleBudget otherwise; 0 or less: no budget).
func WithSettleBudget(d time.Duration) Option { return func(c *Client) { c.settleBudget = d } }

// WithRetries sets how many times a call is retried after a transport error or a 5xx
// answer (DefaultRetries otherwise; 0: never), within its budget.
func WithRetries(n int) Option { return func(c *Client) { c.retries = max(n, 0) } }

// WithBackoff sets the base of the wait before a retry of an answer without
// Retry-After: the wait is random between 0 and d doubled per attempt, capped by
// WithMaxBackoff (DefaultBackoff otherwise).
func WithBackoff(d time.Duration) Option { return func(c *Client) { c.backoff = d } }

// WithMaxBackoff caps the backoff of WithBackoff (DefaultMaxBackoff otherwise). A
// Retry-After is honoured as sent, not capped: when it is longer than what is left
// of the budget the call ends at once.
func WithMaxBackoff(d time.Duration) Option { return func(c *Client) { c.maxBackoff = d } }

// WithFailPolicy decides the checks and reservations Quotaplane could not decide:
// unreachable on every attempt, answering 5xx (503: Redis down under a plan that
// fails closed, or too many checks in flight), or the budget spent. Without a policy
// such a call returns an error wrapping ErrUnavailable. The caller's own
// cancellation and configuration errors never reach it. See FailOpen, FailClosed.
func WithFailPolicy(p FailPolicy) Option { return func(c *Client) { c.policy = p } }

// WithHooks calls h's functions on every attempt, retry and decision (for metrics
// and tracing); each runs on the call's goroutine and must not block.
func WithHooks(h Hooks) Option { return func(c *Client) { c.hooks = h } }

// WithLogger logs through l: each attempt at debug, a retry at info, a decision of
// the fail policy at warn, a configuration error at error. Without it nothing is
// logged.
func WithLogger(l *slog.Logger) Option { return func(c *Client) { c.log = l } }

// WithHeaders adds h to every request (a User-Agent in h replaces UserAgent).
// Authorization, Content-Type and Accept are the client's own.
func WithHeaders(h http.Header) Option { return func(c *Client) { c.headers = h.Clone() } }

// WithHeaderFunc calls f with each request's context and headers before it is sent,
// on every attempt: the way to propagate a trace. With OpenTelemetry (the module stays
// standard library only, so the caller brings it):
//
//	client.WithHeaderFunc(func(ctx context.Context, h http.Header) {
//		otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(h))
//	})
//
// sends the W3C traceparent (and tracestate) of the span in ctx. Quotaplane records
// it as a link on the server span of the call (a public endpoint, it does not adopt
// a caller's trace as parent: docs/TRACING.md), so the check's trace is found from
// the caller's span.
func WithHeaderFunc(f func(ctx context.Context, h http.Header)) Option {
	return func(c *Client) { c.headerFunc = f }
}

// WithLeases lets the client decide the checks of a hot path in its own process,
// with no request, from a lease the server sized and took atomically from every
// level of the path (API.md "Client leases"). A path (org, team, user, metric)
// checked in this process at more than the threshold (WithLeaseThreshold) asks for
// one; a check of a leased path whose cost fits what is left, before the lease's
// end, is admitted at once (CheckResult.Leased; its Levels and RateLimit are the
// lease's, as it was taken). Checks of several metrics (Costs), queries and checks
// with the caller's idempotency key are never leased. The client settles each lease
// with exactly what it admitted, at most a second after its end, renewing it ahead in
// the same round trip while the path stays hot; near a limit, or when the org turns
// client leases off, the server answers no lease and checks go to it one by one.
// Close settles every lease. A process that dies without Close costs its unsettled
// leases: the server counts them whole (never more admitted than the limit).
func WithLeases() Option { return func(c *Client) { c.leasesOn = true } }

// WithLeaseThreshold sets the rate, in units a second of one path in this process,
// above which WithLeases asks for a lease (DefaultLeaseThreshold, 50, otherwise).
func WithLeaseThreshold(unitsPerSecond float64) Option {
	return func(c *Client) { c.leaseThreshold = unitsPerSecond }
}

// WithBatching coalesces checks: the checks a Check sends (not decided from a
// lease) that arrive within wait of the first go out together as one POST
// /v1/check/batch (at most 100 a request, two requests in flight at once, each
// check holding one of its org's in-flight checks on the server; a lone one as POST
// /v1/check). Each caller gets its own check's result or error, as Check without
// batching gives it; a check costs up to wait more. Off (0) by default.
func WithBatching(wait time.Duration) Option { return func(c *Client) { c.batchWait = wait } }

// Close settles every lease the client holds (WithLeases: with what each admitted,
// nothing renewed) and sends the checks waiting to be batched, and waits for them,
// at most the settle budget (WithSettleBudget; 10 s when it is 0 or less). It
// returns an error when some settlement was still unfinished then (the server
// counts such a lease whole). The client stays usable: later checks go to the server
// one by one.
func (c *Client) Close() error {
	bound := c.settleBudget
	if bound <= 0 {
		bound = DefaultSettleBudget
	}
	if c.batch != nil {
		c.batch.close()
	}
	if c.leases != nil {
		return c.leases.close(time.Now().Add(bound))
	}
	return nil
}

// New returns a client of the API at baseURL (e.g. "http://127.0.0.1:8080") that
// authenticates with key, an org API key with the check scope (or the operator
// token). It fails only on a baseURL that is not an absolute http or https URL (an
// error wrapping ErrConfiguration).
func New(baseURL, key string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: base URL %q: want http(s)://host[:port]", ErrConfiguration, baseURL)
	}
	c := &Client{base: strings.TrimRight(u.String(), "/"), key: key, hc: http.DefaultClient,
		timeout: DefaultTimeout, budget: DefaultBudget, settleBudget: DefaultSettleBudget, retries: DefaultRetries,
		backoff: DefaultBackoff, maxBackoff: DefaultMaxBackoff}
	for _, o := range opts {
		o(c)
	}
	if c.leasesOn {
		c.leases = newLeaser(c, c.leaseThreshold)
	}
	if c.batchWait > 0 {
		c.batch = newBatcher(c, c.batchWait)
	}
	return c, nil
}

// reply is one answer of the API, read in full.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// do sends method path with in (JSON; nil: no body) until an attempt is answered
// below 500, within budget, and returns that answer. It returns an error wrapping
// ctx.Err() when the caller gave up, one wrapping ErrConfiguration for an error no
// retry mends, and otherwise, after the last attempt or when the next would pass the
// budget, one wrapping ErrUnavailable and the last attempt's error (a *Error for a
// 5xx answer).
func (c *Client) do(ctx context.Context, budget time.Duration, method, path string, in any) (*reply, error) {
	return c.doRetries(ctx, budget, c.retries, method, path, in)
}

// doRetries is do with retries retries at most.
func (c *Client) doRetries(ctx context.Context, budget time.Duration, retries int, method, path string, in any) (*reply, error) {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return nil, fmt.Errorf("quotaplane client: encode the request: %w", err)
		}
	}
	bctx, cancel := ctx, context.CancelFunc(func() {})
	deadline := time.Now().Add(100 * 365 * 24 * time.Hour) // no budget: the context's and the retries' bounds only
	if budget > 0 {
		deadline = time.Now().Add(budget)
		bctx, cancel = context.WithDeadline(ctx, deadline)
	}
	defer cancel()
	var last error
	for attempt := 1; ; attempt++ {
		start := time.Now()
		r, err := c.once(bctx, method, path, body)
		status := 0
		if r != nil {
			status = r.status
		}
		c.attempted(ctx, AttemptInfo{Method: method, Path: path, N: attempt, Status: status, Err: err, Duration: time.Since(start)})
		if err == nil && r.status < 500 {
			return r, nil
		}
		if ctx.Err() != nil { // the caller gave up: not Quotaplane's failure
			return nil, fmt.Errorf("quotaplane client: %s %s: %w", method, path, ctx.Err())
		}
		if err != nil && bctx.Err() != nil {
			err = fmt.Errorf("%w (the budget of %v is spent)", err, budget)
		}
		if err != nil && isConfigError(err) {
			err = fmt.Errorf("%w: %s %s: %w", ErrConfiguration, method, path, err)
			if c.log != nil {
				c.log.ErrorContext(ctx, "quotaplane client: configuration error", "err", err)
			}
			return nil, err
		}
		var wait time.Duration
		fromHeader := false
		if err == nil {
			e := errorOf(r)
			ra := strings.TrimSpace(r.header.Get("Retry-After"))
			err, wait, fromHeader = e, e.RetryAfter, e.RetryAfter > 0 || ra == "0" // a malformed one: the backoff
		}
		last = err
		if attempt > retries {
			break
		}
		if !fromHeader {
			wait = c.jitter(attempt)
		}
		if left := time.Until(deadline); wait >= left {
			last = fmt.Errorf("%w (a retry in %v would pass the budget of %v)", last, wait.Round(time.Millisecond), budget)
			break
		}
		c.retrying(ctx, RetryInfo{Method: method, Path: path, N: attempt, Wait: wait, RetryAfter: fromHeader, Err: err})
		t := time.NewTimer(wait)
		select {
		case <-bctx.Done():
			t.Stop()
		case <-t.C:
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("quotaplane client: %s %s: %w", method, path, ctx.Err())
		}
		if bctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("%w: %s %s: %w", ErrUnavailable, method, path, last)
}

// jitter is the wait before retry n of an answer without Retry-After: random in [0,
// min(maxBackoff, backoff*2^(n-1))].
func (c *Client) jitter(n int) time.Duration {
	d := c.backoff
	for i := 1; i < n && d < c.maxBackoff; i++ {
		d *= 2
	}
	d = min(d, c.maxBackoff)
	if d <= 0 {
		return 0
	}
	return rand.N(d + 1)
}

// once is one attempt, bounded by the client's timeout.
func (c *Client) once(ctx context.Context, method, path string, body []byte) (*reply, error) {
	actx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(actx, method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", UserAgent)
	for k, v := range c.headers {
		req.Header[k] = append([]string(nil), v...)
	}
	if c.headerFunc != nil {
		c.headerFunc(ctx, req.Header)
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Accept", "application/json, application/problem+json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("read the answer: %w", err)
	}
	return &reply{status: res.StatusCode, header: res.Header, body: b}, nil
}

// decode reads r's JSON body into out.
func decode(r *reply, out any) error {
	if err := json.Unmarshal(r.body, out); err != nil {
		return fmt.Errorf("quotaplane client: decode a %d answer: %w", r.status, err)
	}
	return nil
}

// NewIdempotencyKey returns a fresh random idempotency key ("qpc_" and 32 hex
// digits), as the client generates for a check or reservation that has none.
func NewIdempotencyKey() string {
	b := make([]byte, 16)
	_, _ = crand.Read(b) // never fails (crypto/rand)
	return "qpc_" + hex.EncodeToString(b)
}

// retryAfter reads a Retry-After header: delay-seconds or an HTTP date (0 when absent,
// malformed or past).
func retryAfter(s string) time.Duration {
	if d := seconds(s); d > 0 {
		return d
	}
	if t, err := http.ParseTime(strings.TrimSpace(s)); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

// seconds turns a header or field of whole seconds into a duration (0 when absent).
func seconds(s string) time.Duration {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}
