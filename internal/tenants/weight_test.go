package tenants_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

func shared(metric string, w vocab.Window, n int64) vocab.Limit {
	return vocab.Limit{Metric: metric, Window: w, Limit: n, FairShare: true}
}

// Weights (plan, org override, team) and an org limit's fair_share are stored, read
// back, resolved for the check path (the org's weight its own or its plan's) and
// carried by the import.
func TestWeightsAndFairShareStored(t *testing.T) {
	ctx := context.Background()
	s := MustService(t)
	p, err := s.GetPlan(ctx, "pro")
	if err != nil || p.Weight != 1 {
		t.Fatalf("a plan's default weight: %d, %v; want 1", p.Weight, err)
	}
	planLimits := []vocab.Limit{shared("requests", vocab.Minute, 100), lim("requests", vocab.Month, 1000)}
	if p, err = s.UpdatePlan(ctx, op, "pro", tenants.PlanPatch{Weight: ptr(int64(4)), Limits: &planLimits}); err != nil || p.Weight != 4 {
		t.Fatalf("plan weight 4: %d, %v", p.Weight, err)
	}
	if diff := cmp.Diff(planLimits, p.Limits); diff != "" {
		t.Errorf("plan limits (-want +got):\n%s", diff)
	}
	r, err := s.ResolveOrg(ctx, "acme")
	if err != nil || r.Weight != 4 || r.Org.Weight != 0 {
		t.Fatalf("resolved org weight %d (own %d), %v; want the plan's 4", r.Weight, r.Org.Weight, err)
	}
	over := []vocab.Limit{shared("tokens", vocab.Second, 50)}
	o, err := s.UpdateOrg(ctx, op, "acme", tenants.OrgPatch{Weight: ptr(int64(16)), Limits: &over})
	if err != nil || o.Weight != 16 {
		t.Fatalf("org weight 16: %d, %v", o.Weight, err)
	}
	want := []vocab.Limit{shared("requests", vocab.Minute, 100), lim("requests", vocab.Month, 1000), shared("tokens", vocab.Second, 50)}
	if diff := cmp.Diff(want, o.EffectiveLimits); diff != "" {
		t.Errorf("org effective limits (-want +got):\n%s", diff)
	}
	team, err := s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: "eng", Name: "Eng", Weight: 3})
	if err != nil || team.Weight != 3 {
		t.Fatalf("team weight 3: %d, %v", team.Weight, err)
	}
	if team, err = s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: "ops", Name: "Ops"}); err != nil || team.Weight != 1 {
		t.Fatalf("a team's default weight: %d, %v; want 1", team.Weight, err)
	}
	if team, err = s.UpdateTeam(ctx, op, "acme", "ops", tenants.TeamPatch{Weight: ptr(int64(7))}); err != nil || team.Weight != 7 {
		t.Fatalf("team weight 7: %d, %v", team.Weight, err)
	}
	r, err = s.ResolveOrg(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if r.Weight != 16 || r.Teams["eng"].Weight != 3 || r.Teams["ops"].Weight != 7 {
		t.Errorf("resolved weights: org %d, eng %d, ops %d; want 16, 3, 7", r.Weight, r.Teams["eng"].Weight, r.Teams["ops"].Weight)
	}
	if diff := cmp.Diff(want, r.Org.EffectiveLimits); diff != "" {
		t.Errorf("resolved effective limits (-want +got):\n%s", diff)
	}
	if o, err = s.UpdateOrg(ctx, op, "acme", tenants.OrgPatch{RemoveWeight: true}); err != nil || o.Weight != 0 {
		t.Fatalf("org weight removed: %d, %v", o.Weight, err)
	}
	if r, err = s.ResolveOrg(ctx, "acme"); err != nil || r.Weight != 4 {
		t.Fatalf("resolved org weight %d, %v; want its plan's 4 again", r.Weight, err)
	}

	imp := []tenants.NewOrg{{Org: tenants.OrgInput{ID: "beta", Name: "Beta", PlanID: "pro", Limits: []vocab.Limit{shared("tokens", vocab.Hour, 900)}},
		Teams: []tenants.TeamInput{{ID: "web", Name: "Web", Weight: 5}}, Key: tenants.APIKeyInput{Name: "k", Scopes: []tenants.Scope{tenants.ScopeCheck}}}}
	if _, err := s.ImportOrgs(ctx, op, imp); err != nil {
		t.Fatal(err)
	}
	if r, err = s.ResolveOrg(ctx, "beta"); err != nil {
		t.Fatal(err)
	}
	if r.Teams["web"].Weight != 5 || !slicesHave(r.Org.EffectiveLimits, shared("tokens", vocab.Hour, 900)) {
		t.Errorf("imported: team weight %d, limits %+v", r.Teams["web"].Weight, r.Org.EffectiveLimits)
	}
}

