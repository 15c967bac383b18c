package tenants_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

var op = tenants.Actor{Name: "operator", RequestID: "test"}

func lim(metric string, w vocab.Window, n int64) vocab.Limit {
	return vocab.Limit{Metric: metric, Window: w, Limit: n}
}

// MustService returns a Service on a fresh database with a plan "pro"
// (requests: 1000/month, 100/minute) and an org "acme" on it.
func MustService(tb testing.TB, opts ...tenants.Option) *tenants.Service {
	tb.Helper()
	opts = append(opts, tenants.WithPasswordCost(64, 1))
	s := tenants.NewService(testenv.Postgres(tb), opts...)
	ctx := context.Background()
	if _, err := s.CreatePlan(ctx, op, tenants.PlanInput{ID: "pro", Name: "Pro", FailMode: vocab.FailOpen,
		Limits: []vocab.Limit{lim("requests", vocab.Month, 1000), lim("requests", vocab.Minute, 100)}}); err != nil {
		tb.Fatal(err)
	}
	if _, err := s.CreateOrg(ctx, op, tenants.OrgInput{ID: "acme", Name: "Acme", PlanID: "pro"}); err != nil {
		tb.Fatal(err)
	}
	return s
}

func ptr[T any](v T) *T { return &v }

func TestAllocationRules(t *testing.T) {
	ctx := context.Background()
	s := MustService(t)
	mustTeam := func(id string, ls ...vocab.Limit) {
		t.Helper()
		if _, err := s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: id, Name: id, Limits: ls}); err != nil {
			t.Fatalf("create team %s: %v", id, err)
		}
	}
	mustTeam("eng", lim("requests", vocab.Month, 600))
	if _, err := s.CreateUser(ctx, op, "acme", "eng", tenants.UserInput{ID: "alice", Limits: []vocab.Limit{lim("requests", vocab.Month, 300)}}); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name      string
		do        func() error
		wantField string
		wantMsg   string
	}{
		{"team sum over org", func() error {
			_, err := s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: "ops", Name: "Ops", Limits: []vocab.Limit{lim("requests", vocab.Month, 401)}})
			return err
		}, "limits[0].limit", `team "ops": requests/month limit 401 does not fit in org "acme": it has 1000, 600 is already allocated, 400 is available`},
		{"team month above org: said once, not also as over the sum", func() error {
			_, err := s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: "ops", Name: "Ops", Limits: []vocab.Limit{lim("requests", vocab.Month, 1001)}})
			return err
		}, "limits[0].limit", `team "ops": requests/month limit 1001 is above org "acme"'s limit 1000`},
		{"team minute above org", func() error {
			_, err := s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: "ops", Name: "Ops", Limits: []vocab.Limit{lim("requests", vocab.Minute, 101)}})
			return err
		}, "limits[0].limit", `team "ops": requests/minute limit 101 is above org "acme"'s limit 100`},
		{"user defaults above team", func() error {
			_, err := s.UpdateTeam(ctx, op, "acme", "eng", tenants.TeamPatch{UserLimits: &[]vocab.Limit{lim("requests", vocab.Month, 601)}})
			return err
		}, "user_limits[0].limit", `user defaults of team "eng": requests/month limit 601 is above team "eng"'s limit 600`},
		{"user sum over team", func() error {
			_, err := s.CreateUser(ctx, op, "acme", "eng", tenants.UserInput{ID: "bob", Limits: []vocab.Limit{lim("requests", vocab.Month, 301)}})
			return err
		}, "limits[0].limit", `user "bob": requests/month limit 301 does not fit in team "eng": it has 600, 300 is already allocated, 300 is available`},
		{"lower team below its user", func() error {
			_, err := s.UpdateTeam(ctx, op, "acme", "eng", tenants.TeamPatch{Limits: &[]vocab.Limit{lim("requests", vocab.Month, 299)}})
			return err
		}, "limits[0].limit", `team "eng": requests/month limit 299 is below the 300 that user "alice" holds`},
		{"lower org below its teams", func() error {
			_, err := s.UpdateOrg(ctx, op, "acme", tenants.OrgPatch{Limits: &[]vocab.Limit{lim("requests", vocab.Month, 599)}})
			return err
		}, "limits[0].limit", `org "acme": requests/month limit 599 is below the 600 that team "eng" holds`},
		{"lower plan below an org's teams", func() error {
			_, err := s.UpdatePlan(ctx, op, "pro", tenants.PlanPatch{Limits: &[]vocab.Limit{lim("requests", vocab.Month, 500)}})
			return err
		}, "limits[0].limit", `org "acme": requests/month limit 500 is below the 600 that team "eng" holds`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := auditCount(t, s)
			err := tc.do()
			var ae *tenants.AllocationError
			if !errors.As(err, &ae) || !errors.Is(err, tenants.ErrOverAllocated) {
				t.Fatalf("err = %v, want an AllocationError", err)
			}
			got := ae.Violations[0]
			if len(ae.Violations) != 1 {
				t.Errorf("%d violations, want 1: %+v", len(ae.Violations), ae.Violations)
			}
			if got.Field != tc.wantField || got.Message != tc.wantMsg {
				t.Errorf("violation = %q at %q\nwant        %q at %q", got.Message, got.Field, tc.wantMsg, tc.wantField)
			}
			if after := auditCount(t, s); after != before {
				t.Errorf("refused change wrote %d audit rows", after-before)
			}
		})
	}

	// Nothing refused above changed anything.
	team, _ := s.GetTeam(ctx, "acme", "eng")
	if diff := cmp.Diff([]vocab.Limit{lim("requests", vocab.Month, 600)}, team.Limits); diff != "" {
		t.Errorf("team limits changed (-want +got):\n%s", diff)
	}
	if _, err := s.GetTeam(ctx, "acme", "ops"); !errors.Is(err, tenants.ErrNotFound) {
		t.Errorf("refused team exists: %v", err)
	}

	// Oversubscription lifts the sum rule, never the per-child one; turning it off
	// again while oversubscribed is refused.
	if _, err := s.UpdateOrg(ctx, op, "acme", tenants.OrgPatch{Oversubscribe: ptr(true)}); err != nil {
		t.Fatal(err)
	}
	mustTeam("ops", lim("requests", vocab.Month, 900))
	if _, err := s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: "big", Name: "Big", Limits: []vocab.Limit{lim("requests", vocab.Month, 1001)}}); !errors.Is(err, tenants.ErrOverAllocated) {
		t.Errorf("child above parent while oversubscribed: err = %v", err)
	}
	if _, err := s.UpdateOrg(ctx, op, "acme", tenants.OrgPatch{Oversubscribe: ptr(false)}); !errors.Is(err, tenants.ErrOverAllocated) {
		t.Errorf("oversubscribe off with 1500 allocated of 1000: err = %v", err)
	}
}

