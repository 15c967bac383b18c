package tenants

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// maxMetered bounds a plan's metered list, as the spec bounds a list of limits.
const maxMetered = 100

// ErrUnknownMetric: a check names a metric its org does not know; see
// *UnknownMetricError.
var ErrUnknownMetric = errors.New("unknown metric")

// UnknownMetricError refuses a check, or an allocation, of a metric that is not one
// of the org's known metrics. It matches ErrUnknownMetric.
type UnknownMetricError struct {
	Metric string
	Known  []string // the org's metrics, sorted
}

func (e *UnknownMetricError) Error() string {
	if len(e.Known) == 0 {
		return fmt.Sprintf("unknown metric %q: the org's plan names no metric in its limits, pricing or metered", e.Metric)
	}
	return fmt.Sprintf("unknown metric %q: the org's metrics are %s", e.Metric, strings.Join(e.Known, ", "))
}

// Is makes errors.Is(err, ErrUnknownMetric) true.
func (e *UnknownMetricError) Is(target error) bool { return target == ErrUnknownMetric }

// MetricSet is the metrics an org knows: those named by its plan's limits, its plan's
// pricing, its plan's metered list and its own limit overrides. Built once when the
// org is resolved, it is read-only afterwards, so checks share it without a lock.
type MetricSet struct {
	has    map[string]struct{}
	sorted []string
}

// NewMetricSet returns the set of the metrics named by the lists.
func NewMetricSet(lists ...[]string) MetricSet {
	s := MetricSet{has: map[string]struct{}{}}
	for _, l := range lists {
		for _, m := range l {
			if _, ok := s.has[m]; !ok {
				s.has[m] = struct{}{}
				s.sorted = append(s.sorted, m)
			}
		}
	}
	slices.Sort(s.sorted)
	return s
}

// Has reports whether the org knows metric m: one map lookup, no allocation.
func (s MetricSet) Has(m string) bool {
	_, ok := s.has[m]
	return ok
}

// Sorted returns the metrics in order, in a slice of the caller's own.
func (s MetricSet) Sorted() []string { return slices.Clone(s.sorted) }

// Check returns nil when the set knows m, else an *UnknownMetricError naming the
// set's metrics. Only a refusal allocates.
func (s MetricSet) Check(m string) error {
	if s.Has(m) {
		return nil
	}
	known := s.Sorted()
	if known == nil {
		known = []string{}
	}
	return &UnknownMetricError{Metric: m, Known: known}
}

func limitMetrics(ls []Limit) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.Metric
	}
	return out
}

// planMetricCols selects, from plans, the metered list and the metrics of the plan's
// pricing: with the org's effective limits, the metrics an org knows.
const planMetricCols = `metered, ARRAY(SELECT metric FROM plan_prices WHERE plan_id = plans.id)`

// normalizeMetered sorts a metered list; nil becomes empty, as stored.
func normalizeMetered(ms []string) []string {
	out := slices.Clone(ms)
	if out == nil {
		out = []string{}
	}
	slices.Sort(out)
	return out
}

// validateMetered checks a plan's metered list: ids, no repeats, at most maxMetered.
func validateMetered(errs *fieldErrs, ms []string) {
	if len(ms) > maxMetered {
		errs.add("metered", "must hold at most %d metrics", maxMetered)
	}
	seen := make(map[string]bool, len(ms))
	for i, m := range ms {
		f := fmt.Sprintf("metered[%d]", i)
		if !ValidID(m) {
			errs.add(f, "must match %s", idPattern)
		}
		if seen[m] {
			errs.add(f, "repeats %q: each metric may appear once", m)
		}
		seen[m] = true
	}
}
