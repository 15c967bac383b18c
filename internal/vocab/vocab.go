// Package vocab is the vocabulary Quotaplane's packages share: the windows, levels,
// modes and fail modes a limit is written in, a Limit, the billing Period, the one id
// validator, the bound MaxUnits on every number of units, an org's Route to its
// Redis, and what the engine answers and every transport renders: a check's Result
// and a Reservation. Each is defined here once; tenants (which stores them), quota (which counts
// them), checks and billing use these types directly. It imports nothing internal, so
// any package may import it.
package vocab

import "time"

// MaxUnits is the largest number of units any input may carry: a check's cost, a
// reservation's amount and used, a limit (plan, org override, team or user
// allocation), a grant and a counter adjustment. It is 2^50 (1,125,899,906,842,624).
// Redis runs quota's scripts in Lua, whose numbers are IEEE doubles, exact only up to
// 2^53; the bound leaves room for every sum a script makes: a counter never passes
// quota.MaxCounter = 2 x MaxUnits (a count that would take it past is refused, even
// in shadow and warn mode), so counter + cost <= 3 x 2^50, a sliding window's two
// buckets plus a cost <= 5 x 2^50 and a commit's counter + over-reserved units
// <= 3 x 2^50, all below 2^53 (docs/ARCHITECTURE.md, "Bounded numbers").
const MaxUnits int64 = 1 << 50

// Window is the span a limit applies to. Second, minute, hour and day are sliding
// windows (two-bucket weighted counter, or sub-buckets when precise); month is the
// org's billing period. Concurrent is no span of time: it bounds the units held at
// once by open reservations (in flight), whatever their age.
type Window string

// The windows a limit may use.
const (
	Second Window = "second"
	Minute Window = "minute"
	Hour   Window = "hour"
	Day    Window = "day"
	Month  Window = "month"
	// Concurrent limits the units held at once by open reservations of a level; a
	// check only tests it (held + cost <= limit) and holds nothing.
	Concurrent Window = "concurrent"
)

// Windows lists every window, shortest first, then Concurrent.
var Windows = []Window{Second, Minute, Hour, Day, Month, Concurrent}

// Duration is the length of a sliding window, or 0 for Month (whose length depends on
// the calendar), Concurrent and an unknown window.
func (w Window) Duration() time.Duration {
	switch w {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return 24 * time.Hour
	}
	return 0
}

// Valid reports whether w is one of the six windows.
func (w Window) Valid() bool { return w == Month || w == Concurrent || w.Duration() > 0 }

// Level is one step of the org > team > user cascade.
type Level string

// The levels of the cascade.
const (
	LevelOrg  Level = "org"
	LevelTeam Level = "team"
	LevelUser Level = "user"
	// LevelCapacity is no step of the cascade: it names an operator's capacity, a
	// limit above every org (Blocked.ID is the capacity's id).
	LevelCapacity Level = "capacity"
)

// Mode is an org's enforcement mode. All modes count usage; only Enforce denies.
type Mode string

// The enforcement modes.
const (
	// Enforce denies a check that would exceed a limit and counts nothing for it.
	Enforce Mode = "enforce"
	// Shadow never denies; a check that would have been denied is counted anyway and
	// reported as would-block (Result.WouldBlock).
	Shadow Mode = "shadow"
	// Warn behaves like Shadow; the answer carries a warning as well.
	Warn Mode = "warn"
)

// FailMode is what a plan wants when its Redis cannot answer: while the pool's
// circuit breaker is open, or when a check fails with quota.ErrUnavailable.
type FailMode string

// The failure modes a plan may choose.
const (
	// FailOpen allows every check, flagged degraded. Usage is not known, so the
	// result reports each limit with Used 0 and Remaining equal to the limit, and
	// nothing is counted: an outage is free for the tenant.
	FailOpen FailMode = "open"
	// FailClosed refuses to decide: the check fails with an error wrapping
	// quota.ErrUnavailable, which the transports answer with 503 (never 429).
	FailClosed FailMode = "closed"
	// FailLocal decides with an in-process limiter sized to this replica's share of
	// each limit (limit / quota.EnginesConfig.Replicas); see quota's localLimiter.
	FailLocal FailMode = "local"
)

// Valid reports whether m is one of the three modes. The empty mode is not valid
// here; quota treats it as FailClosed.
func (m FailMode) Valid() bool { return m == FailOpen || m == FailClosed || m == FailLocal }

// Limit caps the units of one metric in one window. Metric names the metric in a
// plan's, org's, team's or user's list of limits; a quota.Request names its metric
// itself, so the engine ignores Metric in the limits it is given.
type Limit struct {
	Metric string `json:"metric"`
	Window Window `json:"window"`
	Limit  int64  `json:"limit"`
	// Burst, when above 0, makes a limit of a Second to Day window a token bucket:
	// Limit units refill per window, the bucket holds at most Burst and starts full
	// (GCRA on the engine's Redis time; docs/ARCHITECTURE.md "Token buckets"). 0 is a
	// sliding window. Month and Concurrent limits carry none.
	Burst int64 `json:"burst,omitempty"`
	// FairShare, on an org's limit of a Second to Day window (its plan's or its own),
	// shares the limit among the org's teams that have no limit of their own for its
	// metric and window, by team weight, above the limit's saturation point
	// (docs/ARCHITECTURE.md "Capacities and fair share"). Team and user limits carry
	// none.
	FairShare bool `json:"fair_share,omitempty"`
}

// MaxWeight is the largest weight a plan, org or team may carry (1 is the smallest):
// its part of a saturated capacity or fair-share limit is its weight over the
// weights of the members active in the window.
const MaxWeight = 1000

// Bucket reports whether l is a token bucket.
func (l Limit) Bucket() bool { return l.Burst > 0 }

// Route is what decides where and how an org's checks run: built from the org and its
// plan by tenants.ResolvedOrg.Route, read by quota's engines.
type Route struct {
	// Pool is the pool class of the org's plan ("" or an unknown class: the default pool).
	Pool string
	// RedisURL is the org's dedicated Redis, "" if none; it takes precedence over Pool.
	RedisURL string
	// FailMode is the plan's failure mode; empty means FailClosed.
	FailMode FailMode
	// Plan is the org's plan id, used only as the plan label of
	// quotaplane_plan_checks_total ("" is reported as "none").
	Plan string
}

// IDPattern is the shape of every caller-chosen id (plans, orgs, teams, users,
// metrics), as the API documents it.
const IDPattern = `^[a-zA-Z0-9][a-zA-Z0-9._:@-]{0,127}$`

// IDRule is IDPattern in words, what a refusal of an id says it must be (a caller is
// never shown a regular expression). The spec's Id schema says the same
// (x-invalid-message; TestNoPatternReachesAnError holds them equal).
const IDRule = "must be 1 to 128 characters: letters a-z and A-Z, digits and . _ : @ -, the first a letter or digit"

// ValidID reports whether s is a valid caller-chosen id: IDPattern, checked by hand
// because it runs several times on every check (the regexp was 4 % of a check's CPU).
// quota's key layout relies on it: ids never contain '|', ';', '{' or '}'.
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > 128 || !alnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !alnum(c) && c != '.' && c != '_' && c != ':' && c != '@' && c != '-' {
			return false
		}
	}
	return true
}

func alnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }
