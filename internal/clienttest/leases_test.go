package clienttest

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/client"
)

// leasePlan is a plan whose paths lease freely: tokens of a billion a month, requests
// of a million a minute (team eng's users: 3 requests a minute).
const leasePlan = `{"metric":"tokens","window":"month","limit":1000000000},{"metric":"requests","window":"minute","limit":1000000}`

// usedBy is what the level and window of metric has used, by user of eng, read with a
// query through the operator token.
func (e *env) usedBy(user, metric, level, window string) int64 {
	e.t.Helper()
	c, _ := client.New(e.url(), e.st.OperatorToken)
	res, err := c.Check(e.t.Context(), client.CheckRequest{Org: e.org, Team: "eng", User: user, Metric: metric, Query: true})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, l := range res.Levels {
		if l.Level == level && l.Window == window {
			return l.Used
		}
	}
	e.t.Fatalf("no %s %s level of %s in %+v", level, window, metric, res.Levels)
	return 0
}

// run has workers goroutines check req through c for d, and returns the checks
// allowed, how many of them were leased, and the denials.
func run(t *testing.T, c *client.Client, req client.CheckRequest, workers int, d time.Duration) (allowed, leased, denied int64) {
	t.Helper()
	var a, l, n atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				res, err := c.Check(context.Background(), req)
				switch {
				case err != nil:
					t.Error(err)
					return
				case res.Allowed:
					a.Add(1)
					if res.Leased {
						l.Add(1)
					}
				default:
					n.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return a.Load(), l.Load(), n.Load()
}

// A hot path through WithLeases runs at least 50 times the checks a second of the
// plain client from the same process, and what both admitted is counted exactly once
// their leases are settled (Close).
func TestLeasesHotPathFiftyTimesThePlainClient(t *testing.T) {
	e := newEnvPlan(t, leasePlan, "")
	req := client.CheckRequest{Org: e.org, Team: "eng", User: "alice", Metric: "tokens"}
	const workers, d = 8, time.Second
	plain := e.client()
	pa, pl, pd := run(t, plain, req, workers, d)
	leasing := e.client(client.WithLeases())
	wa, _, _ := run(t, leasing, req, workers, 200*time.Millisecond) // the path turns hot, its first lease taken
	la, ll, ld := run(t, leasing, req, workers, d)
	if err := leasing.Close(); err != nil {
		t.Fatal(err)
	}
	plainRate, leasedRate := float64(pa+pd)/d.Seconds(), float64(la+ld)/d.Seconds()
	t.Logf("plain client: %.0f checks/s; with leases: %.0f checks/s (%.1f%% leased): %.0fx", plainRate, leasedRate,
		100*float64(ll)/float64(la+ld), leasedRate/plainRate)
	if pl != 0 || pd != 0 || ld != 0 {
		t.Errorf("plain: %d leased, %d denied; leasing: %d denied", pl, pd, ld)
	}
	if leasedRate < 50*plainRate {
		t.Errorf("with leases %.0f checks/s, under 50x the plain client's %.0f", leasedRate, plainRate)
	}
	if used := e.usedBy("alice", "tokens", "org", "month"); used != pa+wa+la {
		t.Errorf("tokens used %d, admitted %d (plain %d, leased client %d)", used, pa+wa+la, pa, wa+la)
	}
}

// Client leases off for the org: nothing is leased, every check goes to the api.
func TestLeasesOffForTheOrg(t *testing.T) {
	e := newEnvLeasesOff(t, leasePlan)
	var refusals atomic.Int64
	c := e.client(client.WithLeases(), client.WithHooks(client.Hooks{OnLease: func(l client.LeaseInfo) {
		if l.Event == client.LeaseRefused && l.Reason == "client_leases_off" {
			refusals.Add(1)
		}
	}}))
	defer c.Close()
	allowed, leased, _ := run(t, c, client.CheckRequest{Org: e.org, Team: "eng", User: "alice", Metric: "tokens"}, 8, time.Second)
	t.Logf("%d checks allowed, %d leased, %d lease refusals", allowed, leased, refusals.Load())
	if leased != 0 || allowed == 0 || refusals.Load() == 0 {
		t.Errorf("%d of %d checks leased, %d refusals naming client_leases_off", leased, allowed, refusals.Load())
	}
	if used := e.usedBy("alice", "tokens", "org", "month"); used != allowed {
		t.Errorf("tokens used %d, allowed %d", used, allowed)
	}
}

// newEnvLeasesOff is newEnvPlan with the org's client_leases "off" (PATCH /v1/orgs),
// skipping the test when the api does not know the field yet.
func newEnvLeasesOff(t *testing.T, planLimits string) *env {
	t.Helper()
	e := newEnvPlan(t, planLimits, "")
	req, _ := http.NewRequest("PATCH", e.url()+"/v1/orgs/"+e.org, strings.NewReader(`{"client_leases":"off"}`))
	req.Header.Set("Authorization", "Bearer "+e.st.OperatorToken)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if org := e.op("GET", "/v1/orgs/"+e.org, "", 200); res.StatusCode != http.StatusOK || !strings.Contains(string(org), `"client_leases":"off"`) {
		t.Skipf("PATCH /v1/orgs/{org} {\"client_leases\":\"off\"} answered %d and GET shows %s: the org's client_leases field is not on this branch yet", res.StatusCode, org)
	}
	return e
}

// countingTransport counts the requests it carries, by path.
type countingTransport struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.n[r.URL.Path]++
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

// 1,000 concurrent cold checks from one client with batching (and leases: cold paths
// are not leased) cost at most 20 requests, and each is decided on its own: users near
// their limit get exactly what is left, the others all they ask.
func TestBatchingThousandColdChecks(t *testing.T) {
	e := newEnvPlan(t, leasePlan, "")
	const users = 500 // each checked twice; team eng allows 3 requests a minute
	user := func(i int) string { return fmt.Sprintf("u%03d", i) }
	plain := e.client()
	var charge []client.CheckRequest // the even users have 2 of their 3 used
	for i := 0; i < users; i += 2 {
		charge = append(charge, client.CheckRequest{Org: e.org, Team: "eng", User: user(i), Cost: 2})
	}
	for len(charge) > 0 {
		n := min(len(charge), 100)
		items, err := plain.CheckBatch(t.Context(), charge[:n])
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			if it.Err != nil || !it.Result.Allowed {
				t.Fatalf("charging: %+v", it)
			}
		}
		charge = charge[n:]
	}
	ct := &countingTransport{n: map[string]int{}}
	c := e.client(client.WithLeases(), client.WithBatching(20*time.Millisecond), client.WithHTTPClient(&http.Client{Transport: ct}))
	defer c.Close()
	allowed := make([]atomic.Int32, users)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 2 * users {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			u := i % users
			res, err := c.Check(context.Background(), client.CheckRequest{Org: e.org, Team: "eng", User: user(u)})
			if err != nil {
				t.Error(err)
				return
			}
			var mine bool
			for _, l := range res.Levels {
				mine = mine || (l.Level == "user" && l.ID == user(u))
			}
			if !mine || res.Leased {
				t.Errorf("check of %s = %+v", user(u), res)
			}
			if res.Allowed {
				allowed[u].Add(1)
			} else if res.BlockedAt == nil || res.BlockedAt.Level != "user" || res.BlockedAt.ID != user(u) || res.RetryAfter <= 0 {
				t.Errorf("denial of %s = %+v", user(u), res)
			}
		}()
	}
	close(start)
	wg.Wait()
	for u := range users {
		want := int32(2)
		if u%2 == 0 {
			want = 1
		}
		if got := allowed[u].Load(); got != want {
			t.Errorf("%s: %d of 2 allowed, want %d", user(u), got, want)
		}
	}
	ct.mu.Lock()
	defer ct.mu.Unlock()
	total := 0
	for _, n := range ct.n {
		total += n
	}
	t.Logf("1000 checks: %d requests %v", total, ct.n)
	if total > 20 {
		t.Errorf("%d requests for 1000 checks, want <= 20", total)
	}
}

