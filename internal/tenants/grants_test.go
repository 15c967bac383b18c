package tenants_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

func monthLimit(t *testing.T, s *tenants.Service, org string) int64 {
	t.Helper()
	o, err := s.GetOrg(context.Background(), org)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range o.EffectiveLimits {
		if l.Metric == "requests" && l.Window == vocab.Month {
			return l.Limit
		}
	}
	t.Fatalf("org %s has no requests/month limit: %+v", org, o.EffectiveLimits)
	return 0
}

// A grant raises the org's month limit (not its sliding windows) while active, the
// allocation rules and a change of the org's overrides see the raised limit, and at
// until it lapses by itself; revoking a lapsed grant changes nothing; concurrent
// grants add up exactly; a grant of another org is not found.
func TestGrantsRaiseTheMonthLimitUntilTheyLapse(t *testing.T) {
	ctx := context.Background()
	clock := testenv.NewClock(time.Now())
	s := MustService(t, tenants.WithClock(clock.Now))
	var mu sync.Mutex
	var changed []string
	s.OnChange(func(ids ...string) { mu.Lock(); changed = append(changed, ids...); mu.Unlock() })

	until := clock.Now().Add(time.Hour)
	g, err := s.CreateGrant(ctx, op, "acme", tenants.GrantInput{Metric: "requests", Units: 500, Reason: "launch", Until: until})
	if err != nil {
		t.Fatal(err)
	}
	if !g.Active(clock.Now()) || !g.Until.Equal(until.Truncate(time.Microsecond)) || len(changed) != 1 || changed[0] != "acme" {
		t.Fatalf("grant %+v, changes %v", g, changed)
	}
	o, err := s.GetOrg(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	want := []vocab.Limit{lim("requests", vocab.Minute, 100), lim("requests", vocab.Month, 1500)}
	if len(o.EffectiveLimits) != 2 || o.EffectiveLimits[0] != want[0] || o.EffectiveLimits[1] != want[1] ||
		o.Granted["requests"] != 500 || !o.GrantsLapse.Equal(g.Until) {
		t.Fatalf("org with the grant: %+v", o)
	}

	// A team fits only with the grant; lowering the org's override stays allowed as
	// long as the override plus the grant still covers it.
	if _, err := s.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: "eng", Name: "Eng",
		Limits: []vocab.Limit{lim("requests", vocab.Month, 1200)}}); err != nil {
		t.Fatalf("team of 1200 under 1000 + 500 granted: %v", err)
	}
	if _, err := s.UpdateOrg(ctx, op, "acme", tenants.OrgPatch{Limits: &[]vocab.Limit{lim("requests", vocab.Month, 800)}}); err != nil {
		t.Fatalf("override of 800 + 500 granted under a team of 1200: %v", err)
	}
	if _, err := s.UpdateOrg(ctx, op, "acme", tenants.OrgPatch{Limits: &[]vocab.Limit{lim("requests", vocab.Month, 600)}}); !errors.Is(err, tenants.ErrOverAllocated) {
		t.Fatalf("override of 600 + 500 granted under a team of 1200: %v, want ErrOverAllocated", err)
	}
	if got := monthLimit(t, s, "acme"); got != 1300 {
		t.Fatalf("month limit %d, want 800 + 500", got)
	}

	clock.Add(time.Hour)
	if got := monthLimit(t, s, "acme"); got != 800 {
		t.Fatalf("month limit once the grant lapsed: %d, want 800", got)
	}
	mu.Lock()
	n := len(changed)
	mu.Unlock()
	if err := s.RevokeGrant(ctx, op, "acme", g.ID); err != nil {
		t.Fatal(err)
	}
	if len(changed) != n {
		t.Fatal("revoking a lapsed grant announced a change")
	}
	gs, _, err := s.ListGrants(ctx, "acme", tenants.Page{})
	if err != nil || len(gs) != 1 || gs[0].RevokedAt != nil || gs[0].Active(clock.Now()) {
		t.Fatalf("grants after the lapse: %+v %v", gs, err)
	}

	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.CreateGrant(ctx, op, "acme", tenants.GrantInput{Metric: "requests", Units: 10, Reason: "burst"}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	r, err := s.ResolveOrg(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if r.Org.Granted["requests"] != 100 || monthLimit(t, s, "acme") != 900 {
		t.Fatalf("10 concurrent grants of 10: granted %v, limit %d, want 100 and 900", r.Org.Granted, monthLimit(t, s, "acme"))
	}

	if _, err := s.CreateOrg(ctx, op, tenants.OrgInput{ID: "beta", Name: "Beta", PlanID: "pro"}); err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeGrant(ctx, op, "beta", g.ID); !errors.Is(err, tenants.ErrNotFound) {
		t.Fatalf("acme's grant through beta: %v, want ErrNotFound", err)
	}
	if _, _, err := s.ListGrants(ctx, "nope", tenants.Page{}); !errors.Is(err, tenants.ErrNotFound) {
		t.Fatalf("grants of an unknown org: %v", err)
	}
}

// Pages of grants, newest first, follow each other without a repeat or a gap.
func TestListGrantsPages(t *testing.T) {
	ctx := context.Background()
	clock := testenv.NewClock(time.Now())
	s := MustService(t, tenants.WithClock(clock.Now))
	var ids []string
	for range 5 {
		g, err := s.CreateGrant(ctx, op, "acme", tenants.GrantInput{Metric: "requests", Units: 1, Reason: "r"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append([]string{g.ID}, ids...)
		clock.Add(time.Second)
	}
	var got []string
	cursor := ""
	for {
		gs, next, err := s.ListGrants(ctx, "acme", tenants.Page{Limit: 2, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range gs {
			got = append(got, g.ID)
		}
		if cursor = next; cursor == "" {
			break
		}
	}
	if len(got) != 5 {
		t.Fatalf("pages %v, want %v", got, ids)
	}
	for i := range ids {
		if got[i] != ids[i] {
			t.Fatalf("pages %v, want %v", got, ids)
		}
	}
}

// On the engines' clock (the binaries pass quota.Engines.DefaultNow to WithClock), a
// grant lapses when Redis time passes its until: a stepped wall clock lapses none
// early and keeps none late.
func TestGrantLapsesOnTheEngineClock(t *testing.T) {
	ctx := context.Background()
	clock := testenv.NewClock(time.Now())
	router, err := quota.NewEngines(quota.EnginesConfig{DefaultURL: testenv.RedisURL(t), RedisTimeout: 2 * time.Second,
		Engine: quota.Config{KeyPrefix: testenv.ID(t, "g"), Clock: clock.Now, Monotonic: clock.Monotonic, ClockSync: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = router.Close() })
	s := MustService(t, tenants.WithClock(router.DefaultNow))
	if _, err := s.CreateGrant(ctx, op, "acme", tenants.GrantInput{Metric: "requests", Units: 500, Reason: "launch",
		Until: router.DefaultNow().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	for _, step := range []time.Duration{2 * time.Hour, -4 * time.Hour, 2 * time.Hour} {
		clock.Step(step) // the wall clock only
		if got := monthLimit(t, s, "acme"); got != 1500 {
			t.Errorf("after a %v step of the wall clock the month limit is %d, want 1000 + 500 granted", step, got)
		}
	}
	clock.Add(time.Hour) // Redis time passes until
	if got := monthLimit(t, s, "acme"); got != 1000 {
		t.Errorf("an hour later the month limit is %d, want 1000: the grant lapsed", got)
	}
}
