package billing_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/ledger/ledgertest"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// gauges is ledgertest.Gauges.
var gauges = ledgertest.Gauges

// TestCloseScanReportsOldestUnclosedPeriod: the close scan sets the end of the oldest
// period due and not closed, and 0 once it is closed, so "period close late" can be
// alerted on.
func TestCloseScanReportsOldestUnclosedPeriod(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	org := testenv.ID(t, "org")
	e.Seed(org, []vocab.Limit{monthLimit("requests", 100)}, nil)
	reg := prometheus.NewRegistry()
	metrics := billing.NewMetrics(reg)
	cur := vocab.PeriodAt(time.Now(), 1)
	closer := billing.NewCloser(billing.CloserConfig{Store: e.store, Tenants: e.Svc, Counters: oneEngine(e.Engine),
		Clock: func() time.Time { return cur.End.Add(2 * time.Minute) }, Logger: quietLog(), Metrics: metrics})
	gauge := func() float64 {
		vs := gauges(t, reg, "quotaplane_worker_oldest_unclosed_period_end_timestamp_seconds")
		if len(vs) != 1 {
			t.Fatalf("oldest unclosed period end has %d series, want 1: %v", len(vs), vs)
		}
		return vs[""]
	}
	if due, err := closer.Due(ctx); err != nil || len(due) != 1 {
		t.Fatalf("due: %v, %v; want the current period", due, err)
	}
	if got, want := gauge(), float64(cur.End.Unix()); got != want {
		t.Errorf("oldest unclosed period end = %v, want %v (%s)", got, want, cur.End)
	}
	if _, err := closer.Close(ctx, org, cur.ID); err != nil {
		t.Fatal(err)
	}
	if due, err := closer.Due(ctx); err != nil || len(due) != 0 {
		t.Fatalf("due after the close: %v, %v", due, err)
	}
	if got := gauge(); got != 0 {
		t.Errorf("oldest unclosed period end after the close = %v, want 0", got)
	}
}
