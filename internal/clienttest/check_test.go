package clienttest

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/quotaplane/quotaplane/client"
)

// Allowed checks, then a denied one, with the levels, RateLimit-* and Retry-After
// mapped into the result; errors carry the problem document.
func TestCheckAllowedAndDenied(t *testing.T) {
	e := newEnv(t, "")
	c := e.client()
	ctx := context.Background()
	alice := client.CheckRequest{Org: e.org, Team: "eng", User: "alice"}
	for i := 1; i <= 3; i++ {
		res, err := c.Check(ctx, alice)
		if err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
		want := []client.Level{
			{Level: "org", ID: e.org, Window: "minute", Limit: 50, Used: int64(i), Remaining: int64(50 - i)},
			{Level: "user", ID: "alice", Window: "minute", Limit: 3, Used: int64(i), Remaining: int64(3 - i)},
		}
		if d := cmp.Diff(want, res.Levels, cmpopts.IgnoreFields(client.Level{}, "ResetAt")); d != "" || !res.Allowed || res.Mode != "enforce" {
			t.Errorf("check %d: allowed %v mode %q, levels (-want +got):\n%s", i, res.Allowed, res.Mode, d)
		}
		if rl := res.RateLimit; rl.Limit != 3 || rl.Remaining != int64(3-i) || rl.Reset <= 0 || rl.Reset > 63*time.Second {
			t.Errorf("check %d: RateLimit %+v, want the user's minute: 3, %d left", i, rl, 3-i)
		}
		if res.BlockedAt != nil || res.RetryAfter != 0 || res.Replayed || res.Degraded || res.NotDecided || len(res.IdempotencyKey) < 8 {
			t.Errorf("check %d: %+v", i, res)
		}
	}
	res, err := c.Check(ctx, alice)
	if err != nil {
		t.Fatal(err)
	}
	if res.Allowed || res.BlockedAt == nil || *res.BlockedAt != (client.LevelRef{Level: "user", ID: "alice", Window: "minute"}) {
		t.Fatalf("fourth check: %+v, want denied at alice's minute", res)
	}
	if res.RetryAfter <= 0 || res.RetryAfter > 2*time.Minute || res.RateLimit != (client.RateLimit{Limit: 3, Remaining: 0, Reset: res.RetryAfter, Policy: "user-minute"}) {
		t.Errorf("denied: retry after %v, RateLimit %+v; want RateLimit-Reset = Retry-After", res.RetryAfter, res.RateLimit)
	}
	// The draft-11 fields: one policy per limit of the path, and the one that refused.
	wantPolicies := []client.Policy{{Name: "org-minute", Quota: 50, Window: time.Minute}, {Name: "user-minute", Quota: 3, Window: time.Minute}}
	if d := cmp.Diff(wantPolicies, res.Policies); d != "" || len(res.ViolatedPolicies) != 1 || res.ViolatedPolicies[0] != "user-minute" {
		t.Errorf("denied: policies (-want +got):\n%s violated %q", d, res.ViolatedPolicies)
	}
	if got := e.used("requests", "user", "minute"); got != 3 {
		t.Errorf("alice used %d, want 3 (a denial counts nothing)", got)
	}

	// Errors: the problem document, by errors.As.
	var pe *client.Error
	_, err = c.Check(ctx, client.CheckRequest{Org: e.org, Team: "eng", User: "alice", Metric: "gpu_hours"})
	if !errors.As(err, &pe) || pe.StatusCode != 422 || pe.Problem.Status != 422 || !strings.Contains(pe.Problem.Detail, "gpu_hours") ||
		len(pe.Problem.Errors) != 1 || pe.Problem.Errors[0].Field != "metric" {
		t.Errorf("unknown metric: %v (%+v)", err, pe)
	}
	_, err = c.Check(ctx, client.CheckRequest{Org: e.org, User: "carol"})
	if !errors.As(err, &pe) || pe.StatusCode != 400 || len(pe.Problem.Errors) != 1 || pe.Problem.Errors[0].Field != "team" {
		t.Errorf("unregistered user without a team: %v (%+v)", err, pe)
	}
	bad, _ := client.New(e.url(), "qpk_not-a-key", client.WithFailPolicy(client.FailOpen))
	_, err = bad.Check(ctx, alice)
	if !errors.As(err, &pe) || pe.StatusCode != 401 || errors.Is(err, client.ErrUnavailable) {
		t.Errorf("bad key (a fail policy does not hide it): %v", err)
	}

	// A batch: denied, refused and allowed, each in its place.
	items, err := c.CheckBatch(ctx, []client.CheckRequest{alice,
		{Org: e.org, Team: "eng", User: "bob", Metric: "gpu_hours"},
		{Org: e.org, Team: "eng", User: "bob", Metric: "tokens", Cost: 250}})
	if err != nil || len(items) != 3 {
		t.Fatalf("CheckBatch = %+v, %v", items, err)
	}
	if r := items[0].Result; r == nil || r.Allowed || r.BlockedAt == nil || r.RetryAfter <= 0 || r.RateLimit.Reset != r.RetryAfter {
		t.Errorf("batch item 0: %+v, want alice denied", items[0])
	}
	if it := items[1]; it.Result != nil || it.Err == nil || it.Err.StatusCode != 422 || it.Err.Problem.Errors[0].Field != "metric" {
		t.Errorf("batch item 1: %+v, want a 422 problem", items[1])
	}
	if r := items[2].Result; r == nil || !r.Allowed || r.RateLimit.Limit != 1000 || r.RateLimit.Remaining != 750 {
		t.Errorf("batch item 2: %+v, want bob's 250 tokens allowed, 750 left", items[2])
	}
}

