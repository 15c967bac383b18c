package checks_test

import (
	"context"
	"testing"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/derrors"
)

// Entitlements resolves the org's features for a team and user as a check resolves
// them: the caller authorized as for a check, a registered user's team found (and not
// another), an unknown team not found. Plan p's features: sso true, tier gold.
func TestEntitlements(t *testing.T) {
	w := newWorld(t)
	for _, tc := range []struct {
		name            string
		caller          checks.Caller
		org, team, user string
		wantTeam        string
		refuse          *refusal
	}{
		{name: "the org", caller: acmeKey, org: "acme"},
		{name: "a team", caller: acmeKey, org: "acme", team: "ops", wantTeam: "ops"},
		{name: "a registered user's team found", caller: acmeKey, org: "acme", user: "alice", wantTeam: "eng"},
		{name: "an unregistered user of a team", caller: operator, org: "acme", team: "eng", user: "zed", wantTeam: "eng"},
		{name: "no org", caller: acmeKey, refuse: &refusal{derrors.Invalid, "org", "is required"}},
		{name: "a bad org", caller: acmeKey, org: "a cme", refuse: &refusal{derrors.Invalid, "org", ""}},
		{name: "a bad team", caller: acmeKey, org: "acme", team: "-", refuse: &refusal{derrors.Invalid, "team", ""}},
		{name: "a bad user", caller: acmeKey, org: "acme", user: "a/b", refuse: &refusal{derrors.Invalid, "user", ""}},
		{name: "another org", caller: acmeKey, org: "strict", refuse: &refusal{derrors.NotFound, "", ""}},
		{name: "no check scope", caller: noScope, org: "acme", refuse: &refusal{derrors.Forbidden, "", ""}},
		{name: "an unknown org", caller: operator, org: "nope", refuse: &refusal{derrors.NotFound, "", "nope"}},
		{name: "an unknown team", caller: acmeKey, org: "acme", team: "sales", refuse: &refusal{derrors.NotFound, "", "sales"}},
		{name: "a registered user in another team", caller: acmeKey, org: "acme", team: "ops", user: "alice", refuse: &refusal{derrors.Invalid, "team", "eng"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := w.service()
			e, err := s.Entitlements(context.Background(), tc.caller, tc.org, tc.team, tc.user)
			if tc.refuse.answered(t, err) {
				return
			}
			if e.Org != tc.org || e.Team != tc.wantTeam || e.User != tc.user || e.Features["sso"] != true || e.Features["tier"] != "gold" {
				t.Errorf("entitlements %+v, want %s/%s/%s with sso and tier gold", e, tc.org, tc.wantTeam, tc.user)
			}
		})
	}
}
