package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// A flush writes exactly the counters that changed, at every level, and a stored
// value never goes down.
func TestFlushPersistsChangedCountersMonotonically(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	org := testenv.ID(t, "org")
	e.Seed(org, []vocab.Limit{monthLimit("requests", 1000)}, nil, tenants.TeamInput{ID: "eng"}, tenants.TeamInput{ID: "ops"})
	f := e.Flusher(time.Hour)

	for i := range 30 {
		team := []string{"eng", "ops"}[i%2]
		if _, err := e.Check(e.Engine, org, team, fmt.Sprintf("u%d", i%5), "requests", 2); err != nil {
			t.Fatal(err)
		}
	}
	st, err := f.FlushOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	per := e.Engine.Period(1).ID
	live, err := e.Engine.MonthUsage(ctx, org, per)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := e.Ledger.Usage(ctx, org, per)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(live, stored); diff != "" {
		t.Fatalf("ledger differs from Redis (-redis +ledger):\n%s", diff)
	}
	// org + 2 teams + 10 (team, user) pairs... u0..u4 alternate teams: 5 users x 2 teams.
	if st.Read != 1+2+10 || st.Written != 13 {
		t.Fatalf("first flush read %d, wrote %d; want 13, 13", st.Read, st.Written)
	}
	if got := stored[quota.Counter{Metric: "requests", Level: vocab.LevelOrg}]; got != 60 {
		t.Fatalf("org counter %d, want 60", got)
	}

	// Nothing changed: nothing read, nothing written.
	if st, err = f.FlushOnce(ctx); err != nil || st.Read != 0 || st.Written != 0 {
		t.Fatalf("idle flush: %+v, %v", st, err)
	}
	// One more check changes three counters (org, team, user) and only those are read.
	if _, err := e.Check(e.Engine, org, "eng", "u0", "requests", 1); err != nil {
		t.Fatal(err)
	}
	if st, err = f.FlushOnce(ctx); err != nil || st.Read != 3 || st.Written != 3 {
		t.Fatalf("flush after one check: %+v, %v; want 3 read, 3 written", st, err)
	}
	// A stale (lower) value, e.g. from a slow worker, never lowers a stored one.
	orgC := quota.Counter{Metric: "requests", Level: vocab.LevelOrg}
	if n, err := e.Ledger.Persist(ctx, org, per, time.Now(), map[quota.Counter]int64{orgC: 5}); err != nil || n != 0 {
		t.Fatalf("stale persist raised %d values (%v)", n, err)
	}
	stored, _ = e.Ledger.Usage(ctx, org, per)
	if stored[orgC] != 61 {
		t.Fatalf("org counter after a stale write: %d, want 61", stored[orgC])
	}
}

