package httpapi_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// checkKey makes a key with the check scope for org through r.
func (r *replica) checkKey(org string) string {
	r.f.t.Helper()
	var k api.ApiKeyCreated
	_ = json.Unmarshal([]byte(r.mustDo("POST", "/v1/orgs/"+org+"/api-keys", operatorToken, `{"name":"c","scopes":["check"]}`, 201)), &k)
	return k.Secret
}

// A capacity of 100 tokens a minute over two orgs of weights 1 and 3 (their plans'),
// set up through the API, and checks of both hammering it through two replicas: no
// more than 100 are admitted in the window, a refused check answers 429 naming the
// capacity with a Retry-After, and GET /v1/capacities/{id} shows both orgs with their
// weights and shares.
func TestCapacityOverHTTP(t *testing.T) {
	dbURL, prefix := testenv.PostgresURL(t), testenv.ID(t, "cap")
	a, b := newReplica(t, dbURL, prefix), newReplica(t, dbURL, prefix)
	for _, p := range []struct {
		id     string
		weight int
	}{{"free", 1}, {"pro", 3}} {
		a.mustDo("POST", "/v1/plans", operatorToken, fmt.Sprintf(`{"id":%q,"name":"P","fail_mode":"closed","weight":%d,"limits":[{"metric":"tokens","window":"month","limit":1000000}]}`, p.id, p.weight), 201)
	}
	a.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"small","name":"Small","plan":"free"}`, 201)
	a.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"large","name":"Large","plan":"pro"}`, 201)
	keys := map[string]string{"small": a.checkKey("small"), "large": a.checkKey("large")}
	created := a.mustDo("POST", "/v1/capacities", operatorToken, `{"id":"gpu","metric":"tokens","window":"minute","limit":100}`, 201)
	var c api.Capacity
	if err := json.Unmarshal([]byte(created), &c); err != nil || c.Saturation != 0.8 || c.Window != vocab.Minute {
		t.Fatalf("created %s (%v)", created, err)
	}
	knowCapacity(t, []*replica{a, b}, keys["small"], "small", "tokens", 100)

	const perWorker = 60
	var admitted sync.Map // org -> *atomic.Int64
	for org := range keys {
		admitted.Store(org, new(atomic.Int64))
	}
	var refusedOnce sync.Once
	var refused checkOut
	var wg sync.WaitGroup
	start := time.Now()
	for _, r := range []*replica{a, b} {
		for org, key := range keys {
			for range 2 {
				wg.Go(func() {
					n, _ := admitted.Load(org)
					for range perWorker {
						out := r.check(key, `{"org":"`+org+`","metric":"tokens","cost":1}`)
						switch out.code {
						case 200:
							n.(*atomic.Int64).Add(1)
						case 429:
							refusedOnce.Do(func() { refused = out })
						default:
							t.Errorf("check = %d %s", out.code, out.raw)
							return
						}
					}
				})
			}
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	small, _ := admitted.Load("small")
	large, _ := admitted.Load("large")
	s, l := small.(*atomic.Int64).Load(), large.(*atomic.Int64).Load()
	t.Logf("%d checks in %v through two replicas: admitted small (weight 1) %d, large (weight 3) %d, total %d of 100",
		2*2*2*perWorker, elapsed.Round(time.Millisecond), s, l, s+l)
	if elapsed > 50*time.Second {
		t.Fatalf("the hammer took %v: not one window", elapsed)
	}
	if s+l > 100 {
		t.Errorf("%d admitted in one window of a capacity of 100", s+l)
	}
	if s+l < 80 {
		t.Errorf("only %d admitted of a capacity of 100 under a flood of %d", s+l, 2*2*2*perWorker)
	}

	if refused.code != 429 {
		t.Fatal("no check was refused")
	}
	bl := refused.body.BlockedAt
	if bl == nil || bl.Level != vocab.LevelCapacity || bl.Id != "gpu" || bl.Window != vocab.Minute || bl.Metric == nil || *bl.Metric != "tokens" {
		t.Errorf("refused check's blocked_at: %s", refused.raw)
	}
	// a unit leaves a precise window 21 sub-buckets (of 3 s) after it came: at most 63 s
	if ra, err := strconv.Atoi(refused.header.Get("Retry-After")); err != nil || ra < 1 || ra > 63 {
		t.Errorf("refused check's Retry-After %q, want 1 to 63 s", refused.header.Get("Retry-After"))
	}
	t.Logf("a refused check: 429 Retry-After %s %s", refused.header.Get("Retry-After"), refused.raw)

	time.Sleep(400 * time.Millisecond) // the replicas' grants end and give back what they did not admit
	var d api.CapacityDetail
	raw := b.mustDo("GET", "/v1/capacities/gpu", operatorToken, "", 200)
	if err := json.Unmarshal([]byte(raw), &d); err != nil {
		t.Fatal(err)
	}
	t.Logf("GET /v1/capacities/gpu: %s", raw)
	cur := d.Current
	if cur.Limit != 100 || cur.Saturation != 0.8 || cur.Used < s+l || cur.Used > 100 || !cur.Saturated {
		t.Errorf("window: used %d (admitted %d), limit %d, saturation %v, saturated %v", cur.Used, s+l, cur.Limit, cur.Saturation, cur.Saturated)
	}
	byOrg := map[string]api.CapacityOrg{}
	for _, o := range cur.Orgs {
		byOrg[o.Org] = o
	}
	so, lo := byOrg["small"], byOrg["large"]
	if len(cur.Orgs) != 2 || so.Weight != 1 || lo.Weight != 3 {
		t.Fatalf("orgs %+v, want small of weight 1 and large of weight 3", cur.Orgs)
	}
	if so.Share != 25 || lo.Share != 75 {
		t.Errorf("shares: small %d, large %d; want 25 and 75 (both refused in the window)", so.Share, lo.Share)
	}
	if so.Used < s || lo.Used < l {
		t.Errorf("used: small %d (admitted %d), large %d (admitted %d)", so.Used, s, lo.Used, l)
	}

	// A change reaches every replica: raised to 1000, both orgs pass again at once.
	a.mustDo("PATCH", "/v1/capacities/gpu", operatorToken, `{"limit":1000}`, 200)
	deadline := time.Now().Add(2 * time.Second)
	for b.check(keys["small"], `{"org":"small","metric":"tokens","cost":1}`).code != 200 {
		if time.Now().After(deadline) {
			t.Fatal("the other replica still refuses 2 s after the capacity was raised")
		}
		time.Sleep(20 * time.Millisecond)
	}
	a.mustDo("DELETE", "/v1/capacities/gpu", operatorToken, "", 204)
}

// Bad weights and capacities are refused in the API's terms, naming the field, and
// write nothing (TestRoutes holds the database unchanged for every refusal).
func TestCapacityAndWeightProblems(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "capp"))
	r.setup("acme")
	for _, c := range []struct {
		method, path, body, field string
	}{
		{"PATCH", "/v1/plans/p-acme", `{"weight":0}`, "weight"},
		{"PATCH", "/v1/orgs/acme", `{"weight":1001}`, "weight"},
		{"POST", "/v1/orgs/acme/teams", `{"id":"x","name":"X","weight":1001}`, "weight"},
		{"POST", "/v1/capacities", `{"id":"c","metric":"tokens","window":"minute","limit":10,"saturation":1.5}`, "saturation"},
		{"POST", "/v1/capacities", `{"id":"c","metric":"tokens","window":"week","limit":10}`, "window"},
		{"PATCH", "/v1/orgs/acme", `{"limits":[{"metric":"requests","window":"month","limit":1000,"fair_share":true}]}`, "limits[0].fair_share"},
	} {
		rec := r.f.do(c.method, c.path, operatorToken, c.body)
		var p api.Problem
		_ = json.Unmarshal(rec.Body.Bytes(), &p)
		if rec.Code != 400 || rec.Header().Get("Content-Type") != "application/problem+json" || len(p.Errors) == 0 || p.Errors[0].Field != c.field {
			t.Errorf("%s %s %s = %d %s, want 400 naming %s", c.method, c.path, c.body, rec.Code, rec.Body, c.field)
		}
	}
}

