package quota_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// TestEnginesPlanAndOrgMetrics: every check counts in quotaplane_plan_checks_total by
// plan, decision and degraded, and in quotaplane_org_checks_total by org and
// decision, with at most MetricsOrgs orgs of their own and the rest as "_other".
func TestEnginesPlanAndOrgMetrics(t *testing.T) {
	t.Parallel()
	r, reg := MustEngines(t, quota.EnginesConfig{MetricsOrgs: 2})
	ctx := context.Background()
	orgs := []string{testenv.ID(t, "a"), testenv.ID(t, "b"), testenv.ID(t, "c"), testenv.ID(t, "d")}
	// Each org has a minute limit of 2 and asks 3 times: 2 allowed, 1 denied.
	for _, org := range orgs {
		for range 3 {
			_, _, err := r.Check(ctx, vocab.Route{Plan: "pro", FailMode: vocab.FailClosed}, quota.Request{Org: org, Metric: "requests", Cost: 1,
				Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Minute, 2)}}})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	// A check without a plan.
	if _, _, err := r.Check(ctx, vocab.Route{FailMode: vocab.FailClosed}, quota.Request{Org: orgs[0], Metric: "requests"}); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name   string
		metric string
		labels map[string]string
		want   float64
	}{
		{"plan allowed", "quotaplane_plan_checks_total", map[string]string{"plan": "pro", "decision": "allowed", "degraded": "false"}, 8},
		{"plan denied", "quotaplane_plan_checks_total", map[string]string{"plan": "pro", "decision": "denied", "degraded": "false"}, 4},
		{"no plan", "quotaplane_plan_checks_total", map[string]string{"plan": "none", "decision": "allowed"}, 1},
		{"first org allowed", "quotaplane_org_checks_total", map[string]string{"org": orgs[0], "decision": "allowed"}, 3},
		{"first org denied", "quotaplane_org_checks_total", map[string]string{"org": orgs[0], "decision": "denied"}, 1},
		{"second org denied", "quotaplane_org_checks_total", map[string]string{"org": orgs[1], "decision": "denied"}, 1},
		{"third org has no series", "quotaplane_org_checks_total", map[string]string{"org": orgs[2]}, -1},
		{"fourth org has no series", "quotaplane_org_checks_total", map[string]string{"org": orgs[3]}, -1},
		{"others allowed", "quotaplane_org_checks_total", map[string]string{"org": quota.OtherOrgs, "decision": "allowed"}, 4},
		{"others denied", "quotaplane_org_checks_total", map[string]string{"org": quota.OtherOrgs, "decision": "denied"}, 2},
	}
	for _, tt := range tests {
		if got := metricValue(t, reg, tt.metric, tt.labels); got != tt.want {
			t.Errorf("%s: %s%v = %v, want %v", tt.name, tt.metric, tt.labels, got, tt.want)
		}
	}
}

// TestEnginesPlanMetricsDegraded: answers of a fail mode count as degraded="true"
// under the org's plan.
func TestEnginesPlanMetricsDegraded(t *testing.T) {
	t.Parallel()
	dead := MustPrivateRedis(t)
	dead.Kill(t)
	r, reg := MustEngines(t, quota.EnginesConfig{})
	org := testenv.ID(t, "org")
	for range 2 {
		_, out, err := r.Check(context.Background(), vocab.Route{Plan: "free", RedisURL: dead.URL(), FailMode: vocab.FailOpen},
			quota.Request{Org: org, Metric: "requests", Cost: 1, Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Minute, 10)}}})
		if err != nil || !out.Degraded {
			t.Fatalf("check on a dead Redis with fail mode open: degraded %v, err %v; want degraded, no error", out.Degraded, err)
		}
	}
	if got := metricValue(t, reg, "quotaplane_plan_checks_total", map[string]string{"plan": "free", "decision": "allowed", "degraded": "true"}); got != 2 {
		t.Errorf("degraded allowed checks of plan free = %v, want 2", got)
	}
}

// TestEnginesOrgMetricsCapConcurrent: orgs checked for the first time at once still get
// at most MetricsOrgs series of their own, and no check is lost from the counts.
func TestEnginesOrgMetricsCapConcurrent(t *testing.T) {
	t.Parallel()
	// A machine busy with other tests under -race can take more than the 100 ms
	// default to open 100 connections; this test is about counting, not timeouts.
	r, reg := MustEngines(t, quota.EnginesConfig{MetricsOrgs: 5, RedisTimeout: 5 * time.Second})
	prefix := testenv.ID(t, "o")
	const orgs, each = 20, 5
	var wg sync.WaitGroup
	errs := make(chan error, orgs*each)
	for i := range orgs {
		for range each {
			wg.Go(func() {
				_, _, err := r.Check(context.Background(), vocab.Route{Plan: "pro", FailMode: vocab.FailClosed},
					quota.Request{Org: fmt.Sprintf("%s-%d", prefix, i), Metric: "requests"})
				errs <- err
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	byOrg := map[string]float64{} // every decision of an org has a series from its first check
	for _, mf := range mfs {
		if mf.GetName() != "quotaplane_org_checks_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			total += m.GetCounter().GetValue()
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "org" && lp.GetValue() != quota.OtherOrgs {
					byOrg[lp.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	for org, v := range byOrg {
		if v != each {
			t.Errorf("org %s counted %v checks, want %d", org, v, each)
		}
	}
	if named := len(byOrg); named != 5 || total != orgs*each {
		t.Errorf("%d orgs with a series of their own and %v checks counted, want 5 and %d", named, total, orgs*each)
	}
	if got := metricValue(t, reg, "quotaplane_plan_checks_total", map[string]string{"plan": "pro"}); got != orgs*each {
		t.Errorf("plan pro counted %v checks, want %d", got, orgs*each)
	}
}

// TestEnginesOrgMetricsOff: QUOTA_METRICS_ORGS=0 (quota.MetricsOrgs(0)) gives no org a
// series of its own.
func TestEnginesOrgMetricsOff(t *testing.T) {
	t.Parallel()
	r, reg := MustEngines(t, quota.EnginesConfig{MetricsOrgs: quota.MetricsOrgs(0)})
	org := testenv.ID(t, "org")
	if _, _, err := r.Check(context.Background(), vocab.Route{FailMode: vocab.FailClosed}, quota.Request{Org: org, Metric: "requests"}); err != nil {
		t.Fatal(err)
	}
	if got := metricValue(t, reg, "quotaplane_org_checks_total", map[string]string{"org": org}); got != -1 {
		t.Errorf("org %s has a series (%v), want none", org, got)
	}
	if got := metricValue(t, reg, "quotaplane_org_checks_total", map[string]string{"org": quota.OtherOrgs, "decision": "allowed"}); got != 1 {
		t.Errorf("_other allowed = %v, want 1", got)
	}
}
