package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/client"
)

// leaseFake is a fake Quotaplane that speaks the client leases contract: it answers
// checks allowed (a user named "deny..." denied), and leases as lease says, and keeps
// what it was asked.
type leaseFake struct {
	srv *httptest.Server

	mu sync.Mutex
	// lease answers a lease request (n: the lease requests so far, 1 for the first):
	// units (0: refused with reason), ttl.
	lease       func(n int) (units int64, ttl time.Duration, reason string)
	leaseDelay  time.Duration // before answering a lease request
	leaseRecv   []time.Time   // when each lease request arrived
	settleFails int           // the next settlements answered 503
	leases      map[string]*fakeLease
	order       []string
	leaseReqs   int
	settleReqs  int
	renews      int
	checks      int
	batches     int
	batchItems  int
	open        int // leases taken and not settled
	maxOpen     int
	rates       []float64
}

type fakeLease struct {
	units    int64
	taken    time.Time // when the answer was written
	ttl      time.Duration
	settled  bool
	used     int64
	settleAt time.Time
}

func newLeaseFake(t *testing.T) *leaseFake {
	t.Helper()
	f := &leaseFake{leases: map[string]*fakeLease{},
		lease: func(int) (int64, time.Duration, string) { return 1000, 300 * time.Millisecond, "" }}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *leaseFake) checkAnswer(user string) (int, map[string]any) {
	allowed := !strings.HasPrefix(user, "deny")
	a := map[string]any{"allowed": allowed, "mode": "enforce",
		"levels": []map[string]any{{"level": "user", "id": user, "window": "minute", "limit": 10, "used": 1, "remaining": 9,
			"reset_at": time.Now().Add(time.Minute).UTC().Format(time.RFC3339)}}}
	if !allowed {
		a["blocked_at"] = map[string]any{"level": "user", "id": user, "window": "minute"}
		a["retry_after_seconds"] = 7
		return http.StatusTooManyRequests, a
	}
	return http.StatusOK, a
}

// newLease answers a lease (or none), as POST /v1/leases and a renewing settle do.
// f.mu is held.
func (f *leaseFake) newLease() (int, map[string]any) {
	f.leaseReqs++
	units, ttl, reason := f.lease(f.leaseReqs)
	if units == 0 {
		return http.StatusOK, map[string]any{"units": 0, "reason": reason, "ttl_ms": ttl.Milliseconds()}
	}
	id := fmt.Sprintf("lease-%d", f.leaseReqs)
	now := time.Now()
	f.leases[id] = &fakeLease{units: units, taken: now, ttl: ttl}
	f.order = append(f.order, id)
	f.open++
	f.maxOpen = max(f.maxOpen, f.open)
	return http.StatusCreated, map[string]any{"id": id, "units": units, "ttl_ms": ttl.Milliseconds(),
		"expires_at": now.Add(ttl).UTC().Format(time.RFC3339Nano), "settle_by": now.Add(ttl + 5*time.Second).UTC().Format(time.RFC3339Nano),
		"levels": []map[string]any{{"level": "org", "id": "acme", "window": "month", "limit": 1000000, "used": units,
			"remaining": 1000000 - units, "reset_at": now.Add(time.Hour).UTC().Format(time.RFC3339)}}}
}

