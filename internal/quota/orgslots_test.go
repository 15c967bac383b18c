package quota_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// The in-flight table holds the orgs with a check in flight, not every org ever
// checked: after checks and reservations of 2,000 orgs, single and in batches,
// concurrent and not, it is empty again. A table that kept an entry per org would hold
// 2,000, and at 100,000 tenants its entries would be live heap that every garbage
// collection scans.
func TestInFlightTableShrinksWhenChecksEnd(t *testing.T) {
	t.Parallel()
	r, _ := MustEngines(t, quota.EnginesConfig{MaxInFlightPerOrg: 4})
	ctx := context.Background()
	base := testenv.ID(t, "org")
	route := vocab.Route{FailMode: vocab.FailOpen}
	req := func(i int) quota.Request {
		return quota.Request{Org: fmt.Sprintf("%s-%d", base, i), Metric: "requests", Cost: 1,
			Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Minute, 1000)}}}
	}
	const orgs = 2000
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < orgs; i += 8 {
				if _, _, err := r.Check(ctx, route, req(i)); err != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d checks failed", n)
	}
	routes := []vocab.Route{route, route, route}
	if _, _, errs := r.CheckBatch(ctx, routes, []quota.Request{req(0), req(1), req(0)}); errs[0] != nil || errs[1] != nil || errs[2] != nil {
		t.Fatalf("batch: %v", errs)
	}
	if _, _, err := r.Reserve(ctx, route, req(2), quota.ReserveOptions{}); err != nil {
		t.Fatalf("reserve: %v", err)
	}
	if n := quota.InFlightOrgs(r); n != 0 {
		t.Errorf("the in-flight table holds %d orgs with nothing in flight, want 0", n)
	}
	// The bound still holds per org once entries come and go.
	s := quota.NewOrgSlots(2)
	if !s.Acquire("a") || !s.Acquire("a") || s.Acquire("a") {
		t.Error("org a: want 2 slots, then a refusal")
	}
	if !s.Acquire("b") {
		t.Error("org b refused while org a is at its bound")
	}
	s.Release("a")
	if !s.Acquire("a") {
		t.Error("org a refused after one of its slots was given back")
	}
}

// BenchmarkOrgSlotsSpread takes and gives back an in-flight slot of one of 100,000
// orgs per op, the orgs in turn, as checks spread over every tenant do.
func BenchmarkOrgSlotsSpread(b *testing.B) {
	orgs := make([]string, 100_000)
	for i := range orgs {
		orgs[i] = fmt.Sprintf("org-%06d", i)
	}
	s := quota.NewOrgSlots(256)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		o := orgs[i%len(orgs)]
		s.Acquire(o)
		s.Release(o)
		i++
	}
}
