package rls_test

import (
	"fmt"
	"testing"

	"github.com/dunglas/httpsfv"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// headerCount is how many response_headers_to_add are named name.
func headerCount(res *rlsv3.RateLimitResponse, name string) int {
	n := 0
	for _, h := range res.GetResponseHeadersToAdd() {
		if h.GetKey() == name {
			n++
		}
	}
	return n
}

// Envoy's response_headers_to_add carry the draft-11 fields as the HTTP check does:
// parsed with a structured-field library, one policy per limit of the path, and the
// RateLimit item agrees with RateLimit-Limit, -Remaining, -Reset and Retry-After.
func TestDraftFieldsInResponseHeaders(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	key := r.setup("acme", 3) // org 10000/minute, 1000/month; eng 60/month; its users 3/month
	alice := desc(entry{"team", "eng"}, entry{"x-user-id", "alice"})
	var res *rlsv3.RateLimitResponse
	for i := range 4 {
		res = r.mustShould(key, 0, alice)
		if (i < 3) != (res.GetOverallCode() == rlsv3.RateLimitResponse_OK) {
			t.Fatalf("call %d: %v", i+1, res)
		}
		pl, err := httpsfv.UnmarshalList([]string{headerOf(res, "RateLimit-Policy")})
		if err != nil {
			t.Fatalf("call %d: RateLimit-Policy %q: %v", i+1, headerOf(res, "RateLimit-Policy"), err)
		}
		want := []struct {
			name string
			q, w int64
		}{{"org-minute", 10000, 60}, {"org-month", 1000, 0}, {"team-month", 60, 0}, {"user-month", 3, 0}}
		quota := map[string]int64{}
		for j, m := range pl {
			it := m.(httpsfv.Item)
			q, _ := it.Params.Get("q")
			w, hasW := it.Params.Get("w")
			if j >= len(want) || it.Value != want[j].name || q != want[j].q || hasW != (want[j].w > 0) || hasW && w != want[j].w {
				t.Errorf("call %d: policy %d = %#v q %v w %v", i+1, j, it.Value, q, w)
			}
			if name, ok := it.Value.(string); ok {
				quota[name], _ = q.(int64)
			}
		}
		if len(pl) != len(want) {
			t.Errorf("call %d: %d policies, want %d", i+1, len(pl), len(want))
		}
		rl, err := httpsfv.UnmarshalList([]string{headerOf(res, "RateLimit")})
		if err != nil || len(rl) != 1 {
			t.Fatalf("call %d: RateLimit %q: %v", i+1, headerOf(res, "RateLimit"), err)
		}
		it := rl[0].(httpsfv.Item)
		name, _ := it.Value.(string)
		rv, _ := it.Params.Get("r")
		tv, _ := it.Params.Get("t")
		if name != "user-month" || fmt.Sprint(quota[name]) != headerOf(res, "RateLimit-Limit") ||
			fmt.Sprint(rv) != headerOf(res, "RateLimit-Remaining") || fmt.Sprint(tv) != headerOf(res, "RateLimit-Reset") {
			t.Errorf("call %d: RateLimit %q vs RateLimit-Limit %q -Remaining %q -Reset %q", i+1, headerOf(res, "RateLimit"),
				headerOf(res, "RateLimit-Limit"), headerOf(res, "RateLimit-Remaining"), headerOf(res, "RateLimit-Reset"))
		}
		if i == 3 && (fmt.Sprint(tv) != headerOf(res, "Retry-After") || rv != int64(0)) {
			t.Errorf("denied: RateLimit %q, Retry-After %q", headerOf(res, "RateLimit"), headerOf(res, "Retry-After"))
		}
	}
}

// QUOTA_RATELIMIT_HEADERS applies to Envoy's answers too.
func TestResponseHeadersSetting(t *testing.T) {
	draft := []string{"RateLimit-Policy", "RateLimit"}
	legacy := []string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"}
	for _, tc := range []struct {
		mode       checks.HeaderMode
		sent, none []string
	}{
		{checks.HeadersDraft, draft, legacy},
		{checks.HeadersLegacy, legacy, draft},
		{checks.HeadersOff, nil, append(append([]string{}, draft...), legacy...)},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			r := newReplicaWith(t, testenv.PostgresURL(t), testenv.ID(t, "r"), replicaOptions{headers: tc.mode})
			key := r.setup("acme", 1)
			alice := desc(entry{"team", "eng"}, entry{"user", "alice"})
			for i := range 2 {
				res := r.mustShould(key, 0, alice)
				for _, name := range tc.sent {
					if headerCount(res, name) != 1 {
						t.Errorf("call %d: %s sent %d times, want once", i+1, name, headerCount(res, name))
					}
				}
				for _, name := range tc.none {
					if headerCount(res, name) != 0 {
						t.Errorf("call %d: %s sent", i+1, name)
					}
				}
				if i == 1 && (res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || headerOf(res, "Retry-After") == "") {
					t.Errorf("second call: %v", res)
				}
			}
		})
	}
}
