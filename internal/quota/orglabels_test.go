package quota

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// orgSeriesOf returns the value of quotaplane_org_checks_total{org, decision} in reg,
// and whether the series exists.
func orgSeriesOf(t *testing.T, reg *prometheus.Registry, org, decision string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["org"] == org && labels["decision"] == decision {
				return m.GetCounter().GetValue(), true
			}
		}
	}
	return 0, false
}

// Issue 26: 100 quiet orgs take the 100 labels first; a noisy org that comes later
// is counted as "_other" for its first window only, then takes the label of a quiet
// org, whose series goes. Its denials are then under its own name, which
// QuotaplaneRejectionRateHighOrg reads. Before, it stayed in "_other" for good.
func TestOrgLabelsGoToABusyLateOrg(t *testing.T) {
	reg := prometheus.NewRegistry()
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotaplane_org_checks_total"}, []string{"org", "decision"})
	reg.MustRegister(vec)
	clock := time.Unix(1_800_000_000, 0)
	var mu sync.Mutex
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	l := newOrgLabels(vec, 100, time.Minute)
	l.now = now
	l.next.Store(now().Add(time.Minute).UnixNano())

	for i := range 100 {
		l.count(fmt.Sprintf("quiet-%03d", i), "allowed")
	}
	for range 50 {
		l.count("noisy", "denied")
	}
	if _, ok := orgSeriesOf(t, reg, "noisy", "denied"); ok {
		t.Fatal("the noisy org has a label before its first window ended: the 100 were taken")
	}
	if v, _ := orgSeriesOf(t, reg, OtherOrgs, "denied"); v != 50 {
		t.Fatalf(`_other denied = %v, want 50`, v)
	}
	// A second window: the quiet orgs check once more each, the noisy org 50 times.
	advance(61 * time.Second)
	l.count("quiet-000", "allowed") // ends the first window
	v, ok := orgSeriesOf(t, reg, "noisy", "denied")
	if !ok || v != 0 {
		t.Fatalf("after a window the noisy org has no series of its own at 0 (%v, %v)", v, ok)
	}
	for range 30 {
		l.count("noisy", "denied")
	}
	if v, _ := orgSeriesOf(t, reg, "noisy", "denied"); v != 30 {
		t.Errorf("noisy denied = %v, want 30", v)
	}
	if v, _ := orgSeriesOf(t, reg, "noisy", "allowed"); v != 0 {
		t.Errorf("noisy allowed = %v, want a series at 0", v)
	}
	if n := seriesCount(t, reg) / 3; n != 101 { // 100 named orgs and _other, 3 decisions each
		t.Errorf("%d org label values, want 101", n)
	}
	// The quietest org lost its label (one of those with no check in the window).
	if _, ok := orgSeriesOf(t, reg, "quiet-000", "allowed"); !ok {
		t.Error("quiet-000, checked in the window, lost its label")
	}
}

// Labels change only for a clear winner (twice the named org's volume) and at most
// max/10 per window.
func TestOrgLabelsChurnBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotaplane_org_checks_total"}, []string{"org", "decision"})
	reg.MustRegister(vec)
	clock := time.Unix(1_800_000_000, 0)
	l := newOrgLabels(vec, 20, time.Minute)
	l.now = func() time.Time { return clock }
	l.next.Store(clock.Add(time.Minute).UnixNano())
	for i := range 20 {
		for range 10 {
			l.count(fmt.Sprintf("named-%02d", i), "allowed")
		}
	}
	for i := range 10 { // 10 late orgs: 5 at 15 checks (not twice 10), 5 at 30
		n := 15
		if i >= 5 {
			n = 30
		}
		for range n {
			l.count(fmt.Sprintf("late-%02d", i), "allowed")
		}
	}
	clock = clock.Add(time.Minute)
	l.count("named-00", "allowed")
	promoted := 0
	for i := range 10 {
		if _, ok := orgSeriesOf(t, reg, fmt.Sprintf("late-%02d", i), "allowed"); ok {
			promoted++
			if i < 5 {
				t.Errorf("late-%02d took a label with 15 checks against 10", i)
			}
		}
	}
	if promoted != 2 { // max/10
		t.Errorf("%d labels changed in one window, want 2 (max/10)", promoted)
	}
}

func seriesCount(t *testing.T, reg *prometheus.Registry) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		n += len(mf.GetMetric())
	}
	return n
}
