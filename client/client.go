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
// Retries: every call is retried on a transport error or a 5xx answer (two retries by
// default, WithRetries), each attempt bounded by the timeout (DefaultTimeout,
// WithTimeout) and all of them by the context. A check or a reservation is sent with an
// idempotency key, the caller's or one generated for the call, the same on every
// attempt: a retry of a check whose answer was lost on the way is answered from the
// first decision (Replayed) and counts nothing more.
package client

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// DefaultTimeout bounds each attempt of a call unless WithTimeout says otherwise.
const DefaultTimeout = 2 * time.Second

// DefaultRetries is how many times a call is retried after a transport error or a
// 5xx answer unless WithRetries says otherwise.
const DefaultRetries = 2

// maxBody bounds what is read of an answer.
const maxBody = 8 << 20

// Client calls one Quotaplane API with one API key. It is safe for concurrent use.
type Client struct {
	base    string // scheme://host[/prefix], without a trailing slash
	key     string
	hc      *http.Client
	timeout time.Duration
	retries int
	backoff time.Duration
	policy  FailPolicy
}

// An Option configures a Client.
type Option func(*Client)

// WithHTTPClient sends the requests through hc (its transport, its proxy settings)
// instead of http.DefaultClient.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithTimeout bounds each attempt of a call to d (DefaultTimeout otherwise). The
// context passed to a call bounds all its attempts together.
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// WithRetries sets how many times a call is retried after a transport error or a 5xx
// answer (DefaultRetries otherwise; 0: never).
func WithRetries(n int) Option { return func(c *Client) { c.retries = max(n, 0) } }

// WithBackoff sets the wait before the first retry, doubled before each next one,
// with jitter (100 ms otherwise).
func WithBackoff(d time.Duration) Option { return func(c *Client) { c.backoff = d } }

// WithFailPolicy decides the checks and reservations Quotaplane could not decide:
// unreachable on every attempt, or answering 5xx (503: Redis down under a plan that
// fails closed). Without a policy such a call returns an error wrapping
// ErrUnavailable. See FailOpen, FailClosed.
func WithFailPolicy(p FailPolicy) Option { return func(c *Client) { c.policy = p } }

// New returns a client of the API at baseURL (e.g. "http://127.0.0.1:8080") that
// authenticates with key, an org API key with the check scope (or the operator
// token). It fails only on a baseURL that is not an absolute http or https URL.
func New(baseURL, key string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("quotaplane client: base URL %q: want http(s)://host[:port]", baseURL)
	}
	c := &Client{base: strings.TrimRight(u.String(), "/"), key: key, hc: http.DefaultClient,
		timeout: DefaultTimeout, retries: DefaultRetries, backoff: 100 * time.Millisecond}
	for _, o := range opts {
		o(c)
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
// below 500, and returns that answer. After the last attempt it returns an error
// wrapping ErrUnavailable and the last attempt's error (a *Error for a 5xx answer).
func (c *Client) do(ctx context.Context, method, path string, in any) (*reply, error) {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return nil, fmt.Errorf("quotaplane client: encode the request: %w", err)
		}
	}
	var last error
	for attempt := 0; ; attempt++ {
		r, err := c.once(ctx, method, path, body)
		if err == nil && r.status < 500 {
			return r, nil
		}
		if err == nil {
			err = errorOf(r)
		}
		last = err
		if attempt >= c.retries || ctx.Err() != nil {
			break
		}
		wait := c.backoff << attempt
		wait = wait/2 + rand.N(wait/2+1) // jitter: retries of many callers do not arrive together
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("%w: %s %s: %w", ErrUnavailable, method, path, last)
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

// seconds turns a header or field of whole seconds into a duration (0 when absent).
func seconds(s string) time.Duration {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}
