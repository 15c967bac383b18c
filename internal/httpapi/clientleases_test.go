package httpapi_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
)

// leaseOf decodes a lease answer.
func leaseOf(t *testing.T, raw string) api.Lease {
	t.Helper()
	var l api.Lease
	if err := json.Unmarshal([]byte(raw), &l); err != nil {
		t.Fatalf("lease answer %s: %v", raw, err)
	}
	return l
}

// settlementOf decodes a settlement answer.
func settlementOf(t *testing.T, raw string) api.LeaseSettlement {
	t.Helper()
	var s api.LeaseSettlement
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		t.Fatalf("settlement answer %s: %v", raw, err)
	}
	return s
}

// A client lease is sized by the rate and the headroom, held as a reservation at every
// level, settled with what was admitted (renewed in the same round trip), answered
// again on a repeat, and counted whole when it expires unsettled.
func TestClientLeaseOverHTTP(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	r.sweep(t, 100*time.Millisecond)
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","limits":[{"metric":"requests","window":"month","limit":16000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"A","plan":"p"}`, 201)
	r.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"eng","name":"T"}`, 201)
	key, admin := keyOf(r.replica, "acme", `["check"]`), keyOf(r.replica, "acme", `["admin"]`)

	before := time.Now()
	l := leaseOf(t, r.mustDo("POST", "/v1/leases", key, `{"org":"acme","team":"eng","user":"alice","rate":400}`, 201))
	if l.Id == nil || l.ExpiresAt == nil || l.SettleBy == nil || l.Levels == nil || l.Reason != nil {
		t.Fatalf("lease = %+v, want id, expires_at, settle_by, levels and no reason", l)
	}
	// 400/s x at most 1 s x 1.25 = 500, within 1/16 of 16,000 = 1,000
	if l.Units < 4 || l.Units > 500 || l.TtlMs < 5 || l.TtlMs > 1000 {
		t.Fatalf("lease of %d units for %d ms, want 4 to 500 units for at most a second", l.Units, l.TtlMs)
	}
	if l.ExpiresAt.After(before.Add(time.Second+time.Second)) || (l.SettleBy.Sub(*l.ExpiresAt)-5*time.Second).Abs() > 100*time.Millisecond {
		t.Errorf("expires_at %s, settle_by %s: want within a second, settle_by 5 s after", l.ExpiresAt, l.SettleBy)
	}
	held := func() (used, reserved int64) {
		for _, m := range r.usage(t, "acme", admin).Metrics {
			if m.Metric == "requests" {
				return m.Org.Used, m.Org.Reserved
			}
		}
		return 0, 0
	}
	if used, reserved := held(); used != 0 || reserved != l.Units {
		t.Fatalf("usage with the lease held: used %d reserved %d, want 0 and %d", used, reserved, l.Units)
	}

	s := settlementOf(t, r.mustDo("POST", "/v1/leases/"+*l.Id+"/settle", key, `{"used":3,"renew":true,"rate":400}`, 200))
	if s.Settled.Used != 3 || s.Settled.Released != l.Units-3 || s.Next == nil || s.Next.Units < 4 || s.Next.Id == nil || *s.Next.Id == *l.Id {
		t.Fatalf("settle-and-renew = %+v, want 3 used, %d released and a next lease", s, l.Units-3)
	}
	for _, body := range []string{`{"used":7}`, `{"used":3,"renew":true,"rate":400}`} {
		again := settlementOf(t, r.mustDo("POST", "/v1/leases/"+*l.Id+"/settle", key, body, 200))
		if again.Settled != s.Settled || again.Next != nil {
			t.Errorf("a repeated settlement %s = %+v, want the first's %+v and no next lease", body, again, s.Settled)
		}
	}
	if used, reserved := held(); used != 3 || reserved != s.Next.Units {
		t.Fatalf("usage after the settlement: used %d reserved %d, want 3 and %d", used, reserved, s.Next.Units)
	}

	// The next lease is left unsettled: past settle_by the sweep counts it whole, and a
	// late settlement says so.
	time.Sleep(time.Until(*s.Next.SettleBy) + 500*time.Millisecond)
	late := settlementOf(t, r.mustDo("POST", "/v1/leases/"+*s.Next.Id+"/settle", key, `{"used":1}`, 200))
	if late.Settled.Used != s.Next.Units || late.Settled.Released != 0 {
		t.Errorf("settling an expired lease = %+v, want counted whole (%d used, 0 released)", late.Settled, s.Next.Units)
	}
	if used, reserved := held(); used != 3+s.Next.Units || reserved != 0 {
		t.Errorf("usage after the expiry: used %d reserved %d, want %d and 0", used, reserved, 3+s.Next.Units)
	}
}

// Near a limit a lease is 0 units (check one by one); a path with a concurrent limit or
// a token bucket is not leased; client_leases off on the plan or the org answers 0 for
// every path of the org.
func TestClientLeaseRefusals(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","limits":[{"metric":"requests","window":"month","limit":100000}]}`, 201)
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"off","name":"Off","fail_mode":"closed","client_leases":"off","limits":[{"metric":"requests","window":"month","limit":100000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"A","plan":"p"}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"byplan","name":"B","plan":"off"}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"byorg","name":"C","plan":"p","client_leases":"off"}`, 201)
	r.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"tiny","name":"T","user_limits":[{"metric":"requests","window":"month","limit":40}]}`, 201)
	r.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"slots","name":"S","user_limits":[{"metric":"requests","window":"concurrent","limit":5}]}`, 201)
	r.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"burst","name":"B","user_limits":[{"metric":"requests","window":"second","limit":100,"burst":200}]}`, 201)
	key := keyOf(r.replica, "acme", `["check"]`)
	for _, c := range []struct{ team, reason string }{{"tiny", "near_limit"}, {"slots", "not_leasable"}, {"burst", "not_leasable"}} {
		l := leaseOf(t, r.mustDo("POST", "/v1/leases", key, `{"org":"acme","team":"`+c.team+`","user":"u","rate":1000}`, 200))
		if l.Units != 0 || l.Id != nil || l.Reason == nil || string(*l.Reason) != c.reason || l.TtlMs < 1 {
			t.Errorf("team %s: lease = %+v, want 0 units, reason %s and a ttl", c.team, l, c.reason)
		}
	}
	for _, org := range []string{"byplan", "byorg"} {
		l := leaseOf(t, r.mustDo("POST", "/v1/leases", keyOf(r.replica, org, `["check"]`), `{"org":"`+org+`","rate":1000}`, 200))
		if l.Units != 0 || l.Reason == nil || *l.Reason != "client_leases_off" {
			t.Errorf("org %s: lease = %+v, want 0 units, client_leases_off", org, l)
		}
	}
	// with client leases on, the same path is leased
	leaseOf(t, r.mustDo("POST", "/v1/leases", key, `{"org":"acme","rate":1000}`, 201))
}

