package tenants

import (
	"fmt"
	"math/bits"
	"regexp"
	"slices"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

type limitKey struct {
	Metric string
	Window vocab.Window
}

// validateLimits checks one list of team or user limits: ids, windows, values,
// bursts, no repeats, and none shared (fair_share is an org limit's).
func validateLimits(errs *fieldErrs, field string, ls []vocab.Limit) {
	validateLimitList(errs, field, ls, false)
}

// validateOrgLimits checks one list of a plan's or an org's limits as validateLimits
// does, a limit of a second to day window being allowed to say fair_share.
func validateOrgLimits(errs *fieldErrs, field string, ls []vocab.Limit) {
	validateLimitList(errs, field, ls, true)
}

func validateLimitList(errs *fieldErrs, field string, ls []vocab.Limit, orgLevel bool) {
	seen := make(map[limitKey]bool, len(ls))
	for i, l := range ls {
		f := fmt.Sprintf("%s[%d]", field, i)
		if !vocab.ValidID(l.Metric) {
			errs.add(f+".metric", vocab.IDRule)
		}
		if !l.Window.Valid() {
			errs.add(f+".window", "must be one of second, minute, hour, day, month, concurrent")
		}
		if l.Limit < 0 || l.Limit > vocab.MaxUnits {
			// A counter is exact to vocab.MaxUnits per limit (docs/ARCHITECTURE.md).
			errs.add(f+".limit", "must be 0 to %d", vocab.MaxUnits)
		}
		switch {
		case l.Burst == 0: // a sliding window
		case l.Window == vocab.Month || l.Window == vocab.Concurrent:
			errs.add(f+".burst", "applies only to second, minute, hour and day windows, not %s", l.Window)
		case l.Burst < 1 || l.Burst > vocab.MaxUnits:
			// A bucket holds whole units, exact to vocab.MaxUnits as a counter is.
			errs.add(f+".burst", "must be 1 to %d", vocab.MaxUnits)
		case l.Limit > 0 && refillTooLong(l):
			// The engine keeps a bucket's debt under 2^52 us (internal/quota/doc.go "Token
			// buckets"): a deeper bucket would silently hold less than its burst.
			errs.add(f+".burst", "takes more than 142 years to refill at %d per %s: at most %d", l.Limit, l.Window, maxBurst(l))
		}
		switch {
		case !l.FairShare:
		case !orgLevel:
			errs.add(f+".fair_share", "applies only to a plan's or an org's limits, which teams without a limit of their own share")
		case l.Window == vocab.Month || l.Window == vocab.Concurrent:
			errs.add(f+".fair_share", "applies only to second, minute, hour and day windows, not %s", l.Window)
		}
		k := limitKey{l.Metric, l.Window}
		if seen[k] {
			errs.add(f, "repeats %s/%s: each metric and window may appear once", l.Metric, l.Window)
		}
		seen[k] = true
	}
}

// bucketDepth is the most time a bucket may take to refill from empty, in
// microseconds: the engine's cap on a debt (quota's GCAP, 2^52 us, 142 years).
const bucketDepth = 1 << 52

// refillTooLong reports whether bucket l (Limit > 0) takes longer than bucketDepth to
// refill from empty: Burst x window (us) > bucketDepth x Limit, in 128 bits.
func refillTooLong(l vocab.Limit) bool {
	w := uint64(l.Window.Duration().Microseconds())
	hi1, lo1 := bits.Mul64(uint64(l.Burst), w)
	hi2, lo2 := bits.Mul64(bucketDepth, uint64(l.Limit))
	return hi1 > hi2 || hi1 == hi2 && lo1 > lo2
}

// maxBurst is the largest burst of l's rate and window that refills within
// bucketDepth.
func maxBurst(l vocab.Limit) int64 {
	w := uint64(l.Window.Duration().Microseconds())
	hi, lo := bits.Mul64(bucketDepth, uint64(l.Limit))
	if hi >= w {
		return vocab.MaxUnits
	}
	q, _ := bits.Div64(hi, lo, w)
	return int64(min(q, uint64(vocab.MaxUnits)))
}

// normalize sorts limits by metric then window (shortest first), so stored and
// returned lists are stable.
func normalize(ls []vocab.Limit) []vocab.Limit {
	out := slices.Clone(ls)
	if out == nil {
		out = []vocab.Limit{}
	}
	slices.SortFunc(out, func(a, b vocab.Limit) int {
		if a.Metric != b.Metric {
			if a.Metric < b.Metric {
				return -1
			}
			return 1
		}
		return slices.Index(vocab.Windows, a.Window) - slices.Index(vocab.Windows, b.Window)
	})
	return out
}

// MergeLimits returns base with each (metric, window) of overrides replacing or adding
// to it: an org's effective limits from its plan's and its overrides, or a user's from
// its team's defaults and its own. An override replaces the whole limit, its burst
// too: a sliding override of a plan's bucket is a sliding window.
func MergeLimits(base, overrides []vocab.Limit) []vocab.Limit {
	m := make(map[limitKey]vocab.Limit, len(base)+len(overrides))
	for _, l := range base {
		m[limitKey{l.Metric, l.Window}] = l
	}
	for _, l := range overrides {
		m[limitKey{l.Metric, l.Window}] = l
	}
	out := make([]vocab.Limit, 0, len(m))
	for _, l := range m {
		out = append(out, l)
	}
	return normalize(out)
}

func index(ls []vocab.Limit) map[limitKey]vocab.Limit {
	m := make(map[limitKey]vocab.Limit, len(ls))
	for _, l := range ls {
		m[limitKey{l.Metric, l.Window}] = l
	}
	return m
}

var decimalPattern = regexp.MustCompile(`^\d{1,12}(\.\d{1,6})?$`)
var currencyPattern = regexp.MustCompile(`^[A-Z]{3}$`)

func validatePricing(errs *fieldErrs, p *Pricing) {
	if p == nil {
		return
	}
	if !currencyPattern.MatchString(p.Currency) {
		errs.add("pricing.currency", "must be a three-letter ISO 4217 code such as USD")
	}
	if !decimalPattern.MatchString(p.BasePrice) {
		errs.add("pricing.base_price", "must be a decimal such as 49.00")
	}
	seen := map[string]bool{}
	for i, m := range p.Metrics {
		f := fmt.Sprintf("pricing.metrics[%d]", i)
		if !vocab.ValidID(m.Metric) {
			errs.add(f+".metric", vocab.IDRule)
		}
		if seen[m.Metric] {
			errs.add(f+".metric", "repeats %q", m.Metric)
		}
		seen[m.Metric] = true
		if m.IncludedUnits < 0 {
			errs.add(f+".included_units", "must be >= 0")
		}
		if !decimalPattern.MatchString(m.OveragePrice) {
			errs.add(f+".overage_price", "must be a decimal such as 0.0001")
		}
	}
}
