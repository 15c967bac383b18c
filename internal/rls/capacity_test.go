package rls_test

import (
	"strconv"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// A check Envoy asks for that an operator's capacity refuses (5 tokens a minute, the
// org's own limits far above) is OVER_LIMIT, descriptor and answer, with a
// Retry-After: the capacity is no level the descriptor names, and its refusal is
// rendered as any other.
func TestCapacityRefusalIsOverLimit(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	r.mustDo("POST", "/v1/plans", `{"id":"p-c","name":"P","fail_mode":"closed","limits":[{"metric":"tokens","window":"minute","limit":10000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", `{"id":"cp","name":"C","plan":"p-c"}`, 201)
	r.mustDo("POST", "/v1/orgs/cp/teams", `{"id":"eng","name":"Eng"}`, 201)
	r.mustDo("POST", "/v1/capacities", `{"id":"gpu","metric":"tokens","window":"minute","limit":5}`, 201)
	key := r.key("cp", `"check"`)
	ok, over := 0, 0
	for range 8 {
		res := r.mustShould(key, 0, desc(entry{"org", "cp"}, entry{"team", "eng"}, entry{"metric", "tokens"}))
		switch res.GetOverallCode() {
		case rlsv3.RateLimitResponse_OK:
			ok++
		case rlsv3.RateLimitResponse_OVER_LIMIT:
			over++
			if c := res.GetStatuses()[0].GetCode(); c != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Errorf("descriptor status %v, want OVER_LIMIT", c)
			}
			if ra, err := strconv.Atoi(headerOf(res, "Retry-After")); err != nil || ra < 1 || ra > 63 {
				t.Errorf("Retry-After %q, want 1 to 63 s", headerOf(res, "Retry-After"))
			}
			if headerOf(res, "Quotaplane-Refused") != "" {
				t.Errorf("a refusal by a capacity reads as a descriptor at fault: %q", headerOf(res, "Quotaplane-Refused"))
			}
		default:
			t.Fatalf("overall code %v", res.GetOverallCode())
		}
	}
	if ok != 5 || over != 3 {
		t.Errorf("%d OK and %d OVER_LIMIT of 8 against a capacity of 5, want 5 and 3", ok, over)
	}
}
