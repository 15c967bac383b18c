package leasetest_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// TestMain removes the binaries testenv.StartStack builds.
func TestMain(m *testing.M) { testenv.Main(m) }

// redisDB is this package's database of the test Redis for StartStack.
const redisDB = 11

const (
	limit   = 2000                  // the hot user's month limit
	clients = 8                     // connections per replica
	pace    = 20 * time.Millisecond // each connection's period: 400 checks/s per replica, twice the lease threshold
)

// cluster is a stack (the worker, whose reservation sweep expires dead leases, and an
// api for admin calls) plus two api replicas a and b taking the load; b is killed.
type cluster struct {
	st         *testenv.Stack
	a, b       *testenv.API
	key        string // the org's key: check and admin
	replicas   int    // QUOTA_REPLICAS as the replicas see it
	httpClient *http.Client
}

func startCluster(t *testing.T, replicas int) *cluster {
	t.Helper()
	var env []string
	if replicas != 1 {
		env = append(env, fmt.Sprintf("QUOTA_REPLICAS=%d", replicas))
	}
	st := testenv.StartStack(t, testenv.StackOptions{RedisDB: redisDB, Env: env})
	c := &cluster{st: st, replicas: replicas, httpClient: &http.Client{Timeout: 5 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 2 * clients}}}
	c.must(t, st.APIAddr, "POST", "/v1/plans", st.OperatorToken, `{"id":"p","name":"P","fail_mode":"closed","limits":[{"metric":"requests","window":"month","limit":10000000}]}`, 201)
	c.must(t, st.APIAddr, "POST", "/v1/orgs", st.OperatorToken, `{"id":"acme","name":"Acme","plan":"p"}`, 201)
	c.must(t, st.APIAddr, "POST", "/v1/orgs/acme/teams", st.OperatorToken,
		fmt.Sprintf(`{"id":"eng","name":"Eng","user_limits":[{"metric":"requests","window":"month","limit":%d}]}`, limit), 201)
	var k api.ApiKeyCreated
	if err := json.Unmarshal([]byte(c.must(t, st.APIAddr, "POST", "/v1/orgs/acme/api-keys", st.OperatorToken, `{"name":"k","scopes":["check","admin"]}`, 201)), &k); err != nil {
		t.Fatal(err)
	}
	c.key = k.Secret
	c.a, c.b = st.StartAPI(t), st.StartAPI(t)
	return c
}

func (c *cluster) do(addr, method, path, token, body string) (int, []byte, error) {
	req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.httpClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, b, err
}

func (c *cluster) must(t *testing.T, addr, method, path, token, body string, want int) string {
	t.Helper()
	code, b, err := c.do(addr, method, path, token, body)
	if err != nil || code != want {
		t.Fatalf("%s %s = %d %v, want %d: %s\n%s", method, path, code, err, want, b, c.st.Logs())
	}
	return string(b)
}

// tally is what the clients of one user were told.
type tally struct {
	ok, leasedB, denied, failed atomic.Int64
	last                        atomic.Int64 // unix ns of the last 200
}

// load runs paced clients checking user on both replicas until stop is closed;
// connection errors (b dead) are waited out.
func (c *cluster) load(user string, tl *tally, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	body := `{"org":"acme","team":"eng","user":"` + user + `"}`
	for i := range 2 * clients {
		r := c.a
		if i%2 == 1 {
			r = c.b
		}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				code, b, err := c.do(r.Addr, "POST", "/v1/check", c.key, body)
				switch {
				case err != nil:
					tl.failed.Add(1) // b is dead: no answer
				case code == 200:
					tl.ok.Add(1)
					tl.last.Store(time.Now().UnixNano())
					var res api.CheckResult
					if r == c.b && json.Unmarshal(b, &res) == nil && res.Leased != nil && *res.Leased {
						tl.leasedB.Add(1)
					}
				case code == 429:
					tl.denied.Add(1)
				default:
					tl.failed.Add(1)
				}
				time.Sleep(pace - time.Since(start)) // the pace, whatever the latency (a loaded machine)
			}
		})
	}
	return &wg
}

// waitLeasedOnB waits until b has answered n more checks from a lease (its path is
// leased there), up to within; false when it has not.
func waitLeasedOnB(tl *tally, n int64, within time.Duration) bool {
	want := tl.leasedB.Load() + n
	for deadline := time.Now().Add(within); time.Now().Before(deadline); {
		if tl.leasedB.Load() >= want {
			return true
		}
		time.Sleep(2 * time.Millisecond)
	}
	return false
}

