package quota_test

import (
	"context"
	"testing"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// checkAllocsBeforeTracing is what one check through the router allocated before
// tracing existed: this test run at cc09ea5, the parent of the tracing merge, measured
// 20 (docs/TRACING.md "No cost when off": the router and engine test one nil field
// where a span would start). Allocation counts do not drift with the machine's load
// as times do, so this is a test, not a benchmark.
const checkAllocsBeforeTracing = 20

// With tracing off (no tracer provider, the binaries' default) a check allocates no
// more than it did before tracing existed. Without -race only (the race detector's
// instrumentation allocates, 22 or 23 times here): `make test` runs it so.
func TestTracingOffAddsNoAllocationsToACheck(t *testing.T) {
	if raceOn {
		t.Skip("allocation counts under -race are the race detector's; make test runs this test without it")
	}
	r, _ := MustEngines(t, quota.EnginesConfig{})
	org := testenv.ID(t, "org")
	req := quota.Request{Org: org, Team: "eng", User: "alice", Metric: "requests", Cost: 1, Limits: quota.LevelLimits{
		Org:  []vocab.Limit{lim(vocab.Month, 1_000_000_000), lim(vocab.Minute, 1_000_000_000)},
		Team: []vocab.Limit{lim(vocab.Month, 1_000_000_000)},
		User: []vocab.Limit{lim(vocab.Month, 1_000_000_000), lim(vocab.Minute, 1_000_000_000)},
	}}
	ctx := context.Background()
	route := vocab.Route{Plan: "free"}
	check := func() {
		if res, _, err := r.Check(ctx, route, req); err != nil || !res.Allowed {
			t.Fatalf("check: %+v %v", res, err)
		}
	}
	check() // scripts loaded, the org's keys and caches warm
	if n := testing.AllocsPerRun(500, check); n > checkAllocsBeforeTracing {
		t.Errorf("a check with tracing off allocates %.0f times, more than the %d before tracing existed", n, checkAllocsBeforeTracing)
	} else {
		t.Logf("a check with tracing off: %.0f allocations (%d before tracing existed)", n, checkAllocsBeforeTracing)
	}
}
