package ledger_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// duringTick is the engine's counters with a hook run once, inside a flush, right
// after the first drain of an org: a check that lands while the tick is running.
type duringTick struct {
	eng  *quota.Engine
	once sync.Once
	hook func()
}

func (d *duringTick) CountersFor(string, vocab.Route) (ledger.Counters, error) { return d, nil }
func (d *duringTick) DirtyIndexes() ([]ledger.DirtyIndex, error) {
	return []ledger.DirtyIndex{d.eng}, nil
}

// The quota.Engine methods the flusher uses, the drain with the hook after it.
func (d *duringTick) MonthUsage(ctx context.Context, org, period string) (map[quota.Counter]int64, error) {
	return d.eng.MonthUsage(ctx, org, period)
}
func (d *duringTick) WouldBlockVersion(ctx context.Context, org, period string) (string, int64, error) {
	return d.eng.WouldBlockVersion(ctx, org, period)
}
func (d *duringTick) WouldBlock(ctx context.Context, org, period string) (quota.WouldBlockRecord, error) {
	return d.eng.WouldBlock(ctx, org, period)
}
func (d *duringTick) Drain(ctx context.Context, org, period string) (quota.Drained, error) {
	out, err := d.eng.Drain(ctx, org, period)
	if d.hook != nil && len(out.Counters) > 0 {
		d.once.Do(d.hook)
	}
	return out, err
}
func (d *duringTick) Undrain(ctx context.Context, org string, recs []quota.ReservationRecord) error {
	return d.eng.Undrain(ctx, org, recs)
}
func (d *duringTick) HeldUnits(ctx context.Context, org, period string) (map[quota.Counter]int64, error) {
	return d.eng.HeldUnits(ctx, org, period)
}

// A flush visits only the orgs with new usage (the first one, also those a worker
// had in flight: none here): idle orgs cost nothing, and an org that changes while a tick runs
// (after the tick popped the dirty-org index) is persisted by the next tick: both an
// org the tick had already drained (its counter changes again) and one it had not
// popped at all.
func TestFlushVisitsDirtyOrgsAndCatchesChangesDuringATick(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, b := testenv.ID(t, "a"), testenv.ID(t, "b")
	idle := []string{testenv.ID(t, "i1"), testenv.ID(t, "i2"), testenv.ID(t, "i3")}
	for _, o := range append([]string{a, b}, idle...) {
		e.Seed(o, []vocab.Limit{monthLimit("requests", 1000)}, nil)
	}
	src := &duringTick{eng: e.Engine}
	f := ledger.NewFlusher(ledger.FlusherConfig{Store: e.Ledger, Tenants: e.Svc, Counters: src, Interval: time.Hour, Logger: quietLog()})
	st, err := f.FlushOnce(ctx)
	if err != nil || st.Orgs != 0 {
		t.Fatalf("first flush with nothing in flight: %+v, %v; want no org visited", st, err)
	}
	if st, err = f.FlushOnce(ctx); err != nil || st.Orgs != 0 || st.Read != 0 {
		t.Fatalf("idle flush visited %d orgs, read %d (%v); want none", st.Orgs, st.Read, err)
	}

	// A tick that drains a; while it runs, a checks again (the counter it drained) and
	// b checks for the first time.
	check := func(org string) {
		if _, err := e.Check(e.Engine, org, "", "", "requests", 1); err != nil {
			t.Fatal(err)
		}
	}
	check(a)
	src.hook = func() { check(a); check(b) }
	if st, err = f.FlushOnce(ctx); err != nil || st.Orgs != 1 || st.Dirty != 1 {
		t.Fatalf("flush of one dirty org: %+v, %v; want 1 org visited", st, err)
	}
	per := e.Engine.Period(1).ID
	orgC := quota.Counter{Metric: "requests", Level: vocab.LevelOrg}
	stored := func(org string) int64 {
		u, err := e.Ledger.Usage(ctx, org, per)
		if err != nil {
			t.Fatal(err)
		}
		return u[orgC]
	}
	if got := stored(a); got != 1 {
		t.Fatalf("a stored %d after the tick, want 1 (the check before it)", got)
	}
	if st, err = f.FlushOnce(ctx); err != nil || st.Orgs != 2 {
		t.Fatalf("next flush: %+v, %v; want a and b visited", st, err)
	}
	if ga, gb := stored(a), stored(b); ga != 2 || gb != 1 {
		t.Fatalf("after the next tick a stored %d, b %d; want 2 and 1", ga, gb)
	}
	if st, err = f.FlushOnce(ctx); err != nil || st.Orgs != 0 {
		t.Fatalf("idle again: %+v, %v", st, err)
	}
}