// Bad lease requests are refused in the API's terms and hold nothing; another org's
// lease is absent.
func TestClientLeaseBadRequests(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","limits":[{"metric":"requests","window":"month","limit":100000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"A","plan":"p"}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"other","name":"O","plan":"p"}`, 201)
	key, admin := keyOf(r.replica, "acme", `["check"]`), keyOf(r.replica, "acme", `["admin"]`)
	for body, want := range map[string]string{
		`{"org":"acme","rate":-1}`:               "rate: must be a number from 0",
		`{"org":"acme","rate":"fast"}`:           "rate",
		`{"org":"acme","Rate":5}`:                "is not a field of this request",
		`{"org":"acme","cost":5}`:                "is not a field of this request",
		`{"rate":5}`:                             "org",
		`{"org":"acme","team":"nope","rate":5}`:  "team",
		`{"org":"acme","metric":"gpu","rate":5}`: "gpu",
	} {
		rec := r.f.do("POST", "/v1/leases", key, body)
		if rec.Code < 400 || rec.Code >= 500 || !strings.Contains(rec.Body.String(), want) || strings.Contains(rec.Body.String(), "float64") {
			t.Errorf("POST /v1/leases %s = %d %s, want a 4xx naming %q", body, rec.Code, rec.Body, want)
		}
	}
	r.mustDo("POST", "/v1/leases", keyOf(r.replica, "other", `["check"]`), `{"org":"acme","rate":5}`, 404) // as a check says it
	r.mustDo("POST", "/v1/leases", "", `{"org":"acme","rate":5}`, 401)
	r.mustDo("POST", "/v1/leases", keyOf(r.replica, "acme", `["admin"]`), `{"org":"acme","rate":5}`, 403)
	l := leaseOf(t, r.mustDo("POST", "/v1/leases", key, `{"org":"acme","rate":100}`, 201))
	for body, want := range map[string]string{`{"used":-1}`: "used", `{"used":1,"rate":-2}`: "rate", `{}`: "used", `{"used":1,"renew":"yes"}`: "renew"} {
		rec := r.f.do("POST", "/v1/leases/"+*l.Id+"/settle", key, body)
		if rec.Code != 400 || !strings.Contains(rec.Body.String(), want) {
			t.Errorf("settle %s = %d %s, want 400 naming %q", body, rec.Code, rec.Body, want)
		}
	}
	r.mustDo("POST", "/v1/leases/"+*l.Id+"/settle", keyOf(r.replica, "other", `["check"]`), `{"used":1}`, 404)
	r.mustDo("POST", "/v1/leases/r_000000000000000000000A/settle", key, `{"used":1}`, 404)
	r.mustDo("POST", "/v1/leases/"+*l.Id+"/settle", "", `{"used":1}`, 401)
	for _, m := range r.usage(t, "acme", admin).Metrics {
		if m.Metric == "requests" && (m.Org.Used != 0 || m.Org.Reserved != l.Units) {
			t.Errorf("after the refusals: used %d reserved %d, want 0 and the one lease's %d", m.Org.Used, m.Org.Reserved, l.Units)
		}
	}
}

