package checks_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// A check draws on every capacity of each metric it names (its org the member, by
// the org's weight in force), and on each fair_share org limit of the metric whose
// metric and window its team has no limit of (its team the member, by the team's
// weight); a check without a team draws on no fair-share limit, and a reservation
// draws as a check does.
func TestCheckDrawsOnCapacities(t *testing.T) {
	ctx := context.Background()
	ten := tenants.NewService(testenv.Postgres(t))
	op := tenants.Actor{Name: "operator"}
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(ten.CreatePlan(ctx, op, tenants.PlanInput{ID: "w4", Name: "W4", FailMode: vocab.FailClosed, Weight: 4,
		Limits: []vocab.Limit{{Metric: "tokens", Window: vocab.Minute, Limit: 1000, FairShare: true}, {Metric: "tokens", Window: vocab.Month, Limit: 1e6},
			{Metric: "requests", Window: vocab.Month, Limit: 100}}}))
	must(ten.CreateOrg(ctx, op, tenants.OrgInput{ID: "big", Name: "Big", PlanID: "w4"}))
	must(ten.CreateTeam(ctx, op, "big", tenants.TeamInput{ID: "web", Name: "Web", Weight: 3}))
	must(ten.CreateTeam(ctx, op, "big", tenants.TeamInput{ID: "own", Name: "Own", Limits: []vocab.Limit{{Metric: "tokens", Window: vocab.Minute, Limit: 100}}}))
	must(ten.CreateCapacity(ctx, op, tenants.CapacityInput{ID: "gpu", Metric: "tokens", Window: vocab.Minute, Limit: 5000}))
	must(ten.CreateCapacity(ctx, op, tenants.CapacityInput{ID: "rq", Metric: "requests", Window: vocab.Second, Limit: 50, Saturation: 1}))
	cache := tenants.NewCache(ten, tenants.CacheOptions{TTL: time.Hour})
	f := newFake(time.Now())
	s := checks.NewService(checks.Config{Cache: cache, Engine: f, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	key := keyOf("big", tenants.ScopeCheck)

	gpu := func(w int64) quota.CapacityDraw {
		return quota.CapacityDraw{Capacity: quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Minute, Limit: 5000, Saturation: 0.8}, Member: "big", Weight: w}
	}
	rq := quota.CapacityDraw{Capacity: quota.Capacity{ID: "rq", Metric: "requests", Window: vocab.Second, Limit: 50, Saturation: 1}, Member: "big", Weight: 4}
	webShare := quota.CapacityDraw{Capacity: quota.Capacity{ID: "big", FairShare: true, Metric: "tokens", Window: vocab.Minute, Limit: 1000, Saturation: 0.8},
		Member: "web", Weight: 3}
	for _, c := range []struct {
		name string
		in   checks.Input
		want []quota.CapacityDraw
	}{
		{"a team without its own minute", in("big", "web", "", "tokens", 10), []quota.CapacityDraw{gpu(4), webShare}},
		{"a team with its own minute", in("big", "own", "", "tokens", 10), []quota.CapacityDraw{gpu(4)}},
		{"no team", in("big", "", "", "tokens", 10), []quota.CapacityDraw{gpu(4)}},
		{"several metrics", costs("big", "web", "", map[string]int64{"tokens": 5, "requests": 1}), []quota.CapacityDraw{rq, gpu(4), webShare}},
	} {
		n := len(f.asked())
		if _, err := s.Check(ctx, key, c.in); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := f.asked()[n].Request.Capacities
		if diff := cmp.Diff(c.want, got); diff != "" {
			t.Errorf("%s: draws (-want +got):\n%s", c.name, diff)
		}
	}

	// The org's own weight overrides its plan's, and reaches the next check at once.
	must(ten.UpdateOrg(ctx, op, "big", tenants.OrgPatch{Weight: ptr(int64(16))}))
	n := len(f.asked())
	if _, err := s.Check(ctx, key, in("big", "", "", "tokens", 1)); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]quota.CapacityDraw{gpu(16)}, f.asked()[n].Request.Capacities); diff != "" {
		t.Errorf("org weight 16: draws (-want +got):\n%s", diff)
	}

	// Envoy's descriptors of one path: the org's and the team's of tokens, and the
	// team's of requests, are one check with every draw of its metrics.
	n = len(f.asked())
	if _, err := s.CheckPaths(ctx, key, []checks.Input{in("big", "", "", "tokens", 1), in("big", "web", "", "tokens", 1), in("big", "web", "", "requests", 1)}); err != nil {
		t.Fatal(err)
	}
	if got := f.asked()[n:]; len(got) != 1 {
		t.Fatalf("%d checks asked, want the one path", len(got))
	} else if diff := cmp.Diff([]quota.CapacityDraw{gpu(16), webShare, {Capacity: rq.Capacity, Member: "big", Weight: 16}}, got[0].Request.Capacities); diff != "" {
		t.Errorf("a path's draws (-want +got):\n%s", diff)
	}

	// A capacity deleted is drawn on by no later check.
	must(nil, ten.DeleteCapacity(ctx, op, "gpu"))
	n = len(f.asked())
	if _, err := s.Check(ctx, key, in("big", "", "", "tokens", 1)); err != nil {
		t.Fatal(err)
	}
	if got := f.asked()[n].Request.Capacities; len(got) != 0 {
		t.Errorf("after gpu was deleted: draws %+v", got)
	}

	if _, err := s.Reserve(ctx, key, checks.ReserveInput{Check: in("big", "web", "", "tokens", -1), Amount: 10}); err != nil {
		t.Fatal(err)
	}
	// A reservation draws its amount as a check draws its cost: here on the org limit
	// of tokens marked fair_share, by team web of weight 3.
	if got := f.reserved[0].Capacities; len(got) != 1 || !got[0].FairShare || got[0].ID != "big" || got[0].Member != "web" || got[0].Weight != 3 {
		t.Errorf("a reservation draws on %+v, want big's fair-share limit by web of weight 3", got)
	}
}
