package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
	"github.com/quotaplane/quotaplane/internal/webhooks"
)

// A counter that crosses a threshold of a limit set just before, while the flusher
// still holds the org's limits from before the change, raises its event once the
// change is announced on the invalidation channel, as the worker subscribes to it:
// the crossing is judged again against the new limits, though the counter does not
// move again.
func TestThresholdOfALimitChangedJustBefore(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	org := e.Prefix + "-o"
	e.Seed(org, []vocab.Limit{monthLimit("requests", 1000)}, nil,
		tenants.TeamInput{ID: "ml", Limits: []vocab.Limit{monthLimit("requests", 600)}})
	f := ledger.NewFlusher(ledger.FlusherConfig{Store: e.Ledger, Tenants: e.Svc, Counters: oneEngine(e.Engine), Logger: quietLog()})
	channel := "quotaplane:" + e.Prefix + ":invalidate"
	tenants.Subscribe(ctx, e.RDB, channel, func(org string) { f.LimitsChanged(org) }, f.AllLimitsChanged)
	flush := func() {
		t.Helper()
		if _, err := f.FlushOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	events := func() int {
		t.Helper()
		evs, err := webhooks.NewStore(e.Pool).Events(ctx, org, 100)
		if err != nil {
			t.Fatal(err)
		}
		return len(evs)
	}

	// The flusher reads the org's limits: carol has none of her own.
	if _, err := e.Check(e.Engine, org, "ml", "carol", "requests", 1); err != nil {
		t.Fatal(err)
	}
	flush()
	// The team's users get 500 a month; carol then spends 400 (80 %).
	if _, err := e.Svc.UpdateTeam(ctx, operator, org, "ml", tenants.TeamPatch{UserLimits: &[]vocab.Limit{monthLimit("requests", 500)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Check(e.Engine, org, "ml", "carol", "requests", 399); err != nil {
		t.Fatal(err)
	}
	flush() // judged against the limits read before the change: no event yet
	if n := events(); n != 0 {
		t.Fatalf("%d events before the change was announced, want 0 (the limits were cached)", n)
	}
	// An api replica announces the change; carol's counter does not move again.
	if err := e.RDB.Publish(ctx, channel, org).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for events() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no usage.threshold event after the limit change was announced: carol's 80 % was lost")
		}
		time.Sleep(50 * time.Millisecond)
		flush()
	}
	if n := events(); n != 1 {
		t.Errorf("%d events, want 1 (carol's 80 %%)", n)
	}
	flush()
	if n := events(); n != 1 {
		t.Errorf("%d events after another flush, want still 1", n)
	}
}

// A threshold check that fails (its org's limits cannot be read: deleted since its
// counters were written) is dropped, and the checks queued behind it are judged at the
// next tick: one org cannot hold every later event back.
func TestAFailingThresholdCheckDoesNotHoldTheQueue(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	org := e.Prefix + "-o"
	e.Seed(org, []vocab.Limit{monthLimit("requests", 10)}, nil)
	f := ledger.NewFlusher(ledger.FlusherConfig{Store: e.Ledger, Tenants: e.Svc, Counters: oneEngine(e.Engine), Logger: quietLog()})
	per := e.Engine.Period(1)
	f.QueueThresholdCheck(e.Prefix+"-gone", per.ID, per.End, map[quota.Counter]int64{{Metric: "requests", Level: vocab.LevelOrg}: 9})
	f.QueueThresholdCheck(org, per.ID, per.End, map[quota.Counter]int64{{Metric: "requests", Level: vocab.LevelOrg}: 9})
	if left := f.RunAfterWork(ctx); left != 1 {
		t.Fatalf("after the failing check %d checks are queued, want 1 (the failing one dropped)", left)
	}
	if left := f.RunAfterWork(ctx); left != 0 {
		t.Fatalf("after the next tick %d checks are queued, want 0", left)
	}
	evs, err := webhooks.NewStore(e.Pool).Events(ctx, org, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 {
		t.Fatalf("%d events for the org queued behind the failing one, want 1 (its 80 %%)", len(evs))
	}
}
