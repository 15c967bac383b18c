package client_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/client"
)

// script is a fake Quotaplane: each request is answered by the next of its answers
// (the last one again when they run out), and recorded with its arrival time.
type script struct {
	mu      sync.Mutex
	answers []func(w http.ResponseWriter, r *http.Request)
	at      []time.Time
	headers []http.Header
	srv     *httptest.Server
}

func newScript(t *testing.T, answers ...func(w http.ResponseWriter, r *http.Request)) *script {
	t.Helper()
	s := &script{answers: answers}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		s.mu.Lock()
		n := len(s.at)
		s.at = append(s.at, time.Now())
		s.headers = append(s.headers, r.Header.Clone())
		a := s.answers[min(n, len(s.answers)-1)]
		s.mu.Unlock()
		a(w, r)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *script) times() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.at...)
}

// unavailable answers 503 with Retry-After ra ("" for none).
func unavailable(ra string) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		if ra != "" {
			w.Header().Set("Retry-After", ra)
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(503)
		io.WriteString(w, `{"type":"https://quotaplane.dev/problems/service-unavailable","title":"Service Unavailable","status":503,"detail":"too many checks in flight"}`)
	}
}

func allowed(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"allowed":true,"mode":"enforce","levels":[]}`)
}

// hung is a Quotaplane that accepts connections and never answers.
func hung(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return "http://" + ln.Addr().String()
}

// A 503's Retry-After is waited for, as seconds or as an HTTP date, not shortened.
func TestRetryAfterHonoured(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ra      func() string
		atLeast time.Duration
	}{
		{"seconds", func() string { return "1" }, time.Second},
		// An HTTP date has whole seconds: 2 s from now is more than 1 s away.
		{"HTTP date", func() string { return time.Now().Add(2 * time.Second).UTC().Format(http.TimeFormat) }, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScript(t, func(w http.ResponseWriter, r *http.Request) { unavailable(tc.ra())(w, r) }, allowed)
			c, _ := client.New(s.srv.URL, "k", client.WithBudget(5*time.Second), client.WithFailPolicy(client.FailClosed))
			res, err := c.Check(context.Background(), client.CheckRequest{Org: "acme"})
			if err != nil || !res.Allowed || res.NotDecided {
				t.Fatalf("Check = %+v, %v; want the second attempt's allowed", res, err)
			}
			at := s.times()
			if len(at) != 2 || at[1].Sub(at[0]) < tc.atLeast || at[1].Sub(at[0]) > 2500*time.Millisecond {
				t.Errorf("%d attempts, the retry %v after the first; want it after Retry-After (%v)", len(at), at[len(at)-1].Sub(at[0]), tc.atLeast)
			}
		})
	}
}

// A Retry-After longer than what is left of the budget: the fail policy answers at
// once, without a retry, so a 503 does not bring more load.
func TestRetryAfterPastTheBudgetAnswersAtOnce(t *testing.T) {
	s := newScript(t, unavailable("5"))
	c, _ := client.New(s.srv.URL, "k", client.WithFailPolicy(client.FailOpen))
	start := time.Now()
	res, err := c.Check(context.Background(), client.CheckRequest{Org: "acme"})
	took := time.Since(start)
	var pe *client.Error
	if err != nil || !res.NotDecided || !res.Allowed || !errors.Is(res.Cause, client.ErrUnavailable) || !errors.As(res.Cause, &pe) || pe.RetryAfter != 5*time.Second {
		t.Fatalf("Check = %+v, %v; want the fail policy's answer caused by the 503", res, err)
	}
	if n := len(s.times()); n != 1 || took > 700*time.Millisecond {
		t.Errorf("%d attempts in %v; want 1, answered at once", n, took)
	}
}

// A Quotaplane that accepts and never answers: the fail policy answers within the
// budget, 1 s by default.
func TestHungAPIAnsweredWithinTheBudget(t *testing.T) {
	url := hung(t)
	for _, tc := range []struct {
		name   string
		opts   []client.Option
		budget time.Duration
	}{
		{"default budget", nil, client.DefaultBudget},
		{"WithBudget 300ms", []client.Option{client.WithBudget(300 * time.Millisecond)}, 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := client.New(url, "k", append(tc.opts, client.WithFailPolicy(client.FailOpen))...)
			start := time.Now()
			res, err := c.Check(context.Background(), client.CheckRequest{Org: "acme"})
			took := time.Since(start)
			if err != nil || !res.NotDecided || !res.Allowed || !errors.Is(res.Cause, client.ErrUnavailable) {
				t.Fatalf("Check = %+v, %v; want the fail policy's answer", res, err)
			}
			if took < tc.budget-50*time.Millisecond || took > tc.budget+700*time.Millisecond {
				t.Errorf("answered after %v; want about the budget, %v", took, tc.budget)
			}
			start = time.Now()
			rv, err := c.Reserve(context.Background(), client.ReserveRequest{Org: "acme", Amount: 1})
			if took := time.Since(start); err != nil || !rv.NotDecided || took > tc.budget+700*time.Millisecond {
				t.Errorf("Reserve = %+v, %v after %v", rv, err, took)
			}
		})
	}
}

// WithBudget(0): no budget; the timeout per attempt and the retries bound the call.
func TestNoBudget(t *testing.T) {
	url := hung(t)
	var attempts atomic.Int32
	c, _ := client.New(url, "k", client.WithBudget(0), client.WithTimeout(100*time.Millisecond), client.WithBackoff(time.Millisecond),
		client.WithFailPolicy(client.FailOpen),
		client.WithHooks(client.Hooks{OnAttempt: func(context.Context, client.AttemptInfo) { attempts.Add(1) }}))
	res, err := c.Check(context.Background(), client.CheckRequest{Org: "acme"})
	if err != nil || !res.NotDecided || attempts.Load() != 3 {
		t.Errorf("Check = %+v, %v after %d attempts; want the policy after 3", res, err, attempts.Load())
	}
}

// The caller's own deadline or cancel is the caller giving up: ctx's error, never
// the fail policy's answer (a canceled FailOpen check is not allowed). The client's
// budget running out is Quotaplane's failure: the policy.
func TestCallerCancellationIsNotAFailure(t *testing.T) {
	url := hung(t)
	var policyCalls atomic.Int32
	policy := func(context.Context, client.CheckRequest, error) bool { policyCalls.Add(1); return true }
	c, _ := client.New(url, "k", client.WithFailPolicy(policy), client.WithBudget(2*time.Second))
	calls := map[string]func(ctx context.Context) (any, error){
		"Check": func(ctx context.Context) (any, error) { return c.Check(ctx, client.CheckRequest{Org: "acme"}) },
		"CheckBatch": func(ctx context.Context) (any, error) {
			return c.CheckBatch(ctx, []client.CheckRequest{{Org: "acme"}})
		},
		"Reserve": func(ctx context.Context) (any, error) {
			return c.Reserve(ctx, client.ReserveRequest{Org: "acme", Amount: 1})
		},
	}
	for name, call := range calls {
		t.Run(name+" deadline", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := call(ctx)
			if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, client.ErrUnavailable) || time.Since(start) > 900*time.Millisecond {
				t.Errorf("err %v after %v; want context.DeadlineExceeded at once, not ErrUnavailable", err, time.Since(start))
			}
		})
		t.Run(name+" cancel", func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(100*time.Millisecond, cancel)
			_, err := call(ctx)
			if !errors.Is(err, context.Canceled) || errors.Is(err, client.ErrUnavailable) {
				t.Errorf("err %v; want context.Canceled", err)
			}
		})
	}
	if n := policyCalls.Load(); n != 0 {
		t.Errorf("the fail policy was asked %d times about calls the caller gave up", n)
	}
	// The client's own budget, shorter than the caller's deadline: the policy answers.
	short, _ := client.New(url, "k", client.WithFailPolicy(policy), client.WithBudget(200*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if res, err := short.Check(ctx, client.CheckRequest{Org: "acme"}); err != nil || !res.NotDecided || policyCalls.Load() != 1 {
		t.Errorf("budget spent: %+v, %v; want the policy's answer", res, err)
	}
}

// Errors no retry mends are returned after one attempt, never to the fail policy:
// a certificate that does not verify, a host that does not exist, the API's 401.
// A temporary DNS failure is retried and goes to the policy.
func TestConfigurationErrorsRaise(t *testing.T) {
	var handshakes atomic.Int32
	tlsSrv := httptest.NewUnstartedServer(http.HandlerFunc(allowed))
	tlsSrv.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		handshakes.Add(1)
		return nil, nil
	}}
	tlsSrv.StartTLS()
	defer tlsSrv.Close()
	var dials atomic.Int32
	dnsFails := func(notFound bool) *http.Client {
		return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return nil, &net.DNSError{Err: "no such host", Name: "quota.invalid", IsNotFound: notFound, IsTemporary: !notFound}
		}}}
	}
	unauthorized := newScript(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(401)
		io.WriteString(w, `{"type":"x","title":"Unauthorized","status":401,"detail":"invalid API key"}`)
	})
	opts := []client.Option{client.WithFailPolicy(client.FailOpen), client.WithBackoff(time.Millisecond), client.WithBudget(10 * time.Second)}

	c, _ := client.New(tlsSrv.URL, "k", opts...)
	_, err := c.Check(context.Background(), client.CheckRequest{Org: "acme"})
	var verify *tls.CertificateVerificationError
	if !errors.Is(err, client.ErrConfiguration) || !errors.As(err, &verify) || errors.Is(err, client.ErrUnavailable) || handshakes.Load() != 1 {
		t.Errorf("untrusted certificate: %v after %d handshakes; want ErrConfiguration after 1", err, handshakes.Load())
	}

	c, _ = client.New("http://quota.invalid", "k", append(opts, client.WithHTTPClient(dnsFails(true)))...)
	_, err = c.Check(context.Background(), client.CheckRequest{Org: "acme"})
	var dns *net.DNSError
	if !errors.Is(err, client.ErrConfiguration) || !errors.As(err, &dns) || dials.Load() != 1 {
		t.Errorf("NXDOMAIN: %v after %d dials; want ErrConfiguration after 1", err, dials.Load())
	}
	dials.Store(0)
	c, _ = client.New("http://quota.invalid", "k", append(opts, client.WithHTTPClient(dnsFails(false)))...)
	if res, err := c.Check(context.Background(), client.CheckRequest{Org: "acme"}); err != nil || !res.NotDecided || dials.Load() != 3 {
		t.Errorf("temporary DNS failure: %+v, %v after %d dials; want the policy after 3", res, err, dials.Load())
	}

	c, _ = client.New(unauthorized.srv.URL, "k", opts...)
	_, err = c.Check(context.Background(), client.CheckRequest{Org: "acme"})
	var pe *client.Error
	if !errors.As(err, &pe) || pe.StatusCode != 401 || errors.Is(err, client.ErrUnavailable) || len(unauthorized.times()) != 1 {
		t.Errorf("401: %v after %d attempts", err, len(unauthorized.times()))
	}

	if _, err := client.New("ftp://quota.example", "k"); !errors.Is(err, client.ErrConfiguration) {
		t.Errorf("New with ftp: %v, want ErrConfiguration", err)
	}
}

// The backoff between retries of answers without Retry-After is capped, and jittered.
func TestBackoffIsCappedWithFullJitter(t *testing.T) {
	s := newScript(t, unavailable(""))
	c, _ := client.New(s.srv.URL, "k", client.WithRetries(6), client.WithBackoff(100*time.Millisecond),
		client.WithMaxBackoff(150*time.Millisecond), client.WithBudget(10*time.Second))
	_, err := c.Check(context.Background(), client.CheckRequest{Org: "acme"})
	at := s.times()
	if !errors.Is(err, client.ErrUnavailable) || len(at) != 7 {
		t.Fatalf("%v after %d attempts, want ErrUnavailable after 7", err, len(at))
	}
	distinct := map[time.Duration]bool{}
	for i := 1; i < len(at); i++ {
		gap := at[i].Sub(at[i-1])
		if gap > 600*time.Millisecond { // the cap, and room for a loaded machine
			t.Errorf("retry %d came %v after the attempt before; the cap is 150 ms", i, gap)
		}
		distinct[gap.Round(5*time.Millisecond)] = true
	}
	if len(distinct) < 2 {
		t.Errorf("every wait the same: %v", distinct)
	}
}

// Every request says who sends it, carries WithHeaders' headers and what
// WithHeaderFunc injects from the call's context (a W3C traceparent), on every
// attempt; the hooks see each attempt, retry and decision.
func TestHeadersUserAgentAndHooks(t *testing.T) {
	s := newScript(t, unavailable("0"), allowed)
	type traceKey struct{}
	var (
		mu       sync.Mutex
		events   []string
		decision client.DecisionInfo
	)
	hooks := client.Hooks{
		OnAttempt: func(_ context.Context, a client.AttemptInfo) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, "attempt "+a.Method+" "+a.Path+" "+http.StatusText(a.Status))
		},
		OnRetry: func(_ context.Context, r client.RetryInfo) {
			mu.Lock()
			defer mu.Unlock()
			if r.RetryAfter && r.Wait == 0 {
				events = append(events, "retry after Retry-After")
			}
		},
		OnDecision: func(_ context.Context, d client.DecisionInfo) { decision = d },
	}
	c, _ := client.New(s.srv.URL, "k", client.WithHeaders(http.Header{"X-Service": {"search"}}), client.WithHooks(hooks),
		client.WithHeaderFunc(func(ctx context.Context, h http.Header) {
			if tp, ok := ctx.Value(traceKey{}).(string); ok {
				h.Set("Traceparent", tp)
			}
		}))
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := context.WithValue(context.Background(), traceKey{}, tp)
	if _, err := c.Check(ctx, client.CheckRequest{Org: "acme", User: "alice"}); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	for i, h := range s.headers {
		if h.Get("User-Agent") != "quotaplane-go/"+client.Version || h.Get("Traceparent") != tp || h.Get("X-Service") != "search" ||
			!strings.HasPrefix(h.Get("Authorization"), "Bearer ") {
			t.Errorf("attempt %d headers %v", i+1, h)
		}
	}
	s.mu.Unlock()
	want := []string{"attempt POST /v1/check Service Unavailable", "retry after Retry-After", "attempt POST /v1/check OK"}
	if strings.Join(events, "|") != strings.Join(want, "|") || !decision.Allowed || decision.Op != "check" || decision.Request.User != "alice" {
		t.Errorf("events %q, decision %+v", events, decision)
	}
}

// A batch: a 4xx item is an item error (not a denial); a 5xx item goes to the fail
// policy, as a check would, in the Go and TypeScript clients alike.
func TestBatchItemSemantics(t *testing.T) {
	s := newScript(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"results": []any{
			map[string]any{"allowed": true, "mode": "enforce", "levels": []any{}},
			map[string]any{"allowed": false, "mode": "enforce", "levels": []any{}, "retry_after_seconds": 3,
				"blocked_at": map[string]any{"level": "user", "id": "bob", "window": "minute"}},
			map[string]any{"type": "x", "title": "Unprocessable Entity", "status": 422, "detail": "unknown metric"},
			map[string]any{"type": "x", "title": "Service Unavailable", "status": 503, "detail": "redis down"},
		}})
	})
	reqs := []client.CheckRequest{{Org: "acme", User: "a"}, {Org: "acme", User: "bob"}, {Org: "acme", Metric: "x"}, {Org: "acme", User: "c"}}
	for _, tc := range []struct {
		name   string
		policy client.FailPolicy
	}{{"FailClosed", client.FailClosed}, {"no policy", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []client.Option
			if tc.policy != nil {
				opts = append(opts, client.WithFailPolicy(tc.policy))
			}
			c, _ := client.New(s.srv.URL, "k", opts...)
			items, err := c.CheckBatch(context.Background(), reqs)
			if err != nil || len(items) != 4 {
				t.Fatalf("CheckBatch = %+v, %v", items, err)
			}
			if r := items[0].Result; r == nil || !r.Allowed {
				t.Errorf("item 0: %+v", items[0])
			}
			if r := items[1].Result; r == nil || r.Allowed || r.NotDecided || r.RetryAfter != 3*time.Second {
				t.Errorf("item 1: %+v, want a denial", items[1])
			}
			if it := items[2]; it.Result != nil || it.Err == nil || it.Err.StatusCode != 422 {
				t.Errorf("item 2: %+v, want a 422 item error", it)
			}
			it := items[3]
			if tc.policy != nil && (it.Err != nil || it.Result == nil || !it.Result.NotDecided || it.Result.Allowed || !errors.Is(it.Result.Cause, client.ErrUnavailable)) {
				t.Errorf("item 3: %+v, want the fail policy's refusal", it)
			}
			if tc.policy == nil && (it.Err == nil || it.Err.StatusCode != 503) {
				t.Errorf("item 3: %+v, want a 503 item error", it)
			}
		})
	}
}
