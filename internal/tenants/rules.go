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
// These functions are pure; the store calls them inside the write's transaction,
// with the parent row locked, on aggregates it has just read.

// childWithinParent reports each limit of child above the parent's limit for the same
// metric and window.
func childWithinParent(field string, child []vocab.Limit, childLabel, parentLabel string, parent []vocab.Limit) []Violation {
	p := index(parent)
	var out []Violation
	for i, l := range child {
		cap, ok := p[limitKey{l.Metric, l.Window}]
		if !ok || l.Limit <= cap {
			continue
		}
		out = append(out, Violation{
			Field: fmt.Sprintf("%s[%d].limit", field, i), Metric: l.Metric, Window: l.Window,
			Parent: parentLabel, ParentMax: cap, Requested: l.Limit, rule: "above",
			Message: fmt.Sprintf("%s: %s/%s limit %d is above %s's limit %d",
				childLabel, l.Metric, l.Window, l.Limit, parentLabel, cap),
		})
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
		cap, ok := p[limitKey{l.Metric, vocab.Month}]
		if !ok {
			continue
		}
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
// child limit per metric and window (and whose it is), and the sum of month limits
// per metric.
type childAggregate struct {
	Max      map[limitKey]int64
	MaxOwner map[limitKey]string
	MonthSum map[string]int64
}

func newChildAggregate() childAggregate {
	return childAggregate{Max: map[limitKey]int64{}, MaxOwner: map[limitKey]string{}, MonthSum: map[string]int64{}}
}

func (a childAggregate) add(owner string, l vocab.Limit) {
	k := limitKey{l.Metric, l.Window}
	if cur, ok := a.Max[k]; !ok || l.Limit > cur {
		a.Max[k] = l.Limit
		a.MaxOwner[k] = owner
	}
	if l.Window == vocab.Month {
		a.MonthSum[l.Metric] += l.Limit
	}
}

// parentCoversChildren reports each limit of a parent's new limits that its current
// children no longer fit under: one child above it, or (unless oversubscribed) the
// children's month limits adding up to more.
func parentCoversChildren(field string, parent []vocab.Limit, parentLabel, childrenLabel string, agg childAggregate, oversubscribe bool) []Violation {
	var out []Violation
	for i, l := range parent {
		k := limitKey{l.Metric, l.Window}
		f := fmt.Sprintf("%s[%d].limit", field, i)
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