// Clients on two api replicas take, admit from and settle leases of one user's month
// limit while others check one by one, concurrently: never more admitted than the
// limit, the last units admitted by checks once leases fall to 0, and once everything
// is settled the usage is exactly what was admitted at every level.
func TestClientLeasesExactOverTwoReplicas(t *testing.T) {
	rs := newResReplicas(t, 2)
	a := rs[0]
	const limit = 5000
	a.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","limits":[{"metric":"requests","window":"month","limit":1000000}]}`, 201)
	a.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"A","plan":"p"}`, 201)
	a.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, fmt.Sprintf(`{"id":"eng","name":"T","user_limits":[{"metric":"requests","window":"month","limit":%d}]}`, limit), 201)
	key, admin := keyOf(a.replica, "acme", `["check"]`), keyOf(a.replica, "acme", `["admin"]`)
	path := `"org":"acme","team":"eng","user":"alice"`

	var admitted, leased, leases atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(30 * time.Second)
	for c := range 8 {
		r := rs[c%2]
		wg.Go(func() { // a client holding leases, admitting from them as fast as it can
			for time.Now().Before(stop) {
				rec := r.f.do("POST", "/v1/leases", key, `{`+path+`,"rate":2000}`)
				if rec.Code == 200 {
					break // near the limit: one by one now
				}
				if rec.Code != 201 {
					t.Errorf("lease = %d %s", rec.Code, rec.Body)
					return
				}
				l := leaseOf(t, rec.Body.String())
				leases.Add(1)
				use := l.Units - l.Units*int64(c%3)/4 // some leases are not used up
				admitted.Add(use)
				leased.Add(use)
				s := settlementOf(t, r.mustDo("POST", "/v1/leases/"+*l.Id+"/settle", key, fmt.Sprintf(`{"used":%d}`, use), 200))
				if s.Settled.Used != use || s.Settled.Released != l.Units-use {
					t.Errorf("settled %+v, want %d used", s.Settled, use)
				}
			}
		})
		wg.Go(func() { // a client checking one by one until it is refused twice
			refused := 0
			for time.Now().Before(stop) && refused < 2 {
				out := r.check(key, `{`+path+`}`)
				switch out.code {
				case 200:
					admitted.Add(1)
				case 429:
					refused++
				default:
					t.Errorf("check = %d %s", out.code, out.raw)
					return
				}
			}
		})
	}
	wg.Wait()
	n := admitted.Load()
	t.Logf("admitted %d of %d: %d from %d leases, %d one by one", n, limit, leased.Load(), leases.Load(), n-leased.Load())
	if n > limit {
		t.Fatalf("%d admitted, over the limit %d", n, limit)
	}
	if n != limit {
		t.Errorf("%d admitted, want the whole limit %d: units stranded", n, limit)
	}
	if leases.Load() == 0 {
		t.Error("no lease was taken")
	}
	a.usedAtEveryLevel(t, "acme", admin, n)
}

// A lease ends with the current bucket of the path's shortest sliding window (a precise
// window's: its sub-bucket of a twentieth), so what a client admits from it is counted
// in the bucket it is admitted in.
func TestClientLeaseEndsWithTheWindowBucket(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","limits":[{"metric":"requests","window":"second","limit":100000},{"metric":"requests","window":"month","limit":100000000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"est","name":"E","plan":"p"}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"pre","name":"P","plan":"p","sliding_windows":"precise"}`, 201)
	for org, bucket := range map[string]time.Duration{"est": time.Second, "pre": 50 * time.Millisecond} {
		key := keyOf(r.replica, org, `["check"]`)
		for range 20 {
			rec := r.f.do("POST", "/v1/leases", key, `{"org":"`+org+`","rate":10000}`)
			l := leaseOf(t, rec.Body.String())
			if rec.Code == 200 && l.Reason != nil && *l.Reason == "window_edge" {
				continue
			}
			if rec.Code != 201 {
				t.Fatalf("org %s: lease = %d %s", org, rec.Code, rec.Body)
			}
			if end := l.ExpiresAt.UnixMilli(); end%bucket.Milliseconds() != 0 || l.TtlMs > bucket.Milliseconds() {
				t.Errorf("org %s: lease ends at %s after %d ms, want the end of its %s bucket", org, l.ExpiresAt, l.TtlMs, bucket)
			}
			r.mustDo("POST", "/v1/leases/"+*l.Id+"/settle", key, `{"used":0}`, 200)
		}
	}
}
