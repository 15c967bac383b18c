package httpapi_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// TestPreciseWindowsOverHTTP: sliding_windows set on a plan or an org reaches the
// engine (a precise check writes sub-bucket fields, an estimate check does not), the
// org follows its plan by default and the operator alone may override it, and a bad
// value is refused with 400 naming the field.
func TestPreciseWindowsOverHTTP(t *testing.T) {
	prefix := testenv.ID(t, "h")
	r := newReplica(t, testenv.PostgresURL(t), prefix)
	rdb := testenv.Redis(t)
	ctx := context.Background()

	var plan api.Plan
	_ = json.Unmarshal([]byte(r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","sliding_windows":"precise","limits":[{"metric":"requests","window":"second","limit":5},{"metric":"requests","window":"hour","limit":1000}]}`, 201)), &plan)
	if plan.SlidingWindows == nil || *plan.SlidingWindows != api.PlanSlidingWindowsPrecise {
		t.Fatalf("plan sliding_windows = %v, want precise", plan.SlidingWindows)
	}
	var est api.Plan
	_ = json.Unmarshal([]byte(r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"q","name":"Q","fail_mode":"closed","limits":[]}`, 201)), &est)
	if est.SlidingWindows == nil || *est.SlidingWindows != api.PlanSlidingWindowsEstimate {
		t.Fatalf("plan sliding_windows = %v, want the default estimate", est.SlidingWindows)
	}
	var org api.Org
	_ = json.Unmarshal([]byte(r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"A","plan":"p"}`, 201)), &org)
	if org.SlidingWindows == nil || *org.SlidingWindows != api.OrgSlidingWindowsPlan {
		t.Fatalf("org sliding_windows = %v, want the default plan", org.SlidingWindows)
	}
	check := keyOf(r, "acme", `["check"]`)
	admin := keyOf(r, "acme", `["admin"]`)

	// fields of acme's hour buckets: the plain totals and the sum of sub-bucket fields
	hour := func() (total, subs int64) {
		keys, err := rdb.Keys(ctx, prefix+":{acme}|w|3600|*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			for f, v := range rdb.HGetAll(ctx, k).Val() {
				switch f {
				case "requests|o#": // packed sub-bucket counts, little-endian doubles
					for i := 0; i+8 <= len(v); i += 8 {
						subs += int64(math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[i : i+8]))))
					}
				case "requests|o":
					n, _ := strconv.ParseInt(v, 10, 64)
					total += n
				}
			}
		}
		return total, subs
	}

	// Precise (the plan's): a burst of 5 passes, the 6th is refused with a retry
	// when the burst's sub-bucket leaves the count: within a second and a sub-bucket
	// (1,050 ms), which Retry-After rounds up to 2 at most.
	for i := range 6 {
		out := r.check(check, `{"org":"acme"}`)
		if i < 5 && out.code != 200 || i == 5 && out.code != 429 {
			t.Fatalf("check %d = %d %s", i+1, out.code, out.raw)
		}
		if i == 5 {
			if ra := out.header.Get("Retry-After"); ra != "1" && ra != "2" {
				t.Errorf("Retry-After = %q, want 1 or 2", ra)
			}
			if rs := out.header["RateLimit-Reset"]; len(rs) != 1 || rs[0] != out.header.Get("Retry-After") {
				t.Errorf("RateLimit-Reset = %q, want Retry-After's %q", rs, out.header.Get("Retry-After"))
			}
		}
	}
	if total, subs := hour(); total != 5 || subs != 5 {
		t.Fatalf("hour bucket after 5 precise checks: total %d, sub-buckets %d; want 5 and 5", total, subs)
	}

	// An org admin may not change it; the operator may. A bad value is a 400 naming it.
	body := r.mustDo("PATCH", "/v1/orgs/acme", admin, `{"sliding_windows":"estimate"}`, 403)
	if !strings.Contains(body, "sliding_windows") {
		t.Errorf("403 does not name sliding_windows: %s", body)
	}
	for _, bad := range []struct{ method, path, body string }{
		{"POST", "/v1/plans", `{"id":"x","name":"X","fail_mode":"closed","sliding_windows":"exact","limits":[]}`},
		{"PATCH", "/v1/plans/p", `{"sliding_windows":"plan"}`},
		{"POST", "/v1/orgs", `{"id":"b","name":"B","plan":"p","sliding_windows":"sub-buckets"}`},
		{"PATCH", "/v1/orgs/acme", `{"sliding_windows":true}`},
	} {
		body := r.mustDo(bad.method, bad.path, operatorToken, bad.body, 400)
		if !strings.Contains(body, "sliding_windows") {
			t.Errorf("%s %s %s: 400 does not name sliding_windows: %s", bad.method, bad.path, bad.body, body)
		}
	}
	_ = json.Unmarshal([]byte(r.mustDo("PATCH", "/v1/orgs/acme", operatorToken, `{"sliding_windows":"estimate"}`, 200)), &org)
	if *org.SlidingWindows != api.OrgSlidingWindowsEstimate {
		t.Fatalf("org sliding_windows = %v after the patch", *org.SlidingWindows)
	}
	// Estimate (the org's override): counted without sub-buckets.
	r.check(check, `{"org":"acme","metric":"requests","cost":0}`)
	out := r.check(check, `{"org":"acme","metric":"requests"}`)
	if total, subs := hour(); out.code == 200 && (total != 6 || subs != 5) {
		t.Fatalf("hour bucket after an estimate check: total %d, sub-buckets %d; want 6 and 5", total, subs)
	}
}
