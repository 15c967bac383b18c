package httpapi_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
)

// 2 api replicas x 64 connections on one user with month and minute limits, leases on:
// the 200s never exceed the user's minute limit (all within one minute, counted by the
// test), the last units are admitted, many answers say leased: true with used <=
// limit, and once the leases are settled the usage API shows every level's used equal
// to the admitted total and nothing held.
func TestLeasesExactOverTwoAPIReplicas(t *testing.T) {
	rs := newResReplicasLeasing(t, 2, quota.LeaseConfig{Enabled: true, Max: 50 * time.Millisecond, Threshold: 50, Replicas: 2})
	a := rs[0]
	const minuteLimit, monthLimit = 2500, 4000
	a.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","limits":[{"metric":"requests","window":"minute","limit":1000000},{"metric":"requests","window":"month","limit":10000000}]}`, 201)
	a.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"O","plan":"p"}`, 201)
	a.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, fmt.Sprintf(`{"id":"eng","name":"T","user_limits":[{"metric":"requests","window":"month","limit":%d},{"metric":"requests","window":"minute","limit":%d}]}`, monthLimit, minuteLimit), 201)
	key, admin := keyOf(a.replica, "acme", `["check"]`), keyOf(a.replica, "acme", `["admin"]`)

	// The load runs until the minute limit is spent and every client was refused at
	// least twice, within the minute: a loaded machine takes longer to get there, and
	// the test measures what was admitted, not how fast.
	if left := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); left < 40*time.Second {
		time.Sleep(left + 100*time.Millisecond)
	}
	minute := time.Now().Truncate(time.Minute)
	var admitted, leased, denied atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(35 * time.Second)
	body := `{"org":"acme","team":"eng","user":"alice"}`
	for c := range 128 {
		r := rs[c%2]
		wg.Go(func() {
			for time.Now().Before(stop) && (admitted.Load() < minuteLimit || denied.Load() < 256) {
				out := r.check(key, body)
				switch out.code {
				case 200:
					admitted.Add(1)
					if out.body.Leased != nil && *out.body.Leased {
						leased.Add(1)
						for _, l := range out.body.Levels {
							if l.Used > l.Limit || l.Remaining != l.Limit-l.Used {
								t.Errorf("leased answer: %s %s used %d remaining %d limit %d", l.Level, l.Window, l.Used, l.Remaining, l.Limit)
								return
							}
						}
					}
				case 429:
					denied.Add(1)
				default:
					t.Errorf("check = %d %s", out.code, out.raw)
					return
				}
			}
		})
	}
	wg.Wait()
	if now := time.Now(); now.Truncate(time.Minute) != minute {
		t.Fatalf("the load crossed a minute boundary (%s)", now)
	}
	n := admitted.Load()
	t.Logf("200s %d (%d leased), 429s %d", n, leased.Load(), denied.Load())
	if n > minuteLimit {
		t.Fatalf("%d checks admitted in one minute, over the user's minute limit %d", n, minuteLimit)
	}
	if n != minuteLimit {
		t.Errorf("%d checks admitted, want the whole minute limit %d: units stranded", n, minuteLimit)
	}
	if leased.Load() == 0 {
		t.Error("no answer came from a lease")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		open := 0.0
		for _, r := range rs {
			open += testenv.MetricValue(t, r.reg, "quotaplane_leases_total", map[string]string{"event": "taken"}) -
				testenv.MetricValue(t, r.reg, "quotaplane_leases_total", map[string]string{"event": "returned"})
		}
		if open == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v leases still open 10 s after the load", open)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v := testenv.MetricValue(t, rs[0].reg, "quotaplane_lease_checks_total", map[string]string{"answer": "leased"}) +
		testenv.MetricValue(t, rs[1].reg, "quotaplane_lease_checks_total", map[string]string{"answer": "leased"}); int64(v) != leased.Load() {
		t.Errorf("quotaplane_lease_checks_total{answer=leased} = %v, want the %d leased answers", v, leased.Load())
	}
	a.usedAtEveryLevel(t, "acme", admin, n)
}

// usedAtEveryLevel fails t unless org's usage of requests shows n used and nothing held
// at every level.
func (r *resReplica) usedAtEveryLevel(t *testing.T, org, token string, n int64) {
	t.Helper()
	for _, m := range r.usage(t, org, token).Metrics {
		if m.Metric != "requests" {
			continue
		}
		for _, l := range append(append([]api.UsageLevel{m.Org}, m.Teams...), m.Users...) {
			if l.Used != n || l.Reserved != 0 {
				t.Errorf("usage of %s: used %d reserved %d, want the admitted %d and 0", l.Id, l.Used, l.Reserved, n)
			}
		}
	}
}

// leases: off on the plan, or on the org over a plan's auto, keeps every check in Redis;
// the settings round-trip through the API.
func TestLeasesOff(t *testing.T) {
	r := newResReplicasLeasing(t, 1, quota.LeaseConfig{Enabled: true, Threshold: 1})[0]
	var plan api.Plan
	_ = json.Unmarshal([]byte(r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","leases":"off","limits":[{"metric":"requests","window":"month","limit":1000000}]}`, 201)), &plan)
	if plan.Leases == nil || *plan.Leases != api.PlanLeasesOff {
		t.Fatalf("plan leases = %v, want off", plan.Leases)
	}
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"q","name":"Q","fail_mode":"closed","limits":[{"metric":"requests","window":"month","limit":1000000}]}`, 201)
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"x","name":"X","fail_mode":"closed","leases":"sometimes","limits":[]}`, 400)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"a","name":"A","plan":"p"}`, 201)
	var org api.Org
	_ = json.Unmarshal([]byte(r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"b","name":"B","plan":"q","leases":"off"}`, 201)), &org)
	if org.Leases == nil || *org.Leases != api.OrgLeasesOff {
		t.Fatalf("org leases = %v, want off", org.Leases)
	}
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"c","name":"C","plan":"q"}`, 201)
	for _, org := range []string{"a", "b", "c"} {
		r.mustDo("POST", "/v1/orgs/"+org+"/teams", operatorToken, `{"id":"eng","name":"T"}`, 201)
	}
	hot := func(org string) (leased int) {
		key := keyOf(r.replica, org, `["check"]`)
		body := `{"org":"` + org + `","team":"eng","user":"u"}`
		for stop := time.Now().Add(500 * time.Millisecond); time.Now().Before(stop); {
			out := r.check(key, body)
			if out.code != 200 {
				t.Fatalf("check = %d %s", out.code, out.raw)
			}
			if out.body.Leased != nil && *out.body.Leased {
				leased++
			}
		}
		return leased
	}
	if n := hot("a"); n > 0 {
		t.Errorf("plan leases off: %d answers leased", n)
	}
	if n := hot("b"); n > 0 {
		t.Errorf("org leases off: %d answers leased", n)
	}
	if n := hot("c"); n == 0 {
		t.Error("leases auto: no answer leased")
	}
	// The org override back to its plan's setting (auto): leased again.
	r.mustDo("PATCH", "/v1/orgs/b", operatorToken, `{"leases":"plan"}`, 200)
	time.Sleep(100 * time.Millisecond)
	if n := hot("b"); n == 0 {
		t.Error("org leases back to plan (auto): no answer leased")
	}
}