// dropFirstReply is a TCP proxy to addr that forwards every request, and, on the first
// connection only, reads the start of the api's reply and closes the connection
// instead of passing it on: the check was decided and counted, the caller never heard.
type dropFirstReply struct {
	ln      net.Listener
	conns   atomic.Int32
	dropped atomic.Bool
	wg      sync.WaitGroup
	mu      sync.Mutex
	open    []net.Conn // closed at the end: the client keeps its connection alive
}

func newDropFirstReply(t *testing.T, addr string) *dropFirstReply {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dropFirstReply{ln: ln}
	go func() {
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			n := p.conns.Add(1)
			p.mu.Lock()
			p.open = append(p.open, down)
			p.mu.Unlock()
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				defer down.Close()
				up, err := net.Dial("tcp", addr)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, down); up.Close() }()
				if n == 1 {
					buf := make([]byte, 1)
					if _, err := io.ReadFull(up, buf); err == nil { // the api answered
						p.dropped.Store(true)
					}
					return
				}
				_, _ = io.Copy(down, up)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.open {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// The first reply of a check is lost after the api counted it: the client retries
// with the same idempotency key, gets the first decision replayed, and the units are
// counted once.
func TestLostReplyRetriedCountsOnce(t *testing.T) {
	e := newEnv(t, "")
	proxy := newDropFirstReply(t, e.st.APIAddr)
	c, _ := client.New("http://"+proxy.ln.Addr().String(), e.key, client.WithBackoff(10*time.Millisecond))
	res, err := c.Check(context.Background(), client.CheckRequest{Org: e.org, Team: "eng", User: "alice", Metric: "tokens", Cost: 40})
	if err != nil {
		t.Fatal(err)
	}
	if !proxy.dropped.Load() || proxy.conns.Load() < 2 {
		t.Fatalf("the proxy dropped %v, saw %d connections: the lost reply did not happen", proxy.dropped.Load(), proxy.conns.Load())
	}
	if !res.Allowed || !res.Replayed {
		t.Errorf("retried check: %+v, want allowed and replayed", res)
	}
	if got := e.used("tokens", "org", "month"); got != 40 {
		t.Errorf("tokens used %d, want 40: the retry counted again", got)
	}
	t.Logf("%d connections through the proxy; the first reply dropped; the retry answered replayed", proxy.conns.Load())
}

// Quotaplane down: unreachable (nothing listens), or up but unable to decide (503:
// the org's Redis is down and its plan fails closed). Without a policy the client
// returns ErrUnavailable; with one, the policy's answer, marked as not Quotaplane's.
func TestQuotaplaneDownUnderEachFailPolicy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadRedis := ln.Addr().String()
	ln.Close()
	e := newEnv(t, `,"redis_url":"redis://`+deadRedis+`/0","redis_url_check":false`)
	e.op("PATCH", "/v1/plans/p-"+e.org, `{"fail_mode":"closed"}`, 200)
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAPI := "http://" + ln.Addr().String()
	ln.Close()

	var calls atomic.Int32
	onlyRequests := func(_ context.Context, r client.CheckRequest, err error) bool {
		calls.Add(1)
		return r.Metric == "" && errors.Is(err, client.ErrUnavailable)
	}
	for _, down := range []struct {
		name, url string
		status    int // of the *Error found in the cause; 0: none (no answer)
	}{{"unreachable", deadAPI, 0}, {"503", e.url(), 503}} {
		for _, tc := range []struct {
			name    string
			policy  client.FailPolicy
			metric  string
			allowed bool
		}{
			{"no policy", nil, "", false},
			{"fail open", client.FailOpen, "tokens", true},
			{"fail closed", client.FailClosed, "", false},
			{"function allows", onlyRequests, "", true},
			{"function denies", onlyRequests, "tokens", false},
		} {
			t.Run(down.name+"/"+tc.name, func(t *testing.T) {
				opts := []client.Option{client.WithRetries(1), client.WithBackoff(10 * time.Millisecond)}
				if tc.policy != nil {
					opts = append(opts, client.WithFailPolicy(tc.policy))
				}
				c, _ := client.New(down.url, e.key, opts...)
				res, err := c.Check(context.Background(), client.CheckRequest{Org: e.org, Team: "eng", User: "alice", Metric: tc.metric})
				cause := err
				if tc.policy == nil {
					if res != nil || !errors.Is(err, client.ErrUnavailable) {
						t.Fatalf("Check = %+v, %v; want ErrUnavailable", res, err)
					}
				} else {
					if err != nil {
						t.Fatal(err)
					}
					if res.Allowed != tc.allowed || !res.NotDecided || !errors.Is(res.Cause, client.ErrUnavailable) || len(res.Levels) != 0 {
						t.Fatalf("Check = %+v; want allowed %v, not decided", res, tc.allowed)
					}
					cause = res.Cause
				}
				var pe *client.Error
				if got := errors.As(cause, &pe); got != (down.status != 0) || (got && (pe.StatusCode != down.status || pe.Problem.Status != down.status)) {
					t.Errorf("cause %v: want a %d problem: %v", cause, down.status, got)
				}
			})
		}
	}
	if calls.Load() != 4 {
		t.Errorf("the policy function ran %d times, want 4", calls.Load())
	}
}