func slicesHave(ls []vocab.Limit, l vocab.Limit) bool {
	for _, x := range ls {
		if x == l {
			return true
		}
	}
	return false
}

// A weight outside 1..1000 and a fair_share where it cannot apply are refused naming
// the field, and nothing is written.
func TestWeightsAndFairShareValidation(t *testing.T) {
	ctx := context.Background()
	s := MustService(t)
	before := auditCount(t, s)
	for _, c := range []struct {
		name  string
		do    func() error
		field string
	}{
		{"plan weight 0", func() error {
			_, err := s.UpdatePlan(ctx, op, "pro", tenants.PlanPatch{Weight: ptr(int64(0))})
			return err
		}, "weight"},
		{"plan weight 1001", func() error {
			_, err := s.CreatePlan(ctx, op, tenants.PlanInput{ID: "x", Name: "X", FailMode: vocab.FailOpen, Weight: 1001})
			return err
		}, "weight"},
		{"org weight 0", func() error {
			_, err := s.UpdateOrg(ctx, op, "acme", tenants.OrgPatch{Weight: ptr(int64(0))})
			return err
		}, "weight"},
		{"team weight 1001", func() error {
			_, err := s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: "eng", Name: "Eng", Weight: 1001})
			return err
		}, "weight"},
		{"team weight -1", func() error {
			_, err := s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: "eng", Name: "Eng", Weight: -1})
			return err
		}, "weight"},
		{"fair_share on a month", func() error {
			_, err := s.UpdateOrg(ctx, op, "acme", tenants.OrgPatch{Limits: &[]vocab.Limit{shared("requests", vocab.Month, 10)}})
			return err
		}, "limits[0].fair_share"},
		{"fair_share on concurrent", func() error {
			_, err := s.UpdatePlan(ctx, op, "pro", tenants.PlanPatch{Limits: &[]vocab.Limit{shared("requests", vocab.Concurrent, 10)}})
			return err
		}, "limits[0].fair_share"},
		{"fair_share on a team's limit", func() error {
			_, err := s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: "eng", Name: "Eng", Limits: []vocab.Limit{shared("requests", vocab.Minute, 10)}})
			return err
		}, "limits[0].fair_share"},
		{"fair_share on a user default", func() error {
			_, err := s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: "eng", Name: "Eng", UserLimits: []vocab.Limit{shared("requests", vocab.Minute, 10)}})
			return err
		}, "user_limits[0].fair_share"},
	} {
		err := c.do()
		var ve *tenants.ValidationError
		if !errors.As(err, &ve) || len(ve.Fields) != 1 || ve.Fields[0].Field != c.field {
			t.Errorf("%s: %v, want a validation error naming %s", c.name, err, c.field)
		}
	}
	if n := auditCount(t, s); n != before {
		t.Errorf("audit rows %d, want %d: a refused change wrote", n, before)
	}
	if _, err := s.GetTeam(ctx, "acme", "eng"); !errors.Is(err, tenants.ErrNotFound) {
		t.Errorf("team eng: %v, want not found", err)
	}
}

// planAndOrg is a pool on a fresh database holding plan pro, without limits, and
// org acme on it: for the tests that write past the Service.
func planAndOrg(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	s := tenants.NewService(pool)
	if _, err := s.CreatePlan(ctx, op, tenants.PlanInput{ID: "pro", Name: "Pro", FailMode: vocab.FailOpen}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateOrg(ctx, op, tenants.OrgInput{ID: "acme", Name: "Acme", PlanID: "pro"}); err != nil {
		t.Fatal(err)
	}
	return pool
}

// The database refuses what validation refuses, should a write bypass it.
func TestWeightAndFairShareConstraints(t *testing.T) {
	ctx := context.Background()
	db := planAndOrg(t)
	for _, q := range []string{
		`UPDATE plans SET weight = 0`,
		`UPDATE orgs SET weight = 1001`,
		`INSERT INTO plan_limits (plan_id, metric, time_window, max_units, fair_share) VALUES ('pro', 'x', 'month', 1, true)`,
		`INSERT INTO capacities (id, metric, time_window, max_units) VALUES ('c', 'tokens', 'month', 1)`,
		`INSERT INTO capacities (id, metric, time_window, max_units, saturation) VALUES ('c', 'tokens', 'minute', 1, 0)`,
		`INSERT INTO capacities (id, metric, time_window, max_units) VALUES ('c|x', 'tokens', 'minute', 1)`,
	} {
		if _, err := db.Exec(ctx, q); err == nil || !strings.Contains(err.Error(), "23514") {
			t.Errorf("%s: %v, want a check violation", q, err)
		}
	}
}
