package tenants_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

func bucket(metric string, w vocab.Window, rate, burst int64) vocab.Limit {
	return vocab.Limit{Metric: metric, Window: w, Limit: rate, Burst: burst}
}

// A limit's burst is stored and read back by every owner of limits (plan, org
// override, team, team user defaults, user), carried into effective and resolved
// limits, and shown in the audit trail.
func TestBurstStoredEverywhere(t *testing.T) {
	ctx := context.Background()
	s := MustService(t)
	planLimits := []vocab.Limit{bucket("requests", vocab.Second, 10, 30), lim("requests", vocab.Minute, 100), lim("requests", vocab.Month, 1000)}
	p, err := s.UpdatePlan(ctx, op, "pro", tenants.PlanPatch{Limits: &planLimits})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(planLimits, p.Limits); diff != "" {
		t.Errorf("plan limits (-want +got):\n%s", diff)
	}
	o, err := s.UpdateOrg(ctx, op, "acme", tenants.OrgPatch{Limits: &[]vocab.Limit{bucket("tokens", vocab.Hour, 500, 2000)}})
	if err != nil {
		t.Fatal(err)
	}
	wantEff := []vocab.Limit{bucket("requests", vocab.Second, 10, 30), lim("requests", vocab.Minute, 100), lim("requests", vocab.Month, 1000),
		bucket("tokens", vocab.Hour, 500, 2000)}
	if diff := cmp.Diff(wantEff, o.EffectiveLimits); diff != "" {
		t.Errorf("org effective limits (-want +got):\n%s", diff)
	}
	teamLimits := []vocab.Limit{bucket("requests", vocab.Second, 8, 20)}
	userDefaults := []vocab.Limit{bucket("requests", vocab.Second, 2, 5)}
	team, err := s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: "eng", Name: "Eng", Limits: teamLimits, UserLimits: userDefaults})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(teamLimits, team.Limits); diff != "" {
		t.Errorf("team limits (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(userDefaults, team.UserLimits); diff != "" {
		t.Errorf("team user defaults (-want +got):\n%s", diff)
	}
	userLimits := []vocab.Limit{bucket("requests", vocab.Second, 4, 10)}
	u, err := s.CreateUser(ctx, op, "acme", "eng", tenants.UserInput{ID: "alice", Limits: userLimits})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(userLimits, u.Limits); diff != "" {
		t.Errorf("user limits (-want +got):\n%s", diff)
	}

	r, err := s.ResolveOrg(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantEff, r.Org.EffectiveLimits); diff != "" {
		t.Errorf("resolved effective limits (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(teamLimits, r.Teams["eng"].Limits); diff != "" {
		t.Errorf("resolved team limits (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(userDefaults, r.Teams["eng"].UserLimits); diff != "" {
		t.Errorf("resolved user defaults (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(userLimits, r.Users["alice"].Limits); diff != "" {
		t.Errorf("resolved user limits (-want +got):\n%s", diff)
	}
	ru, err := s.ResolveUser(ctx, "acme", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(userLimits, ru.Limits); diff != "" {
		t.Errorf("ResolveUser limits (-want +got):\n%s", diff)
	}

	// A sliding override of the plan's bucket replaces it whole.
	o, err = s.UpdateOrg(ctx, op, "acme", tenants.OrgPatch{Limits: &[]vocab.Limit{lim("requests", vocab.Second, 9)}})
	if err != nil {
		t.Fatal(err)
	}
	if got := o.EffectiveLimits[0]; got != lim("requests", vocab.Second, 9) {
		t.Errorf("sliding override of a bucket: effective %+v, want a sliding 9/second", got)
	}

	entries, _, err := s.ListAudit(ctx, "acme", tenants.Page{})
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, e := range entries {
		if e.Action == "org.update" && strings.Contains(string(e.Before), `"burst": 2000`) && !strings.Contains(string(e.After), `"burst": 2000`) {
			found = true
		}
	}
	if !found {
		for _, e := range entries {
			t.Logf("%s before %s after %s", e.Action, e.Before, e.After)
		}
		t.Error("no org.update audit row whose before shows burst 2000 and after does not")
	}
}

// An import writes its orgs' and teams' bursts.
func TestImportCarriesBurst(t *testing.T) {
	ctx := context.Background()
	s := MustService(t)
	orgLimits := []vocab.Limit{bucket("requests", vocab.Second, 10, 40)}
	teamLimits := []vocab.Limit{bucket("requests", vocab.Second, 5, 20)}
	defaults := []vocab.Limit{bucket("requests", vocab.Second, 1, 3)}
	if _, err := s.ImportOrgs(ctx, op, []tenants.NewOrg{{
		Org:   tenants.OrgInput{ID: "imp", Name: "Imp", PlanID: "pro", Limits: orgLimits},
		Teams: []tenants.TeamInput{{ID: "t", Name: "T", Limits: teamLimits, UserLimits: defaults}},
		Key:   tenants.APIKeyInput{Name: "k", Scopes: []tenants.Scope{tenants.ScopeCheck}},
	}}); err != nil {
		t.Fatal(err)
	}
	o, err := s.GetOrg(ctx, "imp")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(orgLimits, o.Limits); diff != "" {
		t.Errorf("org limits (-want +got):\n%s", diff)
	}
	team, err := s.GetTeam(ctx, "imp", "t")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(teamLimits, team.Limits); diff != "" {
		t.Errorf("team limits (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(defaults, team.UserLimits); diff != "" {
		t.Errorf("user defaults (-want +got):\n%s", diff)
	}
	// A team bucket above the org's is refused like any team.
	_, err = s.ImportOrgs(ctx, op, []tenants.NewOrg{{
		Org:   tenants.OrgInput{ID: "imp2", Name: "Imp", PlanID: "pro", Limits: orgLimits},
		Teams: []tenants.TeamInput{{ID: "t", Name: "T", Limits: []vocab.Limit{bucket("requests", vocab.Second, 5, 41)}}},
		Key:   tenants.APIKeyInput{Name: "k", Scopes: []tenants.Scope{tenants.ScopeCheck}},
	}})
	if !errors.Is(err, tenants.ErrOverAllocated) || !strings.Contains(err.Error(), "burst 41") {
		t.Errorf("import of a team bucket above its org's: %v", err)
	}
}

// A burst is refused on a month or concurrent window, below 1 or above the units
// bound, naming the field, by every input that takes limits.
func TestBurstValidation(t *testing.T) {
	ctx := context.Background()
	s := MustService(t)
	if _, err := s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: "eng", Name: "Eng"}); err != nil {
		t.Fatal(err)
	}
	bad := []struct {
		name  string
		l     vocab.Limit
		field string
		msg   string
	}{
		{"month", bucket("requests", vocab.Month, 10, 5), "burst", "applies only to second, minute, hour and day windows"},
		{"concurrent", bucket("requests", vocab.Concurrent, 10, 5), "burst", "applies only to second, minute, hour and day windows"},
		{"negative", bucket("requests", vocab.Second, 10, -1), "burst", "must be 1 to"},
		{"bound", bucket("requests", vocab.Second, 10, vocab.MaxUnits+1), "burst", "must be 1 to"},
		// 1 a day refills 52,125 units in more than 2^52 us: the engine could not hold them
		{"depth", bucket("requests", vocab.Day, 1, 52_125), "burst", "takes more than 142 years to refill at 1 per day: at most 52124"},
	}
	for _, tc := range bad {
		ls := []vocab.Limit{lim("requests", vocab.Minute, 50), tc.l}
		calls := map[string]func() error{
			"limits[1]": func() error {
				_, err := s.CreatePlan(ctx, op, tenants.PlanInput{ID: "p-" + tc.name, Name: "P", FailMode: vocab.FailOpen, Limits: ls})
				return err
			},
			"limits[1]@org": func() error { _, err := s.UpdateOrg(ctx, op, "acme", tenants.OrgPatch{Limits: &ls}); return err },
			"limits[1]@team": func() error {
				_, err := s.UpdateTeam(ctx, op, "acme", "eng", tenants.TeamPatch{Limits: &ls})
				return err
			},
			"user_limits[1]": func() error {
				_, err := s.UpdateTeam(ctx, op, "acme", "eng", tenants.TeamPatch{UserLimits: &ls})
				return err
			},
			"limits[1]@user": func() error {
				_, err := s.CreateUser(ctx, op, "acme", "eng", tenants.UserInput{ID: "u", Limits: ls})
				return err
			},
		}
		for where, call := range calls {
			err := call()
			var ve *tenants.ValidationError
			if !errors.As(err, &ve) {
				t.Errorf("%s %s: err = %v, want a ValidationError", tc.name, where, err)
				continue
			}
			field, _, _ := strings.Cut(where, "@")
			field += "." + tc.field
			if len(ve.Fields) != 1 || ve.Fields[0].Field != field || !strings.Contains(ve.Fields[0].Message, tc.msg) {
				t.Errorf("%s %s: fields = %+v, want one at %s saying %q", tc.name, where, ve.Fields, field, tc.msg)
			}
		}
	}
	if _, err := s.GetPlan(ctx, "p-month"); !errors.Is(err, tenants.ErrNotFound) {
		t.Errorf("a refused plan was written: %v", err)
	}
}

// A child's bucket may not exceed its parent's rate or burst; a parent without a
// bucket bounds only the rate; a parent lowering its burst below a child's is
// refused as lowering its limit is.
func TestBurstAllocationRules(t *testing.T) {
	ctx := context.Background()
	s := MustService(t)
	if _, err := s.UpdatePlan(ctx, op, "pro", tenants.PlanPatch{Limits: &[]vocab.Limit{
		bucket("requests", vocab.Second, 10, 30), lim("requests", vocab.Minute, 100), lim("requests", vocab.Month, 1000)}}); err != nil {
		t.Fatal(err)
	}
	alloc := func(err error) []tenants.Violation {
		t.Helper()
		var ae *tenants.AllocationError
		if !errors.As(err, &ae) {
			t.Fatalf("err = %v, want an AllocationError", err)
		}
		return ae.Violations
	}
	// Burst above the org's: 422 naming the team's field and the org's burst.
	_, err := s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: "big", Name: "Big", Limits: []vocab.Limit{
		lim("requests", vocab.Month, 100), bucket("requests", vocab.Second, 10, 31)}})
	vs := alloc(err)
	if len(vs) != 1 || vs[0].Field != "limits[1].burst" || vs[0].ParentMax != 30 || vs[0].Requested != 31 ||
		!strings.Contains(vs[0].Message, `team "big": requests/second burst 31 is above org "acme"'s burst 30`) {
		t.Errorf("team burst above org's: %+v", vs)
	}
	// Rate and burst both above: both named.
	_, err = s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: "big", Name: "Big", Limits: []vocab.Limit{bucket("requests", vocab.Second, 11, 31)}})
	vs = alloc(err)
	if len(vs) != 2 || vs[0].Field != "limits[0].limit" || vs[1].Field != "limits[0].burst" {
		t.Errorf("team rate and burst above org's: %+v", vs)
	}
	// A bucket under the org's sliding minute limit: only the rate is bounded.
	if _, err := s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: "eng", Name: "Eng", Limits: []vocab.Limit{
		bucket("requests", vocab.Second, 10, 30), bucket("requests", vocab.Minute, 100, 5000)},
		UserLimits: []vocab.Limit{bucket("requests", vocab.Second, 2, 40)}}); err == nil {
		t.Error("user defaults bucket above the team's burst was admitted")
	} else if vs := alloc(err); len(vs) != 1 || vs[0].Field != "user_limits[0].burst" || !strings.Contains(vs[0].Message, `team "eng"'s burst 30`) {
		t.Errorf("user defaults burst above team's: %+v", vs)
	}
	if _, err := s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: "eng", Name: "Eng", Limits: []vocab.Limit{
		bucket("requests", vocab.Second, 10, 30), bucket("requests", vocab.Minute, 100, 5000)},
		UserLimits: []vocab.Limit{bucket("requests", vocab.Second, 2, 5)}}); err != nil {
		t.Fatalf("a bucket under a sliding parent, rate within it: %v", err)
	}
	// A sliding child under a parent's bucket: the rate rule applies.
	if _, err := s.CreateUser(ctx, op, "acme", "eng", tenants.UserInput{ID: "sl", Limits: []vocab.Limit{lim("requests", vocab.Second, 11)}}); err == nil {
		t.Error("a sliding 11/second under a 10/second bucket was admitted")
	}
	if _, err := s.CreateUser(ctx, op, "acme", "eng", tenants.UserInput{ID: "alice", Limits: []vocab.Limit{bucket("requests", vocab.Second, 5, 25)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateUser(ctx, op, "acme", "eng", tenants.UserInput{ID: "bob", Limits: []vocab.Limit{bucket("requests", vocab.Second, 5, 31)}}); err == nil {
		t.Error("user bucket above its team's burst was admitted")
	} else if vs := alloc(err); len(vs) != 1 || vs[0].Field != "limits[0].burst" {
		t.Errorf("user burst above team's: %+v", vs)
	}

	// Lowering a parent's burst below a child's is refused, naming the parent's
	// field and the child; so is it through the plan and the org's override.
	_, err = s.UpdateTeam(ctx, op, "acme", "eng", tenants.TeamPatch{Limits: &[]vocab.Limit{bucket("requests", vocab.Second, 10, 20)}})
	vs = alloc(err)
	if len(vs) != 1 || vs[0].Field != "limits[0].burst" || vs[0].Allocated != 25 ||
		!strings.Contains(vs[0].Message, `team "eng": requests/second burst 20 is below the burst 25 that user "alice" holds`) {
		t.Errorf("team lowering its burst below a user's: %+v", vs)
	}
	_, err = s.UpdateOrg(ctx, op, "acme", tenants.OrgPatch{Limits: &[]vocab.Limit{bucket("requests", vocab.Second, 10, 29)}})
	vs = alloc(err)
	if len(vs) != 1 || vs[0].Field != "limits[0].burst" || !strings.Contains(vs[0].Message, `burst 29 is below the burst 30 that team "eng" holds`) {
		t.Errorf("org override lowering its burst below a team's: %+v", vs)
	}
	_, err = s.UpdatePlan(ctx, op, "pro", tenants.PlanPatch{Limits: &[]vocab.Limit{
		bucket("requests", vocab.Second, 10, 29), lim("requests", vocab.Minute, 100), lim("requests", vocab.Month, 1000)}})
	vs = alloc(err)
	if len(vs) != 1 || vs[0].Field != "limits[0].burst" {
		t.Errorf("plan lowering its burst below a team's: %+v", vs)
	}
	// Turning the parent's bucket into a sliding window of the same rate bounds only
	// the rate: admitted.
	if _, err := s.UpdateTeam(ctx, op, "acme", "eng", tenants.TeamPatch{Limits: &[]vocab.Limit{lim("requests", vocab.Second, 10)},
		UserLimits: &[]vocab.Limit{}}); err != nil {
		t.Errorf("team turning its bucket sliding: %v", err)
	}
}

// The database refuses a burst on a month or concurrent window, or below 1, even
// past the service's validation.
func TestBurstColumnConstraint(t *testing.T) {
	ctx := context.Background()
	pool := planAndOrg(t)
	for _, stmt := range []string{
		`INSERT INTO plan_limits (plan_id, metric, time_window, max_units, burst) VALUES ('pro', 'x', 'month', 1, 5)`,
		`INSERT INTO plan_limits (plan_id, metric, time_window, max_units, burst) VALUES ('pro', 'x', 'second', 1, 0)`,
		`INSERT INTO org_limits (org_id, metric, time_window, max_units, burst) VALUES ('acme', 'x', 'concurrent', 1, 5)`,
	} {
		if _, err := pool.Exec(ctx, stmt); err == nil || !strings.Contains(err.Error(), "burst_check") {
			t.Errorf("%s: err = %v, want the burst check", stmt, err)
		}
	}
	// The JSON of an effective limit omits a sliding window's burst.
	b, _ := json.Marshal(lim("requests", vocab.Second, 1))
	if strings.Contains(string(b), "burst") {
		t.Errorf("sliding limit JSON %s carries a burst", b)
	}
}
