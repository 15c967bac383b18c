package tenants_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// The metrics an org knows are those of its plan's limits, pricing and metered list
// and of its own overrides; the resolved org carries them, and refusing any other
// names the metric and lists them, sorted.
func TestResolvedOrgKnowsItsMetrics(t *testing.T) {
	ctx := context.Background()
	s := MustService(t)
	if _, err := s.CreatePlan(ctx, op, tenants.PlanInput{ID: "ml", Name: "ML", FailMode: vocab.FailOpen,
		Limits:  []vocab.Limit{lim("requests", vocab.Day, 10)},
		Metered: []string{"tokens", "gpu_seconds"},
		Pricing: &tenants.Pricing{Currency: "EUR", BasePrice: "1", Metrics: []tenants.MetricPrice{{Metric: "images", OveragePrice: "0.1"}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateOrg(ctx, op, tenants.OrgInput{ID: "lab", Name: "Lab", PlanID: "ml",
		Limits: []vocab.Limit{lim("seconds", vocab.Hour, 5)}}); err != nil {
		t.Fatal(err)
	}
	r, err := s.ResolveOrg(ctx, "lab")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"gpu_seconds", "images", "requests", "seconds", "tokens"}
	if diff := cmp.Diff(want, r.Metrics.Sorted()); diff != "" {
		t.Fatalf("metrics (-want +got):\n%s", diff)
	}
	for _, m := range want {
		if err := r.Metrics.Check(m); err != nil {
			t.Errorf("Check(%q) = %v", m, err)
		}
	}
	err = r.Metrics.Check("request")
	var ue *tenants.UnknownMetricError
	if !errors.Is(err, tenants.ErrUnknownMetric) || !errors.As(err, &ue) || ue.Metric != "request" || !cmp.Equal(ue.Known, want) {
		t.Fatalf("Check(request) = %#v", err)
	}
	if got := err.Error(); got != `unknown metric "request": the org's metrics are gpu_seconds, images, requests, seconds, tokens` {
		t.Fatalf("message: %s", got)
	}
	// The error's list is its own: changing it does not change the org's.
	ue.Known[0] = "x"
	if r.Metrics.Sorted()[0] != "gpu_seconds" {
		t.Fatal("the error shares the set's slice")
	}
}

// The check path pays one map lookup for a known metric, and no allocation.
func TestMetricSetCheckDoesNotAllocate(t *testing.T) {
	set := tenants.NewMetricSet([]string{"requests", "tokens"}, []string{"tokens"})
	var err error
	if n := testing.AllocsPerRun(100, func() { err = set.Check("tokens") }); n != 0 || err != nil {
		t.Fatalf("Check allocates %v times (err %v)", n, err)
	}
	if !cmp.Equal(set.Sorted(), []string{"requests", "tokens"}) {
		t.Fatalf("sorted: %v", set.Sorted())
	}
	var zero tenants.MetricSet
	if zero.Has("requests") || zero.Check("requests") == nil {
		t.Fatal("the empty set knows a metric")
	}
}

func TestPlanMeteredValidation(t *testing.T) {
	base := tenants.PlanInput{ID: "p", Name: "P", FailMode: vocab.FailOpen}
	many := make([]string, 101)
	for i := range many {
		many[i] = "m" + string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	for _, tc := range []struct {
		name    string
		metered []string
		fields  []string
	}{
		{"ok", []string{"tokens", "gpu_seconds"}, nil},
		{"bad id", []string{"tokens", "no spaces"}, []string{"metered[1]"}},
		{"empty id", []string{""}, []string{"metered[0]"}},
		{"repeat", []string{"tokens", "tokens"}, []string{"metered[1]"}},
		{"too many", many, []string{"metered"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := base
			in.Metered = tc.metered
			var got []string
			var ve *tenants.ValidationError
			if err := in.Validate(); errors.As(err, &ve) {
				for _, f := range ve.Fields {
					got = append(got, f.Field)
				}
			}
			patch := tenants.PlanPatch{Metered: &tc.metered}
			var gotPatch []string
			if err := patch.Validate(); errors.As(err, &ve) {
				for _, f := range ve.Fields {
					gotPatch = append(gotPatch, f.Field)
				}
			}
			if !cmp.Equal(got, tc.fields) || !cmp.Equal(gotPatch, tc.fields) {
				t.Fatalf("fields: create %v, patch %v, want %v", got, gotPatch, tc.fields)
			}
		})
	}
}
