package quota

import (
	"errors"
	"fmt"
	"slices"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// MaxCounter is the most any counter holds (2^51, 2 x vocab.MaxUnits): the scripts
// refuse to count past it, read a stored value above it (old data) as MaxCounter, and
// a commit that would pass it stops there. Every limit is at most vocab.MaxUnits, so a
// counter at MaxCounter is over every limit.
const MaxCounter int64 = 2 * vocab.MaxUnits

// PreciseSubBuckets is how many sub-buckets a precise window (Request.Precise) is
// counted in: 50 ms of a second, 3 s of a minute, 3 min of an hour, 72 min of a day.
// It divides every window's length in ms, so sub-buckets never straddle buckets.
const PreciseSubBuckets = 20

// slidingWindows lists the sliding windows from the narrowest to the broadest; a
// window's position is its index in the script's window list minus one.
var slidingWindows = [...]vocab.Window{vocab.Second, vocab.Minute, vocab.Hour, vocab.Day}

// windowSeconds is the window length as the script sees it (and as it appears in
// bucket keys), constant strings so that passing them to Redis does not allocate.
func windowSeconds(w vocab.Window) string {
	switch w {
	case vocab.Second:
		return "1"
	case vocab.Minute:
		return "60"
	case vocab.Hour:
		return "3600"
	case vocab.Day:
		return "86400"
	}
	return ""
}

// windowBit maps a window to its bit in a set of windows; Month has none because it
// is always counted.
func windowBit(w vocab.Window) uint8 {
	switch w {
	case vocab.Second:
		return 1
	case vocab.Minute:
		return 2
	case vocab.Hour:
		return 4
	case vocab.Day:
		return 8
	}
	return 0
}

// levelLetter is the level's one-letter code in counter fields and script replies.
func levelLetter(l vocab.Level) string {
	switch l {
	case vocab.LevelOrg:
		return "o"
	case vocab.LevelTeam:
		return "t"
	case vocab.LevelUser:
		return "u"
	}
	return ""
}

func levelOfLetter(s string) vocab.Level {
	switch s {
	case "o":
		return vocab.LevelOrg
	case "t":
		return vocab.LevelTeam
	case "u":
		return vocab.LevelUser
	}
	return ""
}

// LevelLimits holds the limits of one metric at each level, already resolved by the
// caller (plan, overrides, allocations, user defaults). A nil slice means the level
// has no limit for the metric; its usage is still counted. A Limit's Metric is not
// read: the Request names the metric.
type LevelLimits struct {
	Org  []vocab.Limit
	Team []vocab.Limit
	User []vocab.Limit
}

// Request asks whether Cost units of Metric may be spent now.
type Request struct {
	// Org is the tenant; required.
	Org string
	// Team is the team inside Org; empty for an org-level check.
	Team string
	// User is the end user inside Team; empty for a team- or org-level check. A user
	// counter is scoped by its team, so the same user id in two teams counts twice.
	User string
	// Metric is the metric to count, e.g. "requests"; required.
	Metric string
	// Cost is the number of units, 0 to query without consuming.
	Cost int64
	// IdempotencyKey, when set (8..128 characters of [A-Za-z0-9._:@-]), makes a repeat
	// of the check within 24 hours return the first decision without counting again.
	// Keys are scoped by Org. A repeat must be the same request (Team, User, Metric and
	// Cost, and every metric and cost of More, as first given); any other fails with ErrIdempotencyConflict, counting nothing.
	IdempotencyKey string
	// Mode is the org's enforcement mode; empty means Enforce.
	Mode vocab.Mode
	// Limits are the limits of Metric at each present level.
	Limits LevelLimits
	// AnchorDay is the org's billing anchor day, 1..28; 0 means 1 (calendar month UTC).
	AnchorDay int
	// Precise counts the sliding windows in PreciseSubBuckets sub-buckets each (the
	// org's plan or override says sliding_windows: precise): no real span of a window
	// ever admits more than its limit, where the two-bucket estimate admits up to
	// twice it; the price is at most one sub-bucket of units counted for longer than
	// the window, and 1.5-1.8x the Redis time per check (docs/ARCHITECTURE.md
	// "Sliding windows"). Leases of a precise check end with the current sub-bucket.
	Precise bool
	// Unregistered says User is not a registered user of the org: the org's bound on
	// distinct unregistered users a period (Config.UnregisteredUsers) applies.
	Unregistered bool
	// NoLease keeps the check out of leases (the org's plan or override says leases:
	// off): it is decided in Redis even when its path is hot.
	NoLease bool
	// More are further metrics decided with Metric in the same script run, all or
	// nothing over every metric, level and window (docs/ARCHITECTURE.md "Several metrics
	// in one decision"): at most MaxMetrics-1 the caller named, each named once, and
	// at most one Derived beside them. Empty for a one-metric request. A multi-metric
	// request is never leased.
	More []MetricCost
	// Capacities are the capacities the request draws on (capacity.go): an operator's
	// capacity of one of its metrics, and an org limit marked fair_share shared by
	// the request's team. Each draws the cost of its Metric, which must be one of the
	// request's; all or nothing with every limit of the request.
	Capacities []CapacityDraw
}

// MaxMetrics is the most metrics one request may name (Metric and More, Derived
// ones aside): a check names at most 16 metrics, and the spend its org's rates price
// from them is one more counter of the same decision.
const MaxMetrics = 16

// MetricCost is one more metric of a multi-metric Request: its cost and its limits.
type MetricCost struct {
	Metric string
	Cost   int64
	Limits LevelLimits
	// Derived says the caller computed Cost from the request's other costs (the check
	// service's spend, priced from the org's rates): it is not part of the request an
	// idempotency key is bound to, so a retry after a rate change is still a repeat.
	Derived bool
}

// metricCount is how many metrics req counts, Derived ones included.
func (r *Request) metricCount() int { return 1 + len(r.More) }

// derivedCount is how many of req's metrics are Derived.
func (r *Request) derivedCount() int {
	n := 0
	for _, m := range r.More {
		if m.Derived {
			n++
		}
	}
	return n
}

// names reports whether metric is one of req's metrics.
func (r *Request) names(metric string) bool {
	return metric == r.Metric || slices.ContainsFunc(r.More, func(m MetricCost) bool { return m.Metric == metric })
}

// metricAt is req's i-th metric (0: Metric), its cost and limits.
func (r *Request) metricAt(i int) (string, int64, *LevelLimits) {
	if i == 0 {
		return r.Metric, r.Cost, &r.Limits
	}
	m := &r.More[i-1]
	return m.Metric, m.Cost, &m.Limits
}

// Validate reports every problem of the request, joined, each wrapping ErrInvalid.
func (r *Request) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...))
	}
	if !vocab.ValidID(r.Org) {
		bad("org %q is not a valid id", r.Org)
	}
	if r.Team != "" && !vocab.ValidID(r.Team) {
		bad("team %q is not a valid id", r.Team)
	}
	if r.User != "" {
		if !vocab.ValidID(r.User) {
			bad("user %q is not a valid id", r.User)
		}
		if r.Team == "" {
			bad("user %q needs its team", r.User)
		}
	}
	if !vocab.ValidID(r.Metric) {
		bad("metric %q is not a valid id", r.Metric)
	}
	if r.Cost < 0 || r.Cost > vocab.MaxUnits {
		bad("cost %d is outside 0..%d", r.Cost, vocab.MaxUnits)
	}
	if d := r.derivedCount(); r.metricCount()-d > MaxMetrics || d > 1 {
		bad("%d metrics (%d derived): at most %d and one derived", r.metricCount(), d, MaxMetrics)
	}
	for i, m := range r.More {
		if !vocab.ValidID(m.Metric) {
			bad("metric %q is not a valid id", m.Metric)
		}
		if m.Cost < 0 || m.Cost > vocab.MaxUnits {
			bad("metric %s: cost %d is outside 0..%d", m.Metric, m.Cost, vocab.MaxUnits)
		}
		if m.Metric == r.Metric || slices.ContainsFunc(r.More[:i], func(o MetricCost) bool { return o.Metric == m.Metric }) {
			bad("metric %q named twice", m.Metric)
		}
	}
	for i := range r.Capacities {
		d := &r.Capacities[i]
		if err := d.validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		if !r.names(d.Metric) {
			bad("capacity %s counts metric %s, which the request does not name", d.ID, d.Metric)
		}
	}
	if k := r.IdempotencyKey; k != "" && (len(k) < 8 || len(k) > 128 || !validChars(k)) {
		bad("idempotency key must be 8..128 characters of [A-Za-z0-9._:@-]")
	}
	switch r.Mode {
	case "", vocab.Enforce, vocab.Shadow, vocab.Warn:
	default:
		bad("mode %q is not enforce, shadow or warn", r.Mode)
	}
	if r.AnchorDay < 0 || r.AnchorDay > 28 {
		bad("billing anchor day %d is outside 1..28", r.AnchorDay)
	}
	checkLimits := func(level vocab.Level, present bool, limits []vocab.Limit) {
		if len(limits) > 0 && !present {
			bad("%s limits given for an absent %s", level, level)
			return
		}
		var seen uint8 // window bits, month as 16, concurrent as 32
		for _, l := range limits {
			if !l.Window.Valid() {
				bad("%s limit: unknown window %q", level, l.Window)
				continue
			}
			bit := windowBit(l.Window)
			if l.Window == vocab.Month {
				bit = 16
			} else if l.Window == vocab.Concurrent {
				bit = 32
			}
			if seen&bit != 0 {
				bad("%s limit: window %s repeated", level, l.Window)
			}
			seen |= bit
			if l.Limit < 0 || l.Limit > vocab.MaxUnits {
				bad("%s limit %d per %s is outside 0..%d", level, l.Limit, l.Window, vocab.MaxUnits)
			}
			if l.Burst < 0 || l.Burst > vocab.MaxUnits {
				bad("%s limit's burst %d per %s is outside 1..%d", level, l.Burst, l.Window, vocab.MaxUnits)
			} else if l.Burst > 0 && l.Window.Duration() == 0 {
				bad("%s limit per %s has a burst: only a second to day window is a token bucket", level, l.Window)
			}
		}
	}
	for i := range r.metricCount() {
		_, _, ls := r.metricAt(i)
		checkLimits(vocab.LevelOrg, true, ls.Org)
		checkLimits(vocab.LevelTeam, r.Team != "", ls.Team)
		checkLimits(vocab.LevelUser, r.User != "", ls.User)
	}
	return errors.Join(errs...)
}

func validChars(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.', c == '_', c == ':', c == '@', c == '-':
		default:
			return false
		}
	}
	return true
}

// Counter names one month usage counter of an org.
type Counter struct {
	Metric string
	Level  vocab.Level
	// Team is set for team and user counters.
	Team string
	// User is set for user counters.
	User string
}

// field is the counter's hash field: metric|o, metric|t|team or metric|u|team|user.
func (c Counter) field() string {
	switch c.Level {
	case vocab.LevelOrg:
		return c.Metric + "|o"
	case vocab.LevelTeam:
		return c.Metric + "|t|" + c.Team
	default:
		return c.Metric + "|u|" + c.Team + "|" + c.User
	}
}
