package rls_test

import (
	"encoding/json"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// Money: a priced metric named by Envoy's descriptors spends too, in the same decision
// as its units; the team's budget refuses the call that would pass it, counting
// nothing, while its units have room.
func TestPricedDescriptorsSpend(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	r.mustDo("POST", "/v1/plans", `{"id":"pm","name":"P","fail_mode":"closed","currency":"USD",
		"rates":[{"metric":"tokens.in","price":"2.50","per":1000000},{"metric":"tokens.out","price":"10","per":1000000}],
		"limits":[{"metric":"requests","window":"month","limit":1000},{"metric":"spend","window":"month","limit":100000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", `{"id":"acme","name":"O","plan":"pm"}`, 201)
	r.mustDo("POST", "/v1/orgs/acme/teams", `{"id":"eng","name":"T","limits":[{"metric":"spend","window":"month","limit":20000}]}`, 201)
	key := r.key("acme", `"check"`)
	spent := func() int64 {
		t.Helper()
		rec := r.do("POST", "/v1/check", key, `{"org":"acme","team":"eng","costs":{"tokens.in":0}}`)
		var res api.CheckResult
		if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil {
			t.Fatalf("usage check = %d %s", rec.Code, rec.Body)
		}
		for _, l := range res.Levels {
			if l.Metric != nil && *l.Metric == "spend" && l.Level == "team" {
				return l.Used
			}
		}
		t.Fatalf("no spend level in %s", rec.Body)
		return 0
	}
	call := func(in, out uint64) *rlsv3.RateLimitResponse {
		return r.mustShould(key, 0, desc(entry{"team", "eng"}, entry{"metric", "requests"}),
			withCost(desc(entry{"team", "eng"}, entry{"metric", "tokens.in"}), in),
			withCost(desc(entry{"team", "eng"}, entry{"metric", "tokens.out"}), out))
	}
	// 3000 in at 2.50/M and 1001 out at 10/M: 7500 + 10010 = 17510 micro-units
	if res := call(3000, 1001); res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first call: %v", res)
	}
	if got := spent(); got != 17510 {
		t.Fatalf("team spent %d, want 17510", got)
	}
	// 1000 more in (2500) passes the team's 20000: refused, nothing counted
	if res := call(1000, 0); res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("a call over the team's budget: %v", res)
	}
	if got := spent(); got != 17510 {
		t.Fatalf("team spent %d after a refused call, want 17510", got)
	}
	rec := r.do("POST", "/v1/check", key, `{"org":"acme","team":"eng","cost":0}`)
	var res api.CheckResult
	if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil || len(res.Levels) != 1 || res.Levels[0].Used != 1 {
		t.Fatalf("org requests after a refused call = %s, want used 1", rec.Body)
	}
}