// leaseChildEnv names the environment that makes TestLeaseChild the child process of
// TestLeasesKilledProcess.
const leaseChildEnv = "QUOTAPLANE_LEASE_CHILD"

// Two client processes with leases share a month limit; one is killed -9 mid-load.
// What they admitted (each admission reported on stdout before it counts as done)
// stays within the limit; after the worker's sweep, what the api counted covers it,
// and exceeds it by no more than the killed process's unsettled leases (read from
// its lease lines), a check in flight per worker, and the one lease it may have been
// taking (at most 1/16 of the headroom).
func TestLeasesKilledProcess(t *testing.T) {
	const limit, workers = 20000, 4
	e := newEnvPlan(t, `{"metric":"tokens","window":"month","limit":20000},{"metric":"requests","window":"minute","limit":1000}`, "")
	type child struct {
		cmd      *exec.Cmd
		admitted atomic.Int64
		mu       sync.Mutex
		open     map[string]int64 // lease id -> units: taken, not settled
		done     chan struct{}
	}
	start := func(runFor time.Duration) *child {
		ch := &child{open: map[string]int64{}, done: make(chan struct{})}
		ch.cmd = exec.Command(os.Args[0], "-test.run=^TestLeaseChild$", "-test.count=1")
		ch.cmd.Env = append(os.Environ(), leaseChildEnv+"="+strings.Join([]string{e.url(), e.key, e.org,
			strconv.Itoa(workers), runFor.String()}, " "))
		out, err := ch.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		ch.cmd.Stderr = os.Stderr
		if err := ch.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			defer close(ch.done)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				if len(f) < 2 {
					continue
				}
				n, _ := strconv.ParseInt(f[len(f)-1], 10, 64)
				ch.mu.Lock()
				switch f[0] {
				case "admitted":
					ch.admitted.Add(n)
				case "taken":
					ch.open[f[1]] = n
				case "settled", "error":
					delete(ch.open, f[1])
				}
				ch.mu.Unlock()
			}
		}()
		return ch
	}
	killed, survivor := start(time.Minute), start(6*time.Second)
	time.Sleep(1500 * time.Millisecond)
	if err := killed.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = killed.cmd.Wait()
	<-killed.done
	killedAt := time.Now()
	killed.mu.Lock()
	var outstanding int64
	for _, u := range killed.open {
		outstanding += u
	}
	openLeases := len(killed.open)
	killed.mu.Unlock()
	<-survivor.done
	if err := survivor.cmd.Wait(); err != nil {
		t.Fatalf("survivor: %v", err)
	}
	admitted := killed.admitted.Load() + survivor.admitted.Load()
	// A lease of the killed process is counted whole at its settle_by (1 s of life and
	// 5 s of grace at most), when the worker's sweep (every 500 ms) finds it.
	var counted int64
	for deadline := killedAt.Add(20 * time.Second); ; {
		counted = e.usedBy("alice", "tokens", "org", "month")
		if time.Since(killedAt) > 7*time.Second && counted >= admitted || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	time.Sleep(time.Second) // and nothing more is counted
	counted = e.usedBy("alice", "tokens", "org", "month")
	bound := outstanding + workers + limit/16
	t.Logf("admitted %d (killed process %d, survivor %d) of %d; counted %d after the sweep: %d more than admitted; "+
		"the killed process held %d unsettled leases of %d units at the kill; bound %d (+%d checks in flight, +%d a lease being taken)",
		admitted, killed.admitted.Load(), survivor.admitted.Load(), limit, counted, counted-admitted, openLeases, outstanding,
		bound, workers, limit/16)
	if admitted > limit {
		t.Errorf("admitted %d, over the limit %d", admitted, limit)
	}
	if counted < admitted {
		t.Errorf("counted %d, under the %d admitted", counted, admitted)
	}
	if counted-admitted > bound {
		t.Errorf("counted %d - admitted %d = %d, over the bound %d", counted, admitted, counted-admitted, bound)
	}
	if killed.admitted.Load() == 0 || survivor.admitted.Load() == 0 {
		t.Errorf("a process admitted nothing: killed %d, survivor %d", killed.admitted.Load(), survivor.admitted.Load())
	}
}

