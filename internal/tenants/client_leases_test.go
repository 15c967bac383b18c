package tenants_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// TestClientLeasesValidation: a plan takes auto or off, an org also plan; anything
// else is refused naming client_leases. Only the operator changes an org's.
func TestClientLeasesValidation(t *testing.T) {
	l := func(s string) *tenants.Leases { v := tenants.Leases(s); return &v }
	plan := tenants.PlanInput{ID: "p", Name: "P", FailMode: vocab.FailOpen}
	org := tenants.OrgInput{ID: "o", Name: "O", PlanID: "p"}
	for _, tc := range []struct {
		name string
		in   interface{ Validate() error }
		msg  string // "" valid
	}{
		{"plan default", plan, ""},
		{"plan off", func() tenants.PlanInput { p := plan; p.ClientLeases = "off"; return p }(), ""},
		{"plan auto", func() tenants.PlanInput { p := plan; p.ClientLeases = "auto"; return p }(), ""},
		{"plan plan", func() tenants.PlanInput { p := plan; p.ClientLeases = "plan"; return p }(), "must be one of auto, off"},
		{"plan on", func() tenants.PlanInput { p := plan; p.ClientLeases = "on"; return p }(), "must be one of auto, off"},
		{"plan patch off", tenants.PlanPatch{ClientLeases: l("off")}, ""},
		{"plan patch empty", tenants.PlanPatch{ClientLeases: l("")}, "must be one of auto, off"},
		{"org plan", func() tenants.OrgInput { o := org; o.ClientLeases = "plan"; return o }(), ""},
		{"org off", func() tenants.OrgInput { o := org; o.ClientLeases = "off"; return o }(), ""},
		{"org OFF", func() tenants.OrgInput { o := org; o.ClientLeases = "OFF"; return o }(), "must be one of plan, auto, off"},
		{"org patch auto", tenants.OrgPatch{ClientLeases: l("auto")}, ""},
		{"org patch sometimes", tenants.OrgPatch{ClientLeases: l("sometimes")}, "must be one of plan, auto, off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.in.Validate()
			if tc.msg == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			var ve *tenants.ValidationError
			if !errors.As(err, &ve) || len(ve.Fields) != 1 || ve.Fields[0].Field != "client_leases" || ve.Fields[0].Message != tc.msg {
				t.Fatalf("Validate = %v, want one problem: client_leases %s", err, tc.msg)
			}
		})
	}
	if f := (tenants.OrgPatch{ClientLeases: l("off")}).OperatorOnly(); len(f) != 1 || f[0] != "client_leases" {
		t.Errorf("OperatorOnly = %v, want [client_leases]", f)
	}
}

