package ledger_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/ledger/ledgertest"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// gauges is ledgertest.Gauges.
var gauges = ledgertest.Gauges

// TestFlushReportsMonthUtilization: a flush exports the highest used / month limit of
// each level with a month limit, and only the UtilizationTop highest series.
func TestFlushReportsMonthUtilization(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	metrics := ledger.NewMetrics(reg)
	flusher := ledger.NewFlusher(ledger.FlusherConfig{Store: e.Ledger, Tenants: e.Svc,
		Counters: oneEngine(e.Engine), Logger: quietLog(), Metrics: metrics})

	hot := testenv.ID(t, "hot")
	e.Seed(hot, []vocab.Limit{monthLimit("requests", 100)}, nil, tenants.TeamInput{ID: "eng",
		Limits: []vocab.Limit{monthLimit("requests", 50)}})
	if _, err := e.Check(e.Engine, hot, "eng", "alice", "requests", 45); err != nil {
		t.Fatal(err)
	}
	if _, err := flusher.FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	got := gauges(t, reg, "quotaplane_worker_month_utilization_ratio")
	want := map[string]float64{
		"level=org|metric=requests|org=" + hot:  0.45,
		"level=team|metric=requests|org=" + hot: 0.9,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("utilization %s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("utilization series %v, want only %v (the user level has no month limit)", got, want)
	}

	// More orgs with usage than UtilizationTop: only the highest are exported.
	for i := range ledger.UtilizationTop + 2 {
		org := fmt.Sprintf("%s-%02d", testenv.ID(t, "o"), i)
		e.Seed(org, []vocab.Limit{monthLimit("requests", 1000)}, nil)
		if _, err := e.Check(e.Engine, org, "", "", "requests", 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := flusher.FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	got = gauges(t, reg, "quotaplane_worker_month_utilization_ratio")
	if len(got) != ledger.UtilizationTop {
		t.Errorf("%d utilization series, want %d", len(got), ledger.UtilizationTop)
	}
	if got["level=team|metric=requests|org="+hot] != 0.9 {
		t.Errorf("the highest series is not among the exported: %v", got)
	}
}

// TestFlushFailingCountsADatabaseOutage: a flush that cannot list the orgs (Postgres
// refusing connections) counts as a failed flush, so QuotaplaneFlushFailing moves
// through an outage.
func TestFlushFailingCountsADatabaseOutage(t *testing.T) {
	e := newEnv(t)
	reg := prometheus.NewRegistry()
	pool, err := pgxpool.New(context.Background(), e.DBURL)
	if err != nil {
		t.Fatal(err)
	}
	flusher := ledger.NewFlusher(ledger.FlusherConfig{Store: ledger.NewStore(pool), Tenants: tenants.NewService(pool),
		Counters: oneEngine(e.Engine), Logger: quietLog(), Metrics: ledger.NewMetrics(reg)})
	if _, err := flusher.FlushOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	pool.Close() // every query now fails, as with the database down
	for range 3 {
		if _, err := flusher.FlushOnce(context.Background()); err == nil {
			t.Fatal("a flush without a database succeeded")
		}
	}
	if got := counter(t, reg, "quotaplane_worker_flush_errors_total", nil); got != 3 {
		t.Errorf("flush errors = %v after 3 failed flushes, want 3", got)
	}
}

// TestUtilizationSurvivesARestart: an org at 100 % of its month limit (only denials
// since, nothing left to flush) is exported by a fresh Flusher, a restarted worker,
// before any new usage, even when Redis no longer holds its counters: the flusher
// reads utilization from the ledger at start, so a deploy does not reset
// MonthLimitNearlyReached's 1 h for:.
func TestUtilizationSurvivesARestart(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	full := testenv.ID(t, "full")
	e.Seed(full, []vocab.Limit{monthLimit("requests", 10)}, nil)
	if _, err := e.Check(e.Engine, full, "", "", "requests", 10); err != nil {
		t.Fatal(err)
	}
	first := ledger.NewFlusher(ledger.FlusherConfig{Store: e.Ledger, Tenants: e.Svc,
		Counters: oneEngine(e.Engine), Logger: quietLog(), Metrics: ledger.NewMetrics(prometheus.NewRegistry())})
	if _, err := first.FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if r, err := e.Check(e.Engine, full, "", "", "requests", 1); err != nil || r.Allowed {
		t.Fatalf("a check above the limit: %+v %v, want denied", r, err)
	}
	// Redis loses the org's keys (restarted empty, failed over): nothing of the org
	// is left to drain or read whole.
	keys, err := e.RDB.Keys(ctx, "*"+e.Prefix+"*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("the org's keys: %v %v", keys, err)
	}
	if err := e.RDB.Del(ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	restarted := ledger.NewFlusher(ledger.FlusherConfig{Store: e.Ledger, Tenants: e.Svc,
		Counters: oneEngine(e.Engine), Logger: quietLog(), Metrics: ledger.NewMetrics(reg)})
	if _, err := restarted.FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	got := gauges(t, reg, "quotaplane_worker_month_utilization_ratio")
	if k := "level=org|metric=requests|org=" + full; got[k] != 1 {
		t.Errorf("utilization %s = %v after a restart, want 1 (all: %v)", k, got[k], got)
	}
}

// TestFlushReportsInFlight: a flush that drains a reservation exports the org's
// in-flight units per level (concurrency limits), and the series goes once settled.
func TestFlushReportsInFlight(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	flusher := ledger.NewFlusher(ledger.FlusherConfig{Store: e.Ledger, Tenants: e.Svc,
		Counters: oneEngine(e.Engine), Logger: quietLog(), Metrics: ledger.NewMetrics(reg)})
	org := testenv.ID(t, "cc")
	e.Seed(org, []vocab.Limit{{Metric: "requests", Window: vocab.Concurrent, Limit: 8}}, nil, tenants.TeamInput{ID: "eng"})
	req := quota.Request{Org: org, Team: "eng", User: "alice", Metric: "requests", Cost: 3,
		Limits: quota.LevelLimits{Org: []vocab.Limit{{Window: vocab.Concurrent, Limit: 8}}}}
	res, out, err := e.Engine.Reserve(ctx, req, quota.ReserveOptions{})
	if err != nil || !out.Allowed {
		t.Fatalf("reserve: %v %+v", err, out)
	}
	if _, err := flusher.FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	got := gauges(t, reg, "quotaplane_worker_in_flight_units")
	for _, lv := range []string{"org", "team", "user"} {
		if k := "level=" + lv + "|metric=requests|org=" + org; got[k] != 3 {
			t.Errorf("in flight %s = %v, want 3 (all: %v)", k, got[k], got)
		}
	}
	if _, err := e.Engine.Release(ctx, org, 1, res.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := flusher.FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := gauges(t, reg, "quotaplane_worker_in_flight_units"); len(got) != 0 {
		t.Errorf("in flight after the release: %v, want no series", got)
	}
}