// An org limit marked fair_share (tokens 100 a second) shared by two teams of weights
// 1 and 3 that have no limit of their own, both flooding it through the API: in the
// saturated seconds after the first each gets its weight's part of what is admitted,
// 25 % and 75 % within 5 points; a team refused for its share is told so at the org
// level. A second the flood could not fill (a machine too busy to send 100 checks a
// second) holds no one to a share, so it is left out of the measure.
func TestFairShareOrgLimitOverHTTP(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "fs"))
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","sliding_windows":"precise","limits":[{"metric":"tokens","window":"second","limit":100,"fair_share":true}]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"Acme","plan":"p"}`, 201)
	r.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"web","name":"Web"}`, 201)
	r.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"batch","name":"Batch","weight":3}`, 201)
	key := r.checkKey("acme")

	const seconds = 6
	start := time.Now()
	var mu sync.Mutex
	var admitted [seconds]map[string]int // by second since start, by team
	for i := range admitted {
		admitted[i] = map[string]int{}
	}
	var shareRefusals atomic.Int64
	var wg sync.WaitGroup
	for _, team := range []string{"web", "batch"} {
		for range 2 {
			wg.Go(func() {
				for {
					out := r.check(key, `{"org":"acme","team":"`+team+`","metric":"tokens","cost":1}`)
					sec := int(time.Since(start) / time.Second)
					if sec >= seconds {
						return
					}
					switch out.code {
					case 200:
						mu.Lock()
						admitted[sec][team]++
						mu.Unlock()
					case 429:
						if b := out.body.BlockedAt; b != nil && b.FairShare != nil && *b.FairShare {
							if b.Level != vocab.LevelOrg || b.Id != "acme" || b.Window != vocab.Second {
								t.Errorf("a fair-share refusal's blocked_at: %s", out.raw)
							}
							shareRefusals.Add(1)
						}
					default:
						t.Errorf("check = %d %s", out.code, out.raw)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	var w, b, saturated int
	for sec := 1; sec < seconds; sec++ {
		n := admitted[sec]["web"] + admitted[sec]["batch"]
		t.Logf("second %d: web %d, batch %d", sec, admitted[sec]["web"], admitted[sec]["batch"])
		if n > 105 {
			t.Errorf("second %d admitted %d over a limit of 100/s", sec, n)
		}
		if n >= 90 {
			w, b, saturated = w+admitted[sec]["web"], b+admitted[sec]["batch"], saturated+1
		}
	}
	if shareRefusals.Load() == 0 {
		t.Error("no refusal named the fair share")
	}
	if saturated < 2 {
		t.Skipf("only %d of %d seconds saturated (90 or more admitted): the machine is too busy to measure shares", saturated, seconds-1)
	}
	sw := 100 * float64(w) / float64(w+b)
	t.Logf("teams of weights 1 and 3 flooding a fair_share org limit of 100/s, %d saturated seconds: web %d (%.1f %%), batch %d (%.1f %%); %d refusals named the fair share",
		saturated, w, sw, b, 100-sw, shareRefusals.Load())
	if sw < 20 || sw > 30 {
		t.Errorf("web got %.1f %% of what was admitted, want 25 +-5", sw)
	}
}

// A reservation draws its amount on the capacities of its metric when it is taken, as
// a check draws its cost: with 8 of a capacity of 10 held, a reservation of 5 answers
// 429 naming the capacity and holds nothing, and the window counts the 8 even once
// the first is committed with less (what a settling gives back stays counted until it
// leaves the window).
func TestCapacityHoldsReservations(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "capr"))
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","limits":[{"metric":"tokens","window":"month","limit":1000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"lab","name":"Lab","plan":"p"}`, 201)
	key := r.checkKey("lab")
	r.mustDo("POST", "/v1/capacities", operatorToken, `{"id":"gpt","metric":"tokens","window":"minute","limit":10}`, 201)

	var first struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(r.mustDo("POST", "/v1/reservations", key, `{"org":"lab","metric":"tokens","amount":8}`, 201)), &first); err != nil || first.ID == "" {
		t.Fatalf("reservation of 8 of 10: %v", err)
	}
	raw := r.mustDo("POST", "/v1/reservations", key, `{"org":"lab","metric":"tokens","amount":5}`, 429)
	var refused struct {
		BlockedAt *api.LevelRef `json:"blocked_at"`
	}
	if err := json.Unmarshal([]byte(raw), &refused); err != nil || refused.BlockedAt == nil ||
		refused.BlockedAt.Level != vocab.LevelCapacity || refused.BlockedAt.Id != "gpt" {
		t.Fatalf("reservation of 5 more: %s, want refused at the capacity", raw)
	}
	r.mustDo("POST", "/v1/reservations/"+first.ID+"/commit", key, `{"used":2}`, 200)
	var d api.CapacityDetail
	if err := json.Unmarshal([]byte(r.mustDo("GET", "/v1/capacities/gpt", operatorToken, "", 200)), &d); err != nil {
		t.Fatal(err)
	}
	if d.Current.Used != 8 {
		t.Errorf("the window counts %d after a reservation of 8 committed with 2, want 8", d.Current.Used)
	}
}

// knowCapacity waits until every replica draws on the capacity of limit units of
// metric: the replica that created it knows it before its answer, the others once the
// change reaches them over pub/sub (a moment, not a promise). A check of limit+1 is
// refused by a replica that knows it, without drawing or counting; one that does not
// admits it against the org's own limits, which the tests leave room for.
func knowCapacity(t *testing.T, rs []*replica, key, org, metric string, limit int64) {
	t.Helper()
	body := fmt.Sprintf(`{"org":%q,"metric":%q,"cost":%d}`, org, metric, limit+1)
	for i, r := range rs {
		deadline := time.Now().Add(5 * time.Second)
		for {
			out := r.check(key, body)
			if out.code == 429 && out.body.BlockedAt != nil && out.body.BlockedAt.Level == vocab.LevelCapacity {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d does not draw on the capacity 5 s after it was made: %d %s", i, out.code, out.raw)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
