package tenants

import (
	"fmt"
	"slices"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// The allocation rules: for each metric, the month limits of a parent's
// children may not add up to more than the parent's month limit unless the org
// oversubscribes, and no child's limit may exceed its parent's limit for the same
// metric and window. Each level is checked against its direct parent only (team
// against org, user and team user-defaults against team); a parent without a limit
// for a metric and window leaves its children free there.
//
// A token bucket's limit is its rate, so the rule on limits bounds a bucket's rate
// as it bounds a sliding window's units, whichever of parent and child is a bucket.
// A child's bucket may also not hold more than its parent's bucket in the same
// metric and window (burst within burst); a parent without a bucket there bounds
// only the rate, and a child's sliding window under a parent's bucket is bounded by
// the rule on limits alone, its units per window within the parent's rate.
//
// These functions are pure; the store calls them inside the write's transaction,
// with the parent row locked, on aggregates it has just read.

// childWithinParent reports each limit of child above the parent's limit for the same
// metric and window, and each bucket of child holding more than the parent's bucket.
func childWithinParent(field string, child []vocab.Limit, childLabel, parentLabel string, parent []vocab.Limit) []Violation {
	p := index(parent)
	var out []Violation
	for i, l := range child {
		pl, ok := p[limitKey{l.Metric, l.Window}]
		if !ok {
			continue
		}
		if l.Limit > pl.Limit {
			out = append(out, Violation{
				Field: fmt.Sprintf("%s[%d].limit", field, i), Metric: l.Metric, Window: l.Window,
				Parent: parentLabel, ParentMax: pl.Limit, Requested: l.Limit, rule: "above",
				Message: fmt.Sprintf("%s: %s/%s limit %d is above %s's limit %d",
					childLabel, l.Metric, l.Window, l.Limit, parentLabel, pl.Limit),
			})
		}
		if l.Bucket() && pl.Bucket() && l.Burst > pl.Burst {
			out = append(out, Violation{
				Field: fmt.Sprintf("%s[%d].burst", field, i), Metric: l.Metric, Window: l.Window,
				Parent: parentLabel, ParentMax: pl.Burst, Requested: l.Burst, rule: "burst-above",
				Message: fmt.Sprintf("%s: %s/%s burst %d is above %s's burst %d",
					childLabel, l.Metric, l.Window, l.Burst, parentLabel, pl.Burst),
			})
		}
	}
	return out
}

// sumWithinParent reports each month limit of child that, added to what the other
// children already hold (others, per metric), exceeds the parent's month limit.
func sumWithinParent(field string, child []vocab.Limit, childLabel, parentLabel string, parent []vocab.Limit, others map[string]int64) []Violation {
	p := index(parent)
	var out []Violation
	for i, l := range child {
		if l.Window != vocab.Month {
			continue
		}
		pl, ok := p[limitKey{l.Metric, vocab.Month}]
		if !ok {
			continue
		}
		cap := pl.Limit
		held := others[l.Metric]
		if held+l.Limit <= cap {
			continue
		}
		out = append(out, Violation{
			Field: fmt.Sprintf("%s[%d].limit", field, i), Metric: l.Metric, Window: vocab.Month,
			Parent: parentLabel, ParentMax: cap, Allocated: held, Requested: l.Limit, rule: "sum",
			Message: fmt.Sprintf("%s: %s/month limit %d does not fit in %s: it has %d, %d is already allocated, %d is available",
				childLabel, l.Metric, l.Limit, parentLabel, cap, held, max(0, cap-held)),
		})
	}
	return out
}

// childAggregate summarizes the current limits of a parent's children: the largest
// child limit per metric and window (and whose it is), the largest child bucket per
// metric and window (and whose), and the sum of month limits per metric.
type childAggregate struct {
	Max           map[limitKey]int64
	MaxOwner      map[limitKey]string
	MaxBurst      map[limitKey]int64
	MaxBurstOwner map[limitKey]string
	MonthSum      map[string]int64
}

func newChildAggregate() childAggregate {
	return childAggregate{Max: map[limitKey]int64{}, MaxOwner: map[limitKey]string{},
		MaxBurst: map[limitKey]int64{}, MaxBurstOwner: map[limitKey]string{}, MonthSum: map[string]int64{}}
}

func (a childAggregate) add(owner string, l vocab.Limit) {
	k := limitKey{l.Metric, l.Window}
	if cur, ok := a.Max[k]; !ok || l.Limit > cur {
		a.Max[k] = l.Limit
		a.MaxOwner[k] = owner
	}
	if cur, ok := a.MaxBurst[k]; l.Bucket() && (!ok || l.Burst > cur) {
		a.MaxBurst[k] = l.Burst
		a.MaxBurstOwner[k] = owner
	}
	if l.Window == vocab.Month {
		a.MonthSum[l.Metric] += l.Limit
	}
}

// parentCoversChildren reports each limit of a parent's new limits that its current
// children no longer fit under: one child above it, one child's bucket holding more
// than its bucket, or (unless oversubscribed) the children's month limits adding up
// to more.
func parentCoversChildren(field string, parent []vocab.Limit, parentLabel, childrenLabel string, agg childAggregate, oversubscribe bool) []Violation {
	var out []Violation
	for i, l := range parent {
		k := limitKey{l.Metric, l.Window}
		f := fmt.Sprintf("%s[%d].limit", field, i)
		if top, ok := agg.MaxBurst[k]; ok && l.Bucket() && top > l.Burst {
			out = append(out, Violation{
				Field: fmt.Sprintf("%s[%d].burst", field, i), Metric: l.Metric, Window: l.Window, Parent: parentLabel,
				ParentMax: l.Burst, Allocated: top, Requested: l.Burst, rule: "burst-below",
				Message: fmt.Sprintf("%s: %s/%s burst %d is below the burst %d that %s %q holds",
					parentLabel, l.Metric, l.Window, l.Burst, top, childrenLabel, agg.MaxBurstOwner[k]),
			})
		}
		if top, ok := agg.Max[k]; ok && top > l.Limit {
			out = append(out, Violation{
				Field: f, Metric: l.Metric, Window: l.Window, Parent: parentLabel,
				ParentMax: l.Limit, Allocated: top, Requested: l.Limit, rule: "below",
				Message: fmt.Sprintf("%s: %s/%s limit %d is below the %d that %s %q holds",
					parentLabel, l.Metric, l.Window, l.Limit, top, childrenLabel, agg.MaxOwner[k]),
			})
			continue
		}
		if l.Window != vocab.Month || oversubscribe {
			continue
		}
		if sum := agg.MonthSum[l.Metric]; sum > l.Limit {
			out = append(out, Violation{
				Field: f, Metric: l.Metric, Window: vocab.Month, Parent: parentLabel,
				ParentMax: l.Limit, Allocated: sum, Requested: l.Limit, rule: "below-sum",
				Message: fmt.Sprintf("%s: %s/month limit %d is below the %d already allocated to its %ss",
					parentLabel, l.Metric, l.Limit, sum, childrenLabel),
			})
		}
	}
	return out
}

// allocErr gathers the violations of a write, nil when there are none. A limit above
// its parent's is said once: it cannot fit in what the parent has left either, and
// that second message would only repeat it with other figures.
func allocErr(vs ...[]Violation) error {
	var all []Violation
	above := map[string]bool{}
	for _, v := range vs {
		for _, x := range v {
			if x.rule == "above" {
				above[x.Field] = true
			}
		}
		all = append(all, v...)
	}
	all = slices.DeleteFunc(all, func(x Violation) bool { return x.rule == "sum" && above[x.Field] })
	if len(all) == 0 {
		return nil
	}
	return &AllocationError{Violations: all}
}
