package ledger_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/platform/cachemetrics"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
	"github.com/quotaplane/quotaplane/internal/webhooks"
)

// counter reads one series of a cache counter family from reg; a series never
// counted is 0.
func counter(t *testing.T, reg *prometheus.Registry, family string, labels map[string]string) float64 {
	t.Helper()
	return max(testenv.MetricValue(t, reg, family, labels), 0)
}

// The flusher's caches (each org's limits, the threshold events already recorded)
// hold at most their bound and count what they evict; forgetting a recorded event
// records nothing twice.
func TestFlusherCachesAreBounded(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	f := ledger.NewFlusher(ledger.FlusherConfig{Store: e.Ledger, Tenants: e.Svc, Counters: oneEngine(e.Engine),
		Logger: quietLog(), CacheOrgs: 1, CacheEvents: 2, CacheMetrics: cachemetrics.New(reg)})
	var orgs []string
	for i := range 3 {
		org := fmt.Sprintf("%s-o%d", e.Prefix, i)
		orgs = append(orgs, org)
		e.Seed(org, []vocab.Limit{monthLimit("requests", 1000)}, nil,
			tenants.TeamInput{ID: "eng", Limits: []vocab.Limit{monthLimit("requests", 100)}, UserLimits: []vocab.Limit{monthLimit("requests", 10)}})
	}
	flush := func() {
		t.Helper()
		if _, err := f.FlushOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, org := range orgs {
		for range 10 { // alice at 100 %: the 80 % and 100 % events
			if _, err := e.Check(e.Engine, org, "eng", "alice", "requests", 1); err != nil {
				t.Fatal(err)
			}
		}
		flush()
	}
	lim := map[string]string{"cache": "billing_limits"}
	ev := map[string]string{"cache": "billing_events"}
	if got := counter(t, reg, "quotaplane_cache_evictions_total", lim); got != 2 {
		t.Errorf("limits of 3 orgs through a cache of 1: %v evictions, want 2", got)
	}
	if got := counter(t, reg, "quotaplane_cache_evictions_total", ev); got != 4 {
		t.Errorf("6 events through a cache of 2: %v evictions, want 4", got)
	}
	// Counters change again: the forgotten events are looked at again, none recorded twice.
	for _, org := range orgs {
		if _, err := e.Check(e.Engine, org, "eng", "bob", "requests", 1); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Check(e.Engine, org, "eng", "alice", "requests", 0); err != nil {
			t.Fatal(err)
		}
	}
	flush()
	for _, org := range orgs {
		evs, err := webhooks.NewStore(e.Pool).Events(ctx, org, 100)
		if err != nil || len(evs) != 2 {
			t.Errorf("events of %s: %d (%v), want 2 (80 %% and 100 %% of alice)", org, len(evs), err)
		}
	}
	if got := counter(t, reg, "quotaplane_cache_lookups_total", map[string]string{"cache": "billing_limits", "result": "miss"}); got < 3 {
		t.Errorf("billing_limits misses %v, want at least 3", got)
	}
}
