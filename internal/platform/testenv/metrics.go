package testenv

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// MetricValue returns the value of the gauge or counter name whose labels include
// labels (a histogram: its sample count), summed over every such series (several
// when labels name only some: the check counters exist at 0 for every label value
// from the start), or -1 when g has no such series.
func MetricValue(tb testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	tb.Helper()
	return gatherValue(tb, g, name, labels, false)
}

// HistogramSum is the sum of the observations of the histogram name whose labels
// include labels (over every such series), or -1 when g has no such series.
func HistogramSum(tb testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	tb.Helper()
	return gatherValue(tb, g, name, labels, true)
}

func gatherValue(tb testing.TB, g prometheus.Gatherer, name string, labels map[string]string, sum bool) float64 {
	tb.Helper()
	mfs, err := g.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	total, found := 0.0, false
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			switch {
			case m.Gauge != nil:
				total += m.Gauge.GetValue()
			case m.Counter != nil:
				total += m.Counter.GetValue()
			case m.Histogram != nil && sum:
				total += m.Histogram.GetSampleSum()
			case m.Histogram != nil:
				total += float64(m.Histogram.GetSampleCount())
			default:
				continue
			}
			found = true
		}
	}
	if !found {
		return -1
	}
	return total
}

// AssertJSONLines fails the test for every line of out that is not a JSON object:
// what the binaries write on stderr.
func AssertJSONLines(tb testing.TB, out string) {
	tb.Helper()
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			tb.Errorf("a line of stderr is not JSON: %q", line)
		}
	}
}