// client_leases is stored on plans and orgs, and the cached resolved org carries the
// org's own setting, or its plan's when the org says plan; each change reaches the
// cache at once. The import sets it too.
func TestClientLeasesStoredAndResolved(t *testing.T) {
	ctx := context.Background()
	s := MustService(t)
	c := tenants.NewCache(s, tenants.CacheOptions{TTL: time.Hour})
	resolved := func(orgID string, want tenants.Leases) {
		t.Helper()
		r, err := c.Org(ctx, orgID)
		if err != nil || r.ClientLeases != want {
			t.Fatalf("org %s resolves client leases %q, %v; want %q", orgID, r.ClientLeases, err, want)
		}
	}
	p, err := s.GetPlan(ctx, "pro")
	if err != nil || p.ClientLeases != tenants.LeasesAuto {
		t.Fatalf("a plan's default client leases: %q, %v; want auto", p.ClientLeases, err)
	}
	o, err := s.GetOrg(ctx, "acme")
	if err != nil || o.ClientLeases != tenants.LeasesPlan {
		t.Fatalf("an org's default client leases: %q, %v; want plan", o.ClientLeases, err)
	}
	resolved("acme", tenants.LeasesAuto)

	if p, err = s.UpdatePlan(ctx, op, "pro", tenants.PlanPatch{ClientLeases: ptr(tenants.LeasesOff)}); err != nil || p.ClientLeases != tenants.LeasesOff {
		t.Fatalf("plan client leases off: %q, %v", p.ClientLeases, err)
	}
	if p.Leases != tenants.LeasesAuto {
		t.Errorf("plan leases %q after a client_leases change, want auto", p.Leases)
	}
	resolved("acme", tenants.LeasesOff)
	if o, err = s.UpdateOrg(ctx, op, "acme", tenants.OrgPatch{ClientLeases: ptr(tenants.LeasesAuto)}); err != nil || o.ClientLeases != tenants.LeasesAuto {
		t.Fatalf("org client leases auto: %q, %v", o.ClientLeases, err)
	}
	resolved("acme", tenants.LeasesAuto) // the org's own over its plan's off
	if r, _ := c.Org(ctx, "acme"); r.Leases != tenants.LeasesAuto {
		t.Errorf("resolved leases %q, want auto: client_leases moved the server's leases", r.Leases)
	}
	if _, err = s.UpdateOrg(ctx, op, "acme", tenants.OrgPatch{ClientLeases: ptr(tenants.LeasesPlan)}); err != nil {
		t.Fatal(err)
	}
	resolved("acme", tenants.LeasesOff)

	if _, err := s.CreatePlan(ctx, op, tenants.PlanInput{ID: "open", Name: "Open", FailMode: vocab.FailOpen}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateOrg(ctx, op, tenants.OrgInput{ID: "beta", Name: "Beta", PlanID: "open", ClientLeases: tenants.LeasesOff}); err != nil {
		t.Fatal(err)
	}
	resolved("beta", tenants.LeasesOff) // the org's own off over its plan's auto
	if _, err := s.CreatePlan(ctx, op, tenants.PlanInput{ID: "shut", Name: "Shut", FailMode: vocab.FailOpen, ClientLeases: tenants.LeasesOff}); err != nil {
		t.Fatal(err)
	}
	if p, err = s.GetPlan(ctx, "shut"); err != nil || p.ClientLeases != tenants.LeasesOff {
		t.Fatalf("plan created off: %q, %v", p.ClientLeases, err)
	}

	imp := []tenants.NewOrg{
		{Org: tenants.OrgInput{ID: "imp-off", Name: "Off", PlanID: "open", ClientLeases: tenants.LeasesOff},
			Key: tenants.APIKeyInput{Name: "k", Scopes: []tenants.Scope{tenants.ScopeCheck}}},
		{Org: tenants.OrgInput{ID: "imp-plan", Name: "Plan", PlanID: "shut"},
			Key: tenants.APIKeyInput{Name: "k", Scopes: []tenants.Scope{tenants.ScopeCheck}}},
	}
	if _, err := s.ImportOrgs(ctx, op, imp); err != nil {
		t.Fatal(err)
	}
	if o, err = s.GetOrg(ctx, "imp-off"); err != nil || o.ClientLeases != tenants.LeasesOff {
		t.Errorf("imported org client leases %q, %v; want off", o.ClientLeases, err)
	}
	resolved("imp-off", tenants.LeasesOff)
	if o, err = s.GetOrg(ctx, "imp-plan"); err != nil || o.ClientLeases != tenants.LeasesPlan {
		t.Errorf("imported org client leases %q, %v; want plan", o.ClientLeases, err)
	}
	resolved("imp-plan", tenants.LeasesOff)
}

// A bad client_leases is refused naming the field, and nothing is written.
func TestClientLeasesRefusalWritesNothing(t *testing.T) {
	ctx := context.Background()
	s := MustService(t)
	before := auditCount(t, s)
	for _, c := range []struct {
		name string
		do   func() error
	}{
		{"plan patch plan", func() error {
			_, err := s.UpdatePlan(ctx, op, "pro", tenants.PlanPatch{ClientLeases: ptr(tenants.LeasesPlan), Name: ptr("Renamed")})
			return err
		}},
		{"new plan on", func() error {
			_, err := s.CreatePlan(ctx, op, tenants.PlanInput{ID: "x", Name: "X", FailMode: vocab.FailOpen, ClientLeases: "on"})
			return err
		}},
		{"org patch sometimes", func() error {
			_, err := s.UpdateOrg(ctx, op, "acme", tenants.OrgPatch{ClientLeases: ptr(tenants.Leases("sometimes")), Name: ptr("Renamed")})
			return err
		}},
		{"new org OFF", func() error {
			_, err := s.CreateOrg(ctx, op, tenants.OrgInput{ID: "y", Name: "Y", PlanID: "pro", ClientLeases: "OFF"})
			return err
		}},
		{"import org auto-ish", func() error {
			_, err := s.ImportOrgs(ctx, op, []tenants.NewOrg{{Org: tenants.OrgInput{ID: "z", Name: "Z", PlanID: "pro", ClientLeases: "yes"},
				Key: tenants.APIKeyInput{Name: "k", Scopes: []tenants.Scope{tenants.ScopeCheck}}}})
			return err
		}},
	} {
		err := c.do()
		var ve *tenants.ValidationError
		if !errors.As(err, &ve) || len(ve.Fields) != 1 {
			t.Errorf("%s: %v, want one validation problem", c.name, err)
		} else if f := ve.Fields[0].Field; f != "client_leases" && f != "orgs[0].client_leases" {
			t.Errorf("%s: problem names %s, want client_leases", c.name, f)
		}
	}
	if n := auditCount(t, s); n != before {
		t.Errorf("audit rows %d, want %d: a refused change wrote", n, before)
	}
	if p, err := s.GetPlan(ctx, "pro"); err != nil || p.Name != "Pro" || p.ClientLeases != tenants.LeasesAuto {
		t.Errorf("plan after refusals: %q %q, %v", p.Name, p.ClientLeases, err)
	}
	if o, err := s.GetOrg(ctx, "acme"); err != nil || o.Name != "Acme" || o.ClientLeases != tenants.LeasesPlan {
		t.Errorf("org after refusals: %q %q, %v", o.Name, o.ClientLeases, err)
	}
	for _, id := range []string{"y", "z"} {
		if _, err := s.GetOrg(ctx, id); !errors.Is(err, tenants.ErrNotFound) {
			t.Errorf("org %s: %v, want not found", id, err)
		}
	}
	if _, err := s.GetPlan(ctx, "x"); !errors.Is(err, tenants.ErrNotFound) {
		t.Errorf("plan x: %v, want not found", err)
	}
}