// TestLeaseChild is the client process of TestLeasesKilledProcess (it runs only as
// its child): workers check tokens of alice through a leasing client, paced at about
// 1,000 checks a second each, for the time given, then Close; every admission is
// written to stdout ("admitted 1") before it counts as done, as every lease taken
// ("taken <id> <units>") and settled ("settled <id> <used>").
func TestLeaseChild(t *testing.T) {
	arg := os.Getenv(leaseChildEnv)
	if arg == "" {
		t.Skip("the child process of TestLeasesKilledProcess")
	}
	f := strings.Fields(arg)
	workers, _ := strconv.Atoi(f[3])
	runFor, _ := time.ParseDuration(f[4])
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, format+"\n", args...)
		_ = out.Flush()
	}
	c, err := client.New(f[0], f[1], client.WithLeases(), client.WithHooks(client.Hooks{OnLease: func(l client.LeaseInfo) {
		switch l.Event {
		case client.LeaseTaken:
			say("taken %s %d", l.ID, l.Units)
		case client.LeaseSettled, client.LeaseError:
			if l.ID != "" {
				say("%s %s %d", l.Event, l.ID, l.Used)
			}
		}
	}}))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	end := time.Now().Add(runFor)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				res, err := c.Check(context.Background(), client.CheckRequest{Org: f[2], Team: "eng", User: "alice", Metric: "tokens"})
				switch {
				case err != nil:
					fmt.Fprintln(os.Stderr, "lease child:", err)
				case res.Allowed:
					say("admitted 1")
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	wg.Wait()
	if err := c.Close(); err != nil {
		t.Error(err)
	}
}
