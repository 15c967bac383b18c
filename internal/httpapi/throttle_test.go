package httpapi_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// orgLimit is the limit a check answer shows for the org level and window, -1 if none.
func orgLimit(r api.CheckResult, w api.Window) int64 {
	for _, l := range r.Levels {
		if l.Level == vocab.LevelOrg && l.Window == w {
			return l.Limit
		}
	}
	return -1
}

// An org admin's throttle reaches the other replica within a second, through the
// cache invalidation every change sends, and lifts at its expiry on both replicas
// without anything being changed.
func TestThrottleReachesEveryReplicaAndLifts(t *testing.T) {
	dbURL := testenv.PostgresURL(t)
	prefix := testenv.ID(t, "h")
	a, b := newReplica(t, dbURL, prefix), newReplica(t, dbURL, prefix)
	key, admin := a.setup("acme") // 20/minute, 1000/month
	probe := `{"org":"acme","team":"eng","cost":0}`
	if got := b.check(key, probe); got.code != 200 || orgLimit(got.body, vocab.Minute) != 20 || got.body.Throttled != nil {
		t.Fatalf("replica b before: %d %s", got.code, got.raw)
	}

	start := time.Now()
	var th api.Throttle
	if err := json.Unmarshal([]byte(a.mustDo("PUT", "/v1/orgs/acme/throttle", admin,
		`{"factor":0.5,"ttl_seconds":2,"reason":"our p99 is above 2 s"}`, 200)), &th); err != nil {
		t.Fatal(err)
	}
	if th.Factor != 0.5 || th.Scope != api.ThrottleScopeOrg || th.Month || th.Reason != "our p99 is above 2 s" || th.CreatedBy == "" {
		t.Fatalf("PUT answered %+v", th)
	}
	for {
		got := b.check(key, probe)
		if orgLimit(got.body, vocab.Minute) == 10 {
			tr := got.body.Throttled
			if tr == nil || tr.Factor != 0.5 || tr.Scope != api.ThrottleScopeOrg || !tr.ExpiresAt.Equal(th.ExpiresAt) {
				t.Fatalf("throttled answer without its throttle: %s", got.raw)
			}
			if m := orgLimit(got.body, vocab.Month); m != 1000 {
				t.Errorf("month limit %d under a throttle without month, want 1000", m)
			}
			break
		}
		if time.Since(start) > time.Second {
			t.Fatalf("replica b still enforces %s after 1s", got.raw)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("replica b applied the throttle after %v", time.Since(start))

	time.Sleep(time.Until(th.ExpiresAt) + 10*time.Millisecond)
	for name, r := range map[string]*replica{"a": a, "b": b} {
		if got := r.check(key, probe); got.code != 200 || orgLimit(got.body, vocab.Minute) != 20 || got.body.Throttled != nil {
			t.Errorf("replica %s after the expiry: %d %s", name, got.code, got.raw)
		}
	}
	a.mustDo("GET", "/v1/orgs/acme/throttle", admin, "", 204)
}

// Under a factor of 0.5, a limit of 100/minute admits exactly 50 of 200 checks sent
// at once; their answers say throttled, and so do the items of a batch.
func TestThrottleExactAdmission(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p100","name":"P","fail_mode":"closed","limits":[{"metric":"requests","window":"minute","limit":100},{"metric":"requests","window":"month","limit":1000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"O","plan":"p100"}`, 201)
	var k api.ApiKeyCreated
	_ = json.Unmarshal([]byte(r.mustDo("POST", "/v1/orgs/acme/api-keys", operatorToken, `{"name":"c","scopes":["check"]}`, 201)), &k)
	r.mustDo("PUT", "/v1/orgs/acme/throttle", operatorToken, `{"factor":0.5,"ttl_seconds":600,"reason":"load test"}`, 200)

	var allowed, denied atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 25 {
				got := r.check(k.Secret, `{"org":"acme"}`)
				switch {
				case got.code == 200 && got.body.Throttled != nil && got.body.Throttled.Factor == 0.5:
					allowed.Add(1)
				case got.code == 429 && got.body.Throttled != nil:
					denied.Add(1)
				default:
					t.Errorf("check = %d %s", got.code, got.raw)
				}
			}
		}()
	}
	wg.Wait()
	if allowed.Load() != 50 || denied.Load() != 150 {
		t.Fatalf("200 checks at 100/minute under 0.5: %d allowed, %d denied; want exactly 50 and 150", allowed.Load(), denied.Load())
	}
	rec := r.f.do("POST", "/v1/check/batch", k.Secret, `{"checks":[{"org":"acme","cost":0}]}`)
	var out struct {
		Results []api.CheckResult `json:"results"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || len(out.Results) != 1 || out.Results[0].Throttled == nil ||
		orgLimit(out.Results[0], vocab.Minute) != 50 {
		t.Fatalf("batch under a throttle = %d %s", rec.Code, rec.Body)
	}
}

// Of an org's own throttle and its plan's, the smaller factor applies: an org admin
// cannot loosen the operator's throttle of the plan. A plan throttle with month
// throttles the month limit too, rounding down.
func TestThrottleSmallerFactorWins(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	key, admin := r.setup("acme") // plan p-acme: 20/minute, 1000/month
	probe := `{"org":"acme","team":"eng","cost":0}`
	limits := func() (minute, month int64, th *api.Throttled) {
		t.Helper()
		got := r.check(key, probe)
		if got.code != 200 {
			t.Fatalf("check = %d %s", got.code, got.raw)
		}
		return orgLimit(got.body, vocab.Minute), orgLimit(got.body, vocab.Month), got.body.Throttled
	}
	r.mustDo("PUT", "/v1/plans/p-acme/throttle", operatorToken, `{"factor":0.33,"ttl_seconds":600,"reason":"Redis failover","month":true}`, 200)
	r.mustDo("PUT", "/v1/orgs/acme/throttle", admin, `{"factor":1,"ttl_seconds":600,"reason":"we are fine"}`, 200)
	cases := []struct {
		name          string
		change        func()
		minute, month int64
		scope         api.ThrottleScope
		factor        float64
	}{
		{"the plan's is smaller", func() {}, 6, 330, api.ThrottleScopePlan, 0.33},
		{"the org's is smaller", func() {
			r.mustDo("PUT", "/v1/orgs/acme/throttle", admin, `{"factor":0.25,"ttl_seconds":600,"reason":"our errors are up"}`, 200)
		}, 5, 1000, api.ThrottleScopeOrg, 0.25},
		{"the org's lifted", func() { r.mustDo("DELETE", "/v1/orgs/acme/throttle", admin, "", 204) }, 6, 330, api.ThrottleScopePlan, 0.33},
	}
	for _, tc := range cases {
		tc.change()
		var minute, month int64
		var th *api.Throttled
		for range 200 { // the cache is invalidated through Redis: wait for it
			if minute, month, th = limits(); th != nil && th.Scope == tc.scope {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if minute != tc.minute || month != tc.month || th == nil || th.Scope != tc.scope || th.Factor != tc.factor {
			t.Errorf("%s: minute %d month %d throttled %+v; want %d %d %s %v", tc.name, minute, month, th, tc.minute, tc.month, tc.scope, tc.factor)
		}
	}
	var got api.Throttle
	_ = json.Unmarshal([]byte(r.mustDo("GET", "/v1/orgs/acme/throttle", admin, "", 200)), &got)
	if got.Scope != api.ThrottleScopePlan || got.Reason != "Redis failover" || !got.Month {
		t.Errorf("GET of the org's throttle in force = %+v, want the plan's", got)
	}
}

// Each change of a throttle writes one audit row with what it was and what it became.
func TestThrottleAudit(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	_, admin := r.setup("acme")
	r.mustDo("PUT", "/v1/orgs/acme/throttle", admin, `{"factor":0.5,"ttl_seconds":600,"reason":"first"}`, 200)
	r.mustDo("PUT", "/v1/orgs/acme/throttle", admin, `{"factor":0.75,"ttl_seconds":600,"reason":"second"}`, 200)
	r.mustDo("DELETE", "/v1/orgs/acme/throttle", admin, "", 204)
	var al api.AuditList
	if err := json.Unmarshal([]byte(r.mustDo("GET", "/v1/orgs/acme/audit?limit=3", admin, "", 200)), &al); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range al.Items {
		got = append(got, fmt.Sprintf("%s %s before=%s after=%s", e.Action, e.Object, reasonOf(e.Before), reasonOf(e.After)))
	}
	want := []string{
		"throttle.delete org:acme before=second/750000 after=-",
		"throttle.set org:acme before=first/500000 after=second/750000",
		"throttle.set org:acme before=- after=first/500000",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("audit rows:\n%s\nwant:\n%s", got, want)
	}
}

func reasonOf(snap json.RawMessage) string {
	var m map[string]any
	if json.Unmarshal(snap, &m) != nil || m == nil {
		return "-"
	}
	return fmt.Sprintf("%v/%v", m["reason"], m["factor_ppm"])
}

// A throttle's expiry is judged on the engine's clock (Redis time on the monotonic
// clock), as every other decision of a check: a stepped wall clock lifts no throttle
// early and keeps none late, and the throttle lifts once the engine's time passes its
// expiry. Before, internal/checks judged it by the raw local clock (time.Now), so a
// step of the host's clock moved it, and the engine's time passing did not lift it.
func TestThrottleExpiryOnTheEngineClock(t *testing.T) {
	prefix := testenv.ID(t, "h")
	clk := testenv.NewClock(time.Now())
	r := newReplicaEngine(t, testenv.PostgresURL(t), prefix, time.Hour, prometheus.NewRegistry(),
		quota.Config{KeyPrefix: prefix, Clock: clk.Now, Monotonic: clk.Monotonic, ClockSync: time.Hour})
	key, admin := r.setup("acme") // 20/minute
	r.mustDo("PUT", "/v1/orgs/acme/throttle", admin, `{"factor":0.5,"ttl_seconds":60,"reason":"incident"}`, 200)
	probe := `{"org":"acme","team":"eng","cost":0}`
	throttled := func(when string, want bool) {
		t.Helper()
		got := r.check(key, probe)
		if got.code != 200 || (got.body.Throttled != nil) != want || orgLimit(got.body, vocab.Minute) != map[bool]int64{true: 10, false: 20}[want] {
			t.Errorf("%s: %d %s; want throttled %v", when, got.code, got.raw, want)
		}
	}
	throttled("under the throttle", true)
	for _, step := range []time.Duration{2 * time.Minute, -4 * time.Minute, 2 * time.Minute} {
		clk.Step(step) // the wall clock only: the engine's time does not move
		throttled(fmt.Sprintf("after a %v step of the wall clock", step), true)
	}
	clk.Add(61 * time.Second) // the engine's time passes the expiry
	throttled("61 s later on the engine's clock", false)
}

// Authorization comes before validation. An org key on an operator route, or on
// another org's route, learns 403 or 404, not what its body lacked.
func TestAccessIsCheckedBeforeTheBody(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	_, admin := r.setup("acme")
	_, other := r.setup("globex")
	for _, c := range []struct {
		what, method, path, token, body string
		want                            int
	}{
		{"operator route, org key, no reason", "PUT", "/v1/plans/p-acme/throttle", admin, `{"factor":0.5}`, 403},
		{"operator route, org key, bad body", "PUT", "/v1/plans/p-acme/throttle", admin, `{"factor":"x"}`, 403},
		{"another org's throttle, no reason", "PUT", "/v1/orgs/acme/throttle", other, `{"factor":0.5}`, 404},
		{"another org's team, bad body", "POST", "/v1/orgs/acme/teams", other, `{"id":""}`, 404},
		{"own org, no reason", "PUT", "/v1/orgs/acme/throttle", admin, `{"factor":0.5}`, 400},
	} {
		if rec := r.f.do(c.method, c.path, c.token, c.body); rec.Code != c.want {
			t.Errorf("%s: %s %s = %d %s, want %d", c.what, c.method, c.path, rec.Code, rec.Body, c.want)
		}
	}
}