// counted reads user's used and reserved units from the usage API once nothing is
// reserved any more (the sweep has expired the dead replicas' leases).
func (c *cluster) counted(t *testing.T, user string) int64 {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		var u api.Usage
		if err := json.Unmarshal([]byte(c.must(t, c.a.Addr, "GET", "/v1/orgs/acme/usage", c.key, "", 200)), &u); err != nil {
			t.Fatal(err)
		}
		for _, m := range u.Metrics {
			for _, l := range m.Users {
				if m.Metric != "requests" || l.Id != user {
					continue
				}
				if l.Reserved == 0 {
					return l.Used
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: %d units still reserved 10 s after the load", user, l.Reserved)
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// run drives user's hot path on both replicas, kills b (kill -9) once it answers
// from a lease, up to kills times (restarting it in between: a crash loop; at least
// least times, as near the limit no lease is taken), and drives the load until the
// limit is spent and the dead leases are swept, then checks what the clients were
// told against what was counted.
func (c *cluster) run(t *testing.T, user string, kills, least int) {
	var tl tally
	stop := make(chan struct{})
	wg := c.load(user, &tl, stop)
	killed := 0
	for killed < kills {
		if !waitLeasedOnB(&tl, 20, 5*time.Second) {
			break // near the limit no lease is taken: nothing more to kill
		}
		c.b.Kill()
		killed++
		if killed < kills {
			c.b.Start()
		}
	}
	lastKill := time.Now()
	// Until the dead leases are past their expiry and swept (the lease's life + 1 s +
	// the sweep interval: 1.75 s) and the limit is spent (no 200 for a second).
	for {
		time.Sleep(100 * time.Millisecond)
		if time.Since(lastKill) > 3*time.Second && time.Since(time.Unix(0, tl.last.Load())) > time.Second {
			break
		}
		if time.Since(lastKill) > 25*time.Second {
			t.Fatalf("200s still coming 25 s after the last kill (%d so far)", tl.ok.Load())
		}
	}
	close(stop)
	wg.Wait()
	got, counted := tl.ok.Load(), c.counted(t, user)
	perKill := int64(limit / (16 * c.replicas))
	bound := int64(killed) * (perKill + clients) // a lease's unused part + the checks in flight
	t.Logf("QUOTA_REPLICAS=%d, %d kill(s): 200s %d (from b's leases %d), 429s %d, no answer %d; counted %d: over-count %d (bound %d x (%d + %d in flight) = %d)",
		c.replicas, killed, got, tl.leasedB.Load(), tl.denied.Load(), tl.failed.Load(), counted, counted-got, killed, perKill, clients, bound)
	if killed < least {
		t.Errorf("only %d kill(s) found b answering from a lease, want at least %d", killed, least)
	}
	if got > limit {
		t.Errorf("%d 200s against a month limit of %d (%d %%): admitted past the limit", got, limit, got*100/limit)
	}
	if counted < got {
		t.Errorf("counted %d below the %d 200s: admitted units given back", counted, got)
	}
	if counted-got > bound {
		t.Errorf("over-count %d above the bound %d", counted-got, bound)
	}
	if counted > limit {
		t.Errorf("counted %d over the limit %d", counted, limit)
	}
}

// The api's replicas as real processes, one kill -9 of a replica holding a lease
// mid-load, then a crash loop (kill, restart, kill ...), with the default settings
// (QUOTA_REPLICAS=1) and with QUOTA_REPLICAS=2: the 200s never exceed the limit, every
// one is counted, and the over-count is within kills x (limit / (16 x replicas) + the
// checks in flight): a dead lease is committed whole at its expiry, so its admitted
// units are never admitted again.
func TestKilledReplicaLeasesCounted(t *testing.T) {
	for _, replicas := range []int{1, 2} {
		t.Run(fmt.Sprintf("replicas=%d", replicas), func(t *testing.T) {
			c := startCluster(t, replicas)
			t.Run("once", func(t *testing.T) { c.run(t, "alice", 1, 1) })
			c.b.Start()
			t.Run("crash loop", func(t *testing.T) { c.run(t, "bob", 4, 2) })
		})
	}
}