func (f *leaseFake) serve(w http.ResponseWriter, r *http.Request) {
	write := func(status int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(v)
	}
	switch {
	case r.URL.Path == "/v1/check":
		var in struct{ User string }
		_ = json.NewDecoder(r.Body).Decode(&in)
		f.mu.Lock()
		f.checks++
		f.mu.Unlock()
		write(f.checkAnswer(in.User))
	case r.URL.Path == "/v1/check/batch":
		var in struct {
			Checks []struct{ User, Metric string }
		}
		_ = json.NewDecoder(r.Body).Decode(&in)
		f.mu.Lock()
		f.batches++
		f.batchItems += len(in.Checks)
		f.mu.Unlock()
		results := make([]any, len(in.Checks))
		for i, c := range in.Checks {
			switch c.Metric {
			case "nope":
				results[i] = map[string]any{"type": "about:blank", "title": "Unprocessable", "status": 422, "detail": "metric nope: unknown"}
			case "flaky":
				results[i] = map[string]any{"type": "about:blank", "title": "Unavailable", "status": 503, "detail": "redis down"}
			default:
				_, results[i] = f.checkAnswer(c.User)
			}
		}
		write(http.StatusOK, map[string]any{"results": results})
	case r.URL.Path == "/v1/leases":
		var in struct{ Rate float64 }
		_ = json.NewDecoder(r.Body).Decode(&in)
		recv := time.Now()
		time.Sleep(f.leaseDelay)
		f.mu.Lock()
		f.leaseRecv = append(f.leaseRecv, recv)
		defer f.mu.Unlock()
		f.rates = append(f.rates, in.Rate)
		write(f.newLease())
	case strings.HasPrefix(r.URL.Path, "/v1/leases/") && strings.HasSuffix(r.URL.Path, "/settle"):
		id := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/leases/"), "/settle")
		var in struct {
			Used  int64
			Renew bool
		}
		_ = json.NewDecoder(r.Body).Decode(&in)
		f.mu.Lock()
		defer f.mu.Unlock()
		f.settleReqs++
		if f.settleFails > 0 {
			f.settleFails--
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"type":"about:blank","title":"Unavailable","status":503}`))
			return
		}
		l := f.leases[id]
		if l == nil {
			write(http.StatusNotFound, map[string]any{"type": "about:blank", "title": "Not Found", "status": 404})
			return
		}
		if !l.settled {
			l.settled, l.used, l.settleAt = true, in.Used, time.Now()
			f.open--
		}
		out := map[string]any{"settled": map[string]any{"used": l.used, "released": max(l.units-l.used, 0)}, "next": nil}
		if in.Renew {
			f.renews++
			_, out["next"] = f.newLease()
		}
		write(http.StatusOK, out)
	default:
		http.NotFound(w, r)
	}
}

// settled returns the units the settled leases admitted, and how many are unsettled.
func (f *leaseFake) settled() (used int64, unsettled int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, l := range f.leases {
		if l.settled {
			used += l.used
		} else {
			unsettled++
		}
	}
	return used, unsettled
}

func (f *leaseFake) client(t *testing.T, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(f.srv.URL, "k", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// hammer runs workers goroutines checking req until stop, and returns the checks
// allowed from a lease and those decided by the server.
func hammer(t *testing.T, c *client.Client, req client.CheckRequest, workers int, d time.Duration) (leased, sent int64) {
	t.Helper()
	var l, s atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				res, err := c.Check(context.Background(), req)
				if err != nil {
					t.Error(err)
					return
				}
				if res.Leased {
					if !res.Allowed || len(res.Levels) == 0 || res.Mode != "enforce" {
						t.Errorf("leased result %+v", res)
					}
					l.Add(1)
				} else {
					s.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return l.Load(), s.Load()
}

// A hot path is admitted in process; every lease is settled with exactly what it
// admitted, never more than its units, at most one unsettled at a time, renewed
// ahead in the settlement's round trip, and Close settles the last.
func TestLeasesAdmitAHotPathInProcess(t *testing.T) {
	f := newLeaseFake(t)
	c := f.client(t, client.WithLeases())
	leased, sent := hammer(t, c, client.CheckRequest{Org: "acme", Team: "eng", User: "alice"}, 8, 700*time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	used, unsettled := f.settled()
	f.mu.Lock()
	defer f.mu.Unlock()
	t.Logf("leased %d, sent %d, lease requests %d, settlements %d (renewing %d), checks sent %d", leased, sent, f.leaseReqs,
		f.settleReqs, f.renews, f.checks)
	if used != leased || unsettled != 0 {
		t.Errorf("settled %d units (%d leases unsettled), admitted %d from leases", used, unsettled, leased)
	}
	if sent != int64(f.checks) || leased < 10*sent {
		t.Errorf("%d checks sent (server saw %d) beside %d leased", sent, f.checks, leased)
	}
	if f.maxOpen != 1 {
		t.Errorf("at most %d leases unsettled at once, want 1", f.maxOpen)
	}
	if f.renews == 0 {
		t.Error("no lease renewed in its settlement")
	}
	for id, l := range f.leases {
		if l.used > l.units {
			t.Errorf("%s admitted %d of %d units", id, l.used, l.units)
		}
	}
	if f.rates[0] < client.DefaultLeaseThreshold {
		t.Errorf("first lease asked at rate %v, under the threshold", f.rates[0])
	}
}

// The local deadline is the client's clock when it sent the request plus ttl_ms:
// a lease answered late has that much less life.
func TestLeaseEndsAtSendTimePlusTTL(t *testing.T) {
	f := newLeaseFake(t)
	const ttl = 80 * time.Millisecond
	f.leaseDelay = 50 * time.Millisecond
	f.lease = func(n int) (int64, time.Duration, string) {
		if n == 1 {
			return 1 << 40, ttl, ""
		}
		return 0, 10 * time.Second, "near_limit"
	}
	c := f.client(t, client.WithLeases(), client.WithLeaseThreshold(10))
	defer c.Close()
	var lastLeased time.Time
	var n int
	for end := time.Now().Add(400 * time.Millisecond); time.Now().Before(end); {
		begin := time.Now()
		res, err := c.Check(context.Background(), client.CheckRequest{Org: "acme", User: "alice"})
		if err != nil {
			t.Fatal(err)
		}
		if res.Leased {
			n++
			lastLeased = begin
		}
		time.Sleep(100 * time.Microsecond)
	}
	f.mu.Lock()
	sentAt := f.leaseRecv[0] // the request was sent before it arrived
	f.mu.Unlock()
	if n == 0 {
		t.Fatal("nothing leased")
	}
	if late := lastLeased.Sub(sentAt); late >= ttl {
		t.Errorf("a check begun %v after the lease was asked was leased; its ttl is %v", late, ttl)
	}
	t.Logf("%d leased, the last begun %v after the lease request (ttl %v, answered after %v)", n, lastLeased.Sub(sentAt), ttl, f.leaseDelay)
}

// A 0-units answer sends the path's checks one by one for its ttl_ms, then the
// path may ask again.
func TestLeaseRefusedChecksOneByOne(t *testing.T) {
	f := newLeaseFake(t)
	f.lease = func(int) (int64, time.Duration, string) { return 0, 500 * time.Millisecond, "client_leases_off" }
	var refused atomic.Int32
	c := f.client(t, client.WithLeases(), client.WithLeaseThreshold(10), client.WithHooks(client.Hooks{
		OnLease: func(l client.LeaseInfo) {
			if l.Event == client.LeaseRefused && l.Reason == "client_leases_off" {
				refused.Add(1)
			}
		}}))
	defer c.Close()
	req := client.CheckRequest{Org: "acme", User: "alice"}
	leased, sent := hammer(t, c, req, 2, 300*time.Millisecond)
	f.mu.Lock()
	asked := f.leaseReqs
	f.mu.Unlock()
	if leased != 0 || asked != 1 || refused.Load() != 1 {
		t.Fatalf("leased %d of %d; %d lease requests (%d refusals seen), want 0 leased and 1 request", leased, leased+sent, asked, refused.Load())
	}
	time.Sleep(300 * time.Millisecond)
	hammer(t, c, req, 2, 200*time.Millisecond)
	f.mu.Lock()
	asked = f.leaseReqs
	f.mu.Unlock()
	if asked != 2 {
		t.Errorf("%d lease requests after the ttl_ms, want 2", asked)
	}
}

// Checks of several metrics, queries and checks with the caller's idempotency key
// are never leased, however hot.
func TestLeasesNotForCostsQueriesOrKeys(t *testing.T) {
	f := newLeaseFake(t)
	c := f.client(t, client.WithLeases(), client.WithLeaseThreshold(1))
	defer c.Close()
	for name, req := range map[string]client.CheckRequest{
		"costs": {Org: "acme", User: "alice", Costs: map[string]int64{"requests": 1, "tokens": 5}},
		"query": {Org: "acme", User: "alice", Query: true},
		"key":   {Org: "acme", User: "alice", IdempotencyKey: "my-key-123"},
	} {
		if leased, _ := hammer(t, c, req, 2, 150*time.Millisecond); leased != 0 {
			t.Errorf("%s: %d leased", name, leased)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.leaseReqs != 0 {
		t.Errorf("%d lease requests", f.leaseReqs)
	}
}

// A lease whose path went quiet is settled by its timer within a second of its
// end, with what it admitted.
func TestLeaseSettledWithinASecondOfItsEnd(t *testing.T) {
	f := newLeaseFake(t)
	f.lease = func(int) (int64, time.Duration, string) { return 1 << 30, 300 * time.Millisecond, "" }
	c := f.client(t, client.WithLeases())
	defer c.Close()
	leased, _ := hammer(t, c, client.CheckRequest{Org: "acme", User: "alice"}, 4, 100*time.Millisecond)
	time.Sleep(1500 * time.Millisecond)
	used, unsettled := f.settled()
	if leased == 0 || used != leased || unsettled != 0 {
		t.Fatalf("leased %d; settled %d with %d unsettled before Close", leased, used, unsettled)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, l := range f.leases {
		if late := l.settleAt.Sub(l.taken.Add(l.ttl)); late > time.Second {
			t.Errorf("%s settled %v after its end", id, late)
		}
	}
}

// A failed settlement is retried; meanwhile the path is checked one by one, and no
// second lease is taken before the first is settled.
func TestLeaseSettlementRetried(t *testing.T) {
	f := newLeaseFake(t)
	f.lease = func(int) (int64, time.Duration, string) { return 200, 200 * time.Millisecond, "" }
	f.settleFails = 6 // six attempts answered 503: the renewing one, then retries without renew
	c := f.client(t, client.WithLeases(), client.WithBackoff(time.Millisecond))
	leased, sent := hammer(t, c, client.CheckRequest{Org: "acme", User: "alice"}, 4, 800*time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	used, unsettled := f.settled()
	f.mu.Lock()
	defer f.mu.Unlock()
	t.Logf("leased %d, sent %d; %d settlements asked for %d leases", leased, sent, f.settleReqs, len(f.leases))
	if used != leased || unsettled != 0 || f.maxOpen != 1 || sent == 0 {
		t.Errorf("settled %d of %d leased, %d unsettled, %d open at once, %d sent", used, leased, unsettled, f.maxOpen, sent)
	}
}

// Close settles every path's lease (nothing renewed) and waits for it.
func TestCloseSettlesEveryLease(t *testing.T) {
	f := newLeaseFake(t)
	f.lease = func(int) (int64, time.Duration, string) { return 1 << 30, time.Second, "" }
	c := f.client(t, client.WithLeases())
	var total atomic.Int64
	var wg sync.WaitGroup
	for u := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, _ := hammer(t, c, client.CheckRequest{Org: "acme", User: fmt.Sprint("u", u)}, 2, 300*time.Millisecond)
			total.Add(l)
		}()
	}
	wg.Wait()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	used, unsettled := f.settled()
	if unsettled != 0 || used != total.Load() || total.Load() == 0 {
		t.Errorf("after Close: %d unsettled, settled %d of %d leased", unsettled, used, total.Load())
	}
	res, err := c.Check(context.Background(), client.CheckRequest{Org: "acme", User: "u1"})
	if err != nil || res.Leased {
		t.Errorf("a check after Close = %+v, %v; want one sent", res, err)
	}
}

// 1,000 concurrent checks with batching cost at most 20 requests; each caller gets
// its own item: its user's decision, its own error.
func TestBatchingCoalescesConcurrentChecks(t *testing.T) {
	f := newLeaseFake(t)
	c := f.client(t, client.WithBatching(20*time.Millisecond))
	const n = 1000
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			user := fmt.Sprint("u", i)
			if i%3 == 0 {
				user = fmt.Sprint("deny", i)
			}
			req := client.CheckRequest{Org: "acme", User: user}
			if i%100 == 7 {
				req.Metric = "nope"
			}
			res, err := c.Check(context.Background(), req)
			var e *client.Error
			switch {
			case req.Metric == "nope":
				if !errors.As(err, &e) || e.StatusCode != 422 || res != nil {
					errs <- fmt.Errorf("check %d (unknown metric) = %+v, %v", i, res, err)
				}
			case err != nil:
				errs <- fmt.Errorf("check %d: %v", i, err)
			case res.Levels[0].ID != user || res.Allowed == strings.HasPrefix(user, "deny") || res.Leased ||
				(!res.Allowed && (res.RetryAfter != 7*time.Second || res.BlockedAt == nil)):
				errs <- fmt.Errorf("check %d of %s = %+v", i, user, res)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t.Logf("%d checks: %d batches (%d items), %d single checks", n, f.batches, f.batchItems, f.checks)
	if reqs := f.batches + f.checks; reqs > 20 || f.batchItems+f.checks != n {
		t.Errorf("%d requests (%d items), want <= 20 carrying %d", reqs, f.batchItems+f.checks, n)
	}
}

// A lone check is sent as a check; an item the batch could not decide is sent again
// on its own, and its caller gets that check's answer.
func TestBatchingLoneAndUndecidedChecks(t *testing.T) {
	f := newLeaseFake(t)
	c := f.client(t, client.WithBatching(5*time.Millisecond), client.WithRetries(0))
	res, err := c.Check(context.Background(), client.CheckRequest{Org: "acme", User: "alice"})
	if err != nil || !res.Allowed {
		t.Fatalf("lone check = %+v, %v", res, err)
	}
	var wg sync.WaitGroup
	var flaky, fine atomic.Int32
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := client.CheckRequest{Org: "acme", User: "bob"}
			if i == 0 {
				req.Metric = "flaky"
			}
			res, err := c.Check(context.Background(), req)
			switch {
			case i == 0 && err == nil && res.Allowed: // the fake's /v1/check allows it
				flaky.Add(1)
			case i > 0 && err == nil && res.Allowed:
				fine.Add(1)
			default:
				t.Errorf("check %d = %+v, %v", i, res, err)
			}
		}()
	}
	wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.batches != 1 || f.checks != 2 || flaky.Load() != 1 || fine.Load() != 9 {
		t.Errorf("%d batches and %d checks sent; %d+%d answered", f.batches, f.checks, flaky.Load(), fine.Load())
	}
}

// The caller's cancel ends its wait for the batch.
func TestBatchingCallerCancel(t *testing.T) {
	f := newLeaseFake(t)
	c := f.client(t, client.WithBatching(200*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Check(ctx, client.CheckRequest{Org: "acme", User: "alice"})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 150*time.Millisecond {
		t.Errorf("Check = %v after %v; want the caller's deadline", err, time.Since(start))
	}
}