func auditCount(t *testing.T, s *tenants.Service) int {
	t.Helper()
	es, _, err := s.ListAudit(context.Background(), "acme", tenants.Page{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// 100 concurrent conflicting allocation edits: creates and raises of teams, each
// valid alone, together far above the org. The sum may never exceed the org's limit.
func TestConcurrentAllocationNeverOversubscribes(t *testing.T) {
	ctx := context.Background()
	s := MustService(t)
	for i := range 10 {
		if _, err := s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: fmt.Sprintf("t%d", i), Name: "t",
			Limits: []vocab.Limit{lim("requests", vocab.Month, 10)}}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[string]int{}
	for i := range 100 {
		wg.Go(func() {
			var err error
			if i%2 == 0 {
				_, err = s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: fmt.Sprintf("n%d", i), Name: "n",
					Limits: []vocab.Limit{lim("requests", vocab.Month, 90)}})
			} else {
				_, err = s.UpdateTeam(ctx, op, "acme", fmt.Sprintf("t%d", i%10), tenants.TeamPatch{
					Limits: &[]vocab.Limit{lim("requests", vocab.Month, int64(10+i))}})
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				outcomes["ok"]++
			case errors.Is(err, tenants.ErrOverAllocated):
				outcomes["refused"]++
			default:
				t.Errorf("edit %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	teams, _, err := s.ListTeams(ctx, "acme", tenants.Page{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, tm := range teams {
		for _, l := range tm.Limits {
			if l.Window == vocab.Month {
				sum += l.Limit
			}
		}
	}
	t.Logf("outcomes %v, teams %d, allocated %d of 1000", outcomes, len(teams), sum)
	if sum > 1000 {
		t.Fatalf("teams hold %d, above the org's 1000", sum)
	}
	if outcomes["refused"] == 0 || outcomes["ok"] == 0 {
		t.Fatalf("outcomes %v: the test did not create conflicts", outcomes)
	}
}

func TestAPIKeys(t *testing.T) {
	ctx := context.Background()
	s := MustService(t)
	k, token, err := s.CreateAPIKey(ctx, op, "acme", tenants.APIKeyInput{Name: "ci", Scopes: []tenants.Scope{tenants.ScopeCheck}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Authenticate(ctx, token)
	if err != nil || got.ID != k.ID || got.OrgID != "acme" || !got.HasScope(tenants.ScopeCheck) || got.HasScope(tenants.ScopeAdmin) {
		t.Fatalf("Authenticate = %+v, %v", got, err)
	}
	tampered := token[:len(token)-1] + "A"
	if tampered == token {
		tampered = token[:len(token)-1] + "B"
	}
	for name, tok := range map[string]string{"tampered": tampered, "empty": "", "garbage": "qpk_zz", "operator-like": "secret-operator-token"} {
		if _, err := s.Authenticate(ctx, tok); !errors.Is(err, tenants.ErrBadToken) {
			t.Errorf("%s token: err = %v, want ErrBadToken", name, err)
		}
	}
	if err := s.RevokeAPIKey(ctx, op, "acme", k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, token); !errors.Is(err, tenants.ErrBadToken) {
		t.Errorf("revoked key authenticates: %v", err)
	}
	if err := s.RevokeAPIKey(ctx, op, "other", k.ID); !errors.Is(err, tenants.ErrNotFound) {
		t.Errorf("revoke through another org: %v", err)
	}
}

func TestConsoleLogin(t *testing.T) {
	ctx := context.Background()
	s := MustService(t)
	if _, err := s.CreateConsoleUser(ctx, op, "acme", tenants.ConsoleUserInput{Email: "ada@acme.test", Password: "correct horse battery", Role: tenants.RoleAdmin}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateConsoleUser(ctx, op, "acme", tenants.ConsoleUserInput{Email: "ADA@acme.test", Password: "another long one", Role: tenants.RoleViewer}); !errors.Is(err, tenants.ErrExists) {
		t.Errorf("duplicate email (case-insensitive): %v", err)
	}
	if u, err := s.VerifyConsoleLogin(ctx, "acme", "ada@acme.test", "correct horse battery"); err != nil || u.OrgID != "acme" {
		t.Errorf("login = %+v, %v", u, err)
	}
	if _, err := s.VerifyConsoleLogin(ctx, "acme", "ada@acme.test", "wrong password!!"); !errors.Is(err, tenants.ErrNotFound) {
		t.Errorf("wrong password: %v", err)
	}
}

func TestEffectiveLimitsMergeOverrides(t *testing.T) {
	ctx := context.Background()
	s := MustService(t)
	o, err := s.UpdateOrg(ctx, op, "acme", tenants.OrgPatch{Limits: &[]vocab.Limit{lim("requests", vocab.Minute, 50), lim("tokens", vocab.Month, 5)}})
	if err != nil {
		t.Fatal(err)
	}
	want := []vocab.Limit{lim("requests", vocab.Minute, 50), lim("requests", vocab.Month, 1000), lim("tokens", vocab.Month, 5)}
	if diff := cmp.Diff(want, o.EffectiveLimits); diff != "" {
		t.Errorf("effective limits (-want +got):\n%s", diff)
	}
}

// Walking the pages of a list returns every item once, in id order.
func TestListPagination(t *testing.T) {
	ctx := context.Background()
	s := MustService(t)
	var want []string
	for i := range 5 {
		id := fmt.Sprintf("team-%d", i)
		want = append(want, id)
		if _, err := s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: id, Name: id}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	cursor, pages := "", 0
	for {
		teams, next, err := s.ListTeams(ctx, "acme", tenants.Page{Limit: 2, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, tm := range teams {
			got = append(got, tm.ID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if diff := cmp.Diff(want, got); diff != "" || pages != 3 {
		t.Errorf("%d pages; ids (-want +got):\n%s", pages, diff)
	}
	if _, _, err := s.ListTeams(ctx, "acme", tenants.Page{Cursor: "%%%"}); !errors.Is(err, tenants.ErrInvalid) {
		t.Errorf("bad cursor: %v", err)
	}
}