// A Redis that lost an org's month counters gets them back from the ledger before the
// next check is decided: the check that finds them missing sees the stored usage.
func TestLostCountersAreHydratedFromLedger(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	org := testenv.ID(t, "org")
	e.Seed(org, []vocab.Limit{monthLimit("requests", 100)}, nil,
		tenants.TeamInput{ID: "eng", UserLimits: []vocab.Limit{monthLimit("requests", 10)}})
	for range 7 {
		if _, err := e.Check(e.Engine, org, "eng", "alice", "requests", 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Flusher(time.Hour).FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	per := e.Engine.Period(1).ID
	// Lose the org's month hash (as a restart without persistence would).
	if err := e.RDB.Del(ctx, e.Prefix+":{"+org+"}|m|"+per).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := e.Check(e.Engine, org, "eng", "alice", "requests", 3)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Allowed {
		t.Fatalf("7 + 3 <= 10 denied: %+v", res)
	}
	for _, l := range res.Levels {
		if l.Level == vocab.LevelUser && l.Used != 10 {
			t.Fatalf("user used %d after hydration, want 10", l.Used)
		}
	}
	if res, _ := e.Check(e.Engine, org, "eng", "alice", "requests", 1); res.Allowed {
		t.Fatal("11th unit allowed: hydration lost usage")
	}
}

// The daily history goes with the ledger: a flush records the org's month total for
// its UTC day; usage of an ended period flushed after its end counts for its last day;
// a lower write changes nothing.
func TestFlushRecordsDailyHistory(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	org := testenv.ID(t, "org")
	e.Seed(org, []vocab.Limit{monthLimit("requests", 1000)}, nil, tenants.TeamInput{ID: "eng"})
	per := e.Engine.Period(1)
	flushAt := func(at time.Time) {
		t.Helper()
		f := ledger.NewFlusher(ledger.FlusherConfig{Store: e.Ledger, Tenants: e.Svc, Counters: oneEngine(e.Engine),
			Logger: quietLog(), Clock: func() time.Time { return at }})
		if _, err := f.FlushOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	spend := func(n int64) {
		t.Helper()
		if _, err := e.Check(e.Engine, org, "eng", "alice", "requests", n); err != nil {
			t.Fatal(err)
		}
	}
	spend(4)
	flushAt(per.Start.Add(10 * time.Hour)) // day 1
	spend(6)
	flushAt(per.End.Add(30 * time.Minute)) // the next period: per is the previous one now
	orgC := quota.Counter{Metric: "requests", Level: vocab.LevelOrg}
	if n, err := e.Ledger.Persist(ctx, org, per.ID, per.Start, map[quota.Counter]int64{orgC: 1}); err != nil || n != 0 {
		t.Fatalf("stale persist: %d, %v", n, err)
	}
	got, err := e.Ledger.Daily(ctx, org, per.ID)
	if err != nil {
		t.Fatal(err)
	}
	last := per.End.AddDate(0, 0, -1)
	want := map[string][]ledger.DayUsage{"requests": {{Day: per.Start, Used: 4}, {Day: last, Used: 10}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("daily history (-want +got):\n%s", diff)
	}
}

// A worker killed -9 in the middle of a flush (make faults SEED=1: user hot/h75, 2,069
// admitted units missing from the ledger) has taken the changed counters out of the
// dirty set, and its promise to read them whole next time died with it. A counter that
// does not change again (a user whose month limit is spent) was then never persisted:
// its ledger row stayed at the value of an earlier flush until a Redis restart lost the
// rest. The worker started again must persist it in its first flush, and visit only
// what the dead worker had in flight, not every org (idle orgs cost it nothing).
func TestFlushAfterAWorkerKilledMidFlush(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	org := testenv.ID(t, "org")
	e.Seed(org, []vocab.Limit{monthLimit("requests", 1000)}, nil, tenants.TeamInput{ID: "hot"})
	for i := range 20 { // idle orgs with stored usage
		idle := testenv.ID(t, fmt.Sprintf("idle%d", i))
		e.Seed(idle, []vocab.Limit{monthLimit("requests", 1000)}, nil)
		if _, err := e.Check(e.Engine, idle, "", "", "requests", 1); err != nil {
			t.Fatal(err)
		}
	}
	per := e.Engine.Period(1).ID
	user := quota.Counter{Metric: "requests", Level: vocab.LevelUser, Team: "hot", User: "h75"}
	for range 3 {
		if _, err := e.Check(e.Engine, org, "hot", "h75", "requests", 3); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Flusher(time.Hour).FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	for range 7 { // the user's last checks: its counter does not change after these
		if _, err := e.Check(e.Engine, org, "hot", "h75", "requests", 3); err != nil {
			t.Fatal(err)
		}
	}

	dyingFlush(t, e, org, per, time.Second)

	// The worker started again, with nothing changed since.
	f := e.Flusher(time.Hour)
	st, err := f.FlushOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Orgs != 1 {
		t.Fatalf("the first flush after the kill visited %d orgs, want 1 (the one in flight)", st.Orgs)
	}
	if st, err = f.FlushOnce(ctx); err != nil || st.Orgs != 0 {
		t.Fatalf("the next flush: %+v %v, want no org visited", st, err)
	}
	live, err := e.Engine.MonthUsage(ctx, org, per)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := e.Ledger.Usage(ctx, org, per)
	if err != nil {
		t.Fatal(err)
	}
	if live[user] != 30 || stored[user] != 30 {
		t.Fatalf("user h75 after a worker killed mid-flush and started again: Redis %d, ledger %d; want 30 and 30 (a Redis restart now would lose %d)",
			live[user], stored[user], live[user]-stored[user])
	}
	if diff := cmp.Diff(live, stored); diff != "" {
		t.Fatalf("ledger differs from Redis (-redis +ledger):\n%s", diff)
	}
}

// A worker killed mid-flush while another keeps running (no restart): the survivor
// reads the dead worker's in-flight org whole once its entry is older than
// RecoverAfter, and removes the entry, so it is read once.
func TestSurvivorPersistsAKilledWorkersDrain(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	org := testenv.ID(t, "org")
	e.Seed(org, []vocab.Limit{monthLimit("requests", 1000)}, nil, tenants.TeamInput{ID: "hot"})
	per := e.Engine.Period(1).ID
	survivor := ledger.NewFlusher(ledger.FlusherConfig{Store: e.Ledger, Tenants: e.Svc, Counters: oneEngine(e.Engine),
		Interval: time.Hour, Logger: quietLog(), RecoverAfter: 2 * time.Second})
	if _, err := survivor.FlushOnce(ctx); err != nil { // started: later ticks recover only old entries
		t.Fatal(err)
	}
	if _, err := e.Check(e.Engine, org, "hot", "h1", "requests", 7); err != nil {
		t.Fatal(err)
	}
	popped := time.Now()
	dyingFlush(t, e, org, per, 300*time.Millisecond)
	if st, err := survivor.FlushOnce(ctx); err != nil || st.Orgs != 0 {
		t.Fatalf("a tick before the entry is old: %+v %v, want nothing visited", st, err)
	}
	time.Sleep(time.Until(popped.Add(2100 * time.Millisecond)))
	if st, err := survivor.FlushOnce(ctx); err != nil || st.Orgs != 1 {
		t.Fatalf("a tick after the entry is old: %+v %v, want the org read whole", st, err)
	}
	stored, err := e.Ledger.Usage(ctx, org, per)
	if err != nil {
		t.Fatal(err)
	}
	if c := (quota.Counter{Metric: "requests", Level: vocab.LevelUser, Team: "hot", User: "h1"}); stored[c] != 7 {
		t.Fatalf("user h1 stored %d, want 7", stored[c])
	}
	time.Sleep(2100 * time.Millisecond)
	if st, err := survivor.FlushOnce(ctx); err != nil || st.Orgs != 0 {
		t.Fatalf("a tick after the recovery: %+v %v, want nothing visited (the entry removed)", st, err)
	}
}

// Orgs flushed in batches (more than one batch of them): one pipeline and one
// transaction per batch, and the ledger then equals the counters of every org.
func TestFlushInBatchesEqualsTheCounters(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const n = 1100
	planID := testenv.ID(t, "plan")
	if _, err := e.Svc.CreatePlan(ctx, operator, tenants.PlanInput{ID: planID, Name: "P", FailMode: vocab.FailOpen,
		Limits: []vocab.Limit{monthLimit("requests", 1_000_000)}}); err != nil {
		t.Fatal(err)
	}
	orgs := make([]string, n)
	for i := range orgs {
		orgs[i] = testenv.ID(t, fmt.Sprintf("o%d", i))
		if _, err := e.Svc.CreateOrg(ctx, operator, tenants.OrgInput{ID: orgs[i], Name: orgs[i], PlanID: planID}); err != nil {
			t.Fatal(err)
		}
	}
	f := e.Flusher(time.Hour)
	if _, err := f.FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		for i, o := range orgs {
			if _, err := e.Check(e.Engine, o, "", "", "requests", int64(1+i%5+round)); err != nil {
				t.Fatal(err)
			}
		}
		st, err := f.FlushOnce(ctx)
		if err != nil || st.Orgs != n {
			t.Fatalf("round %d: %+v %v; want %d orgs visited", round, st, err, n)
		}
	}
	per := e.Engine.Period(1).ID
	for _, o := range orgs {
		live, err := e.Engine.MonthUsage(ctx, o, per)
		if err != nil {
			t.Fatal(err)
		}
		stored, err := e.Ledger.Usage(ctx, o, per)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(live, stored); diff != "" {
			t.Fatalf("org %s: ledger differs from Redis (-redis +ledger):\n%s", o, diff)
		}
	}
}

// dyingFlush is a worker killed between its drain and its write: its drain pops the
// dirty set, then its write waits for the period's lock (held here) until the process
// is gone (its context ends after d).
func dyingFlush(t *testing.T, e *env, org, per string, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('billing|' || $1 || '|' || $2, 0))`, org, per); err != nil {
		t.Fatal(err)
	}
	dying, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if _, err := e.Flusher(time.Hour).FlushOnce(dying); err == nil {
		t.Fatal("the dying worker's flush persisted while the period's lock was held")
	}
}
