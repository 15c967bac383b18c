package ledger_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// A shadow org's would-block record survives a Redis FLUSHDB: the worker persisted
// it, the record Redis starts again has a new epoch, and the report adds both, so it
// equals every would-block answer given, before and after, live and from Postgres alone.
func TestWouldBlockSurvivesRedisFlushDB(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rs := startPrivateRedis(t)
	eng, _ := e.NewEngine(rs.url())
	org := testenv.ID(t, "org")
	e.Seed(org, []vocab.Limit{monthLimit("requests", 5)}, nil, tenants.TeamInput{ID: "eng"})
	f := ledger.NewFlusher(ledger.FlusherConfig{Store: e.Ledger, Tenants: e.Svc, Counters: oneEngine(eng), Logger: quietLog()})
	var answers quota.WouldBlockCount
	spend := func(n int, cost int64) {
		t.Helper()
		for range n {
			res, err := eng.Check(ctx, quota.Request{Org: org, Team: "eng", User: "alice", Metric: "requests", Cost: cost,
				Mode: vocab.Shadow, Limits: quota.LevelLimits{Org: []vocab.Limit{{Window: vocab.Month, Limit: 5}}}})
			if err != nil {
				t.Fatal(err)
			}
			if res.WouldBlock != nil {
				answers.Checks++
				answers.Units += cost
			}
		}
		if err := eng.FlushWouldBlock(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := f.FlushOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	spend(8, 1) // 5 fit, 3 would have been blocked
	raw := redis.NewClient(&redis.Options{Addr: rs.url()[len("redis://") : len(rs.url())-2]})
	defer raw.Close()
	if err := raw.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	spend(4, 3) // usage is rehydrated (8 > 5): all four would have been blocked
	if answers.Checks != 7 {
		t.Fatalf("%d would-block answers, want 7", answers.Checks)
	}
	stored, err := e.Ledger.StoredWouldBlock(ctx, org, eng.Period(1).ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != 2 {
		t.Errorf("%d epochs stored, want 2 (before and after the FLUSHDB)", len(stored))
	}
	want := []billing.WouldBlockRow{{Metric: "requests", Level: "org", ID: org, Window: "month", WouldBlockCount: answers}}
	for _, counters := range []ledger.CounterSource{oneEngine(eng), nil} {
		s := &billing.Service{Store: billing.NewStore(e.Pool), Tenants: e.Svc, Counters: counters}
		rep, err := s.WouldBlock(ctx, org, "")
		if err != nil {
			t.Fatal(err)
		}
		if rep.Total != answers || rep.Capped {
			t.Errorf("live %v: total %+v capped %v, want %+v and not capped", counters != nil, rep.Total, rep.Capped, answers)
		}
		for i := range rep.Rows {
			rep.Rows[i].Days = nil
		}
		if diff := cmp.Diff(want, rep.Rows); diff != "" {
			t.Errorf("live %v: rows (-want +got):\n%s", counters != nil, diff)
		}
	}
	// Live counts not yet persisted show in the report at once.
	if _, err := eng.Check(ctx, quota.Request{Org: org, Metric: "requests", Cost: 10, Mode: vocab.Warn,
		Limits: quota.LevelLimits{Org: []vocab.Limit{{Window: vocab.Month, Limit: 5}}}}); err != nil {
		t.Fatal(err)
	}
	if err := eng.FlushWouldBlock(ctx); err != nil {
		t.Fatal(err)
	}
	s := &billing.Service{Store: billing.NewStore(e.Pool), Tenants: e.Svc, Counters: oneEngine(eng)}
	rep, err := s.WouldBlock(ctx, org, "")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Total.Checks != answers.Checks+1 || rep.Total.Units != answers.Units+10 {
		t.Errorf("after one more live: %+v", rep.Total)
	}
}
