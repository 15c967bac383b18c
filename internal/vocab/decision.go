package vocab

import "time"

// The decision of a check, as the engine (internal/quota) makes it and every
// transport renders it.

// Result is the decision of one check.
type Result struct {
	// Allowed is false only for a denied check in Enforce mode.
	Allowed bool
	// Levels has one entry per level and window with a limit, org first, usage
	// including this check's cost when it was counted.
	Levels []LevelStatus
	// BlockedAt names the limit that denied the check: the broadest window among
	// those exceeded, and at equal windows the highest level. Nil when allowed.
	BlockedAt *Blocked
	// WouldBlock is what BlockedAt would have been in Shadow or Warn mode, where the
	// check was allowed and counted anyway.
	WouldBlock *Blocked
	// RetryAfter estimates when the same check could pass; set only when denied.
	RetryAfter time.Duration
	// Replayed is true when an earlier check with the same idempotency key decided,
	// and this one consumed nothing.
	Replayed bool
	// Leased is true when the check was admitted in process from a lease this replica
	// holds (internal/quota/lease.go). Levels are then the usage when the lease was taken, counting the
	// whole lease as used (conservative), and are shared by the lease's answers: read only.
	Leased bool
	// Saturated is true when the check took a counter no limit bounds to quota.MaxCounter,
	// where it stopped, the units past it not counted there (docs/ARCHITECTURE.md,
	// "Bounded numbers"; counted in quotaplane_counters_at_bound_total).
	Saturated bool
}

// LevelStatus is the state of one limit after the check.
type LevelStatus struct {
	// Metric is the limit's metric (a multi-metric request's levels are every metric's,
	// in the request's order of metrics).
	Metric string
	Level  Level
	ID     string
	Window Window
	Limit  int64
	// Burst is the bucket's size for a token bucket (Limit is then its rate per
	// Window), 0 for any other limit. A bucket's Remaining is the whole tokens in it
	// now, Used is Burst less Remaining, and ResetAt is when it is full again.
	Burst     int64
	Used      int64
	Remaining int64
	ResetAt   time.Time
}

// Blocked names one limit: which level, whose id, which window.
type Blocked struct {
	Metric string
	Level  Level
	ID     string
	Window Window
	// FairShare is true when an org limit marked fair_share refused a team that was
	// past its weighted share of it above the limit's saturation point (Level is then
	// LevelOrg and ID the org).
	FairShare bool
}
