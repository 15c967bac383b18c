package rls_test

import (
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// outcome is what a ShouldRateLimit call answered, in a form two calls compare by:
// its gRPC code and, when it answered, the overall code and each descriptor's.
func outcome(res *rlsv3.RateLimitResponse, err error) string {
	st, _ := status.FromError(err)
	var b strings.Builder
	b.WriteString(st.Code().String())
	if err == nil {
		b.WriteString(" " + res.GetOverallCode().String())
		for _, s := range res.GetStatuses() {
			b.WriteString(" " + s.GetCode().String())
		}
	}
	return b.String()
}

// A descriptor naming an unregistered user of a team that refuses unknown users
// cannot be decided: it is answered as a descriptor of an unknown team is, and
// counts nothing at its team; a registered user of the team is decided and counted.
func TestUnknownUserDescriptorIsNotDecided(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	key := r.setup("acme", 50)
	r.mustDo("POST", "/v1/orgs/acme/teams/eng/users", `{"id":"alice"}`, 201)
	r.mustDo("PATCH", "/v1/orgs/acme/teams/eng", `{"unknown_users":"refuse"}`, 200)
	ops := desc(entry{"team", "ops"})
	refusedRes, refusedErr := r.should(key, 0, ops, desc(entry{"team", "eng"}, entry{"user", "alcie"}))
	unknownRes, unknownErr := r.should(key, 0, ops, desc(entry{"team", "sales"}))
	if got, want := outcome(refusedRes, refusedErr), outcome(unknownRes, unknownErr); got != want || refusedErr == nil && refusedRes.GetStatuses()[1].GetCode() == rlsv3.RateLimitResponse_OK {
		t.Errorf("unregistered user of a refusing team: %s (%v), want %s as for an unknown team", got, refusedErr, want)
	}
	if refusedErr != nil && !strings.Contains(refusedErr.Error(), `user "alcie" is not registered in team "eng", which refuses unknown users`) {
		t.Errorf("error %v, want it to name the user and the team", refusedErr)
	}
	if got := r.used(key, "acme", "eng", ""); got != 0 {
		t.Errorf("team eng used %d after the refused descriptor, want 0", got)
	}
	res := r.mustShould(key, 0, desc(entry{"team", "eng"}, entry{"user", "alice"}))
	if res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("registered alice: %v", res)
	}
	if got := r.used(key, "acme", "eng", "alice"); got != 1 {
		t.Errorf("alice used %d, want 1", got)
	}
}
