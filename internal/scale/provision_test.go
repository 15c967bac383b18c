package scale_test

import (
	"context"
	"testing"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/scale"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// The orgs Provision makes are what the load scripts expect: OrgID(i) with teams t0
// to t4 and a check key whose token is Token(i), created through the service (so
// audited).
func TestProvisionMakesTheOrgsTheLoadExpects(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	if err := scale.Provision(ctx, pool, 3); err != nil {
		t.Fatal(err)
	}
	svc := tenants.NewService(pool)
	for i := range 3 {
		k, err := svc.Authenticate(ctx, scale.Token(i))
		if err != nil {
			t.Fatalf("Token(%d): %v", i, err)
		}
		if k.OrgID != scale.OrgID(i) || !k.HasScope(tenants.ScopeCheck) {
			t.Errorf("Token(%d) is a key of %s with scopes %v, want a check key of %s", i, k.OrgID, k.Scopes, scale.OrgID(i))
		}
		teams, _, err := svc.ListTeams(ctx, scale.OrgID(i), tenants.Page{})
		if err != nil {
			t.Fatal(err)
		}
		if len(teams) != 5 || teams[0].ID != "t0" || teams[4].ID != "t4" {
			t.Errorf("teams of %s: %+v, want t0 to t4", scale.OrgID(i), teams)
		}
		trail, _, err := svc.ListAudit(ctx, scale.OrgID(i), tenants.Page{})
		if err != nil {
			t.Fatal(err)
		}
		if len(trail) != 7 {
			t.Errorf("%s has %d audit rows, want 7 (the org, 5 teams, the key)", scale.OrgID(i), len(trail))
		}
	}
}
