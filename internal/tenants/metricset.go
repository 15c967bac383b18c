package tenants

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// maxMetered bounds a plan's metered list, as the spec bounds a list of limits.
const maxMetered = 100

// ErrUnknownMetric: a check names a metric its org does not know; see
// *UnknownMetricError.
var ErrUnknownMetric = derrors.New(derrors.Unprocessable, "unknown metric")

// UnknownMetricError refuses a check of a metric that is not one of the org's known
// metrics. It matches ErrUnknownMetric. (An allocation of such a metric is refused
// with an *AllocationError carrying the same message.)
type UnknownMetricError struct {
	Metric string
	Known  []string // the org's metrics, sorted
}

func (e *UnknownMetricError) Error() string {
	if len(e.Known) == 0 {
		return fmt.Sprintf("unknown metric %s: the org's plan names no metric in its limits, pricing or metered", vocab.Quote(e.Metric))
	}
	return fmt.Sprintf("unknown metric %s: the org's metrics are %s", vocab.Quote(e.Metric), strings.Join(e.Known, ", "))
}

// Is makes errors.Is(err, ErrUnknownMetric) true.
func (e *UnknownMetricError) Is(target error) bool { return target == ErrUnknownMetric }

// Kind is derrors.Unprocessable: a 422.
func (e *UnknownMetricError) Kind() derrors.Kind { return derrors.Unprocessable }

// FieldErrors names the metric and lists the org's metrics, for the problem's errors[].
func (e *UnknownMetricError) FieldErrors() []derrors.FieldError {
	msg := fmt.Sprintf("%s is not one of the org's metrics: %s", vocab.Quote(e.Metric), strings.Join(e.Known, ", "))
	if len(e.Known) == 0 {
		msg = fmt.Sprintf("%s is not known: the org's plan names no metric in its limits, pricing or metered", vocab.Quote(e.Metric))
	}
	return []derrors.FieldError{{Field: "metric", Message: msg}}
}

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

func limitMetrics(ls []vocab.Limit) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.Metric
	}
	return out
}

// planMetricCols selects, from plans, the metered list and the metrics of the plan's
// pricing: with the org's effective limits, the metrics an org knows.
const planMetricCols = `metered, ARRAY(SELECT metric FROM plan_prices WHERE plan_id = plans.id
	UNION ALL SELECT metric FROM plan_rates WHERE plan_id = plans.id
	UNION ALL SELECT 'spend' WHERE plans.rate_currency IS NOT NULL)`

// orgMetrics returns the metrics org knows: its effective limits (the plan's merged
// with the org's overrides), its plan's pricing and its plan's metered list.
func orgMetrics(ctx context.Context, q querier, org Org) (MetricSet, error) {
	pm, err := readPlanMetrics(ctx, q, org.PlanID)
	if err != nil {
		return MetricSet{}, err
	}
	return pm.of(org), nil
}

// planMetrics are the metrics a plan names outside its limits: its metered list and
// its pricing's (prices, rates and spend).
type planMetrics struct{ metered, priced []string }

func readPlanMetrics(ctx context.Context, q querier, planID string) (planMetrics, error) {
	var pm planMetrics
	if err := q.QueryRow(ctx, `SELECT `+planMetricCols+` FROM plans WHERE id = $1`, planID).Scan(&pm.metered, &pm.priced); err != nil {
		return pm, fmt.Errorf("metrics of plan %q: %w", planID, err)
	}
	return pm, nil
}

// of returns the metrics org, on the plan of pm, knows.
func (pm planMetrics) of(org Org) MetricSet {
	return NewMetricSet(limitMetrics(org.EffectiveLimits), pm.priced, pm.metered)
}

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
		if !vocab.ValidID(m) {
			errs.add(f, vocab.IDRule)
		}
		if seen[m] {
			errs.add(f, "repeats %q: each metric may appear once", m)
		}
		seen[m] = true
	}
}

// unknownMetrics reports each limit of a child's list whose metric the org does not
// know: such an allocation could never be checked.
func unknownMetrics(field string, ls []vocab.Limit, childLabel string, known MetricSet) []Violation {
	var out []Violation
	for i, l := range ls {
		if known.Has(l.Metric) {
			continue
		}
		out = append(out, Violation{
			Field: fmt.Sprintf("%s[%d].metric", field, i), Metric: l.Metric, Window: l.Window,
			Requested: l.Limit,
			Message:   fmt.Sprintf("%s: %s", childLabel, known.Check(l.Metric).Error()),
		})
	}
	return out
}

// limitList is one list of limits of a request, named by its field.
type limitList struct {
	field  string
	limits []vocab.Limit
}

// checkAllocatedMetrics refuses a team's or user's limits that name a metric the org
// does not know, with an *AllocationError: such a limit could never apply, since a
// check of that metric is refused. Only the lists the request sets are checked, so a
// change of one list is not refused for the other.
func checkAllocatedMetrics(ctx context.Context, q querier, org Org, childLabel string, lists ...limitList) error {
	known, err := orgMetrics(ctx, q, org)
	if err != nil {
		return err
	}
	return allocErr(allocatedMetrics(known, childLabel, lists...))
}

// allocatedMetrics reports the limits of lists that name a metric outside known.
func allocatedMetrics(known MetricSet, childLabel string, lists ...limitList) []Violation {
	var vs []Violation
	for _, l := range lists {
		vs = append(vs, unknownMetrics(l.field, l.limits, childLabel, known)...)
	}
	return vs
}

// planKnows returns the metrics an org on plan p with the overrides given would know.
func planKnows(p Plan, overrides []vocab.Limit) MetricSet {
	var priced []string
	if p.Pricing != nil {
		for _, m := range p.Pricing.Metrics {
			priced = append(priced, m.Metric)
		}
	}
	return NewMetricSet(limitMetrics(p.Limits), limitMetrics(overrides), priced, p.Metered, rateMetrics(p.Currency, p.Rates))
}

// forgottenMetrics reports each metric the org's teams or users allocate that known
// lacks: a change of the org's plan or overrides that would leave such an allocation
// behind is refused, as lowering a parent below its children is. field names the
// request field to blame.
func forgottenMetrics(ctx context.Context, q querier, orgID string, known MetricSet, field string) ([]Violation, error) {
	rows, err := q.Query(ctx, `SELECT metric, min(owner) FROM (
			SELECT metric, 'team "' || team_id || '"' AS owner FROM team_limits WHERE org_id = $1
			UNION ALL
			SELECT metric, 'user "' || user_id || '"' FROM user_limits WHERE org_id = $1) a
		GROUP BY metric ORDER BY metric`, orgID)
	if err != nil {
		return nil, err
	}
	var vs []Violation
	var metric, owner string
	_, err = pgx.ForEachRow(rows, []any{&metric, &owner}, func() error {
		if known.Has(metric) {
			return nil
		}
		vs = append(vs, Violation{Field: field, Metric: metric, Parent: fmt.Sprintf("org %q", orgID),
			Message: fmt.Sprintf("org %q: %s allocates metric %q, which the org would no longer know (its metrics would be %s)",
				orgID, owner, metric, metricList(known))})
		return nil
	})
	return vs, err
}

func metricList(s MetricSet) string {
	if len(s.sorted) == 0 {
		return "none"
	}
	return strings.Join(s.sorted, ", ")
}
