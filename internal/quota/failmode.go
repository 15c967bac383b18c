package quota

import (
	"fmt"
	"time"
)

// FailMode is what a plan wants when its Redis cannot answer: while the pool's
// circuit breaker is open, or when a check fails with ErrUnavailable.
type FailMode string

// The failure modes a plan may choose.
const (
	// FailOpen allows every check, flagged degraded. Usage is not known, so the
	// result reports each limit with Used 0 and Remaining equal to the limit, and
	// nothing is counted: an outage is free for the tenant.
	FailOpen FailMode = "open"
	// FailClosed refuses to decide: the check fails with an error wrapping
	// ErrUnavailable, which the HTTP layer answers with 503 (never 429).
	FailClosed FailMode = "closed"
	// FailLocal decides with an in-process limiter sized to this replica's share of
	// each limit (limit / EnginesConfig.Replicas); see localLimiter for its limits.
	FailLocal FailMode = "local"
)

// Valid reports whether m is one of the three modes. The empty mode is not valid
// here; the router treats it as FailClosed.
func (m FailMode) Valid() bool { return m == FailOpen || m == FailClosed || m == FailLocal }

// openResult is the FailOpen answer: allowed, usage unknown (reported as 0).
// ResetAt is when a limit's window would reset at the latest: now plus the window
// for sliding windows, the end of the billing period for month.
func openResult(req *Request, now time.Time) Result {
	res := Result{Allowed: true}
	add := func(level Level, id string, limits []Limit) {
		for _, l := range limits {
			res.Levels = append(res.Levels, LevelStatus{
				Level: level, ID: id, Window: l.Window, Limit: l.Limit,
				Used: 0, Remaining: l.Limit, ResetAt: windowEnd(l.Window, now, req.AnchorDay),
			})
		}
	}
	add(LevelOrg, req.Org, req.Limits.Org)
	if req.Team != "" {
		add(LevelTeam, req.Team, req.Limits.Team)
		if req.User != "" {
			add(LevelUser, req.User, req.Limits.User)
		}
	}
	return res
}

func windowEnd(w Window, now time.Time, anchorDay int) time.Time {
	if w == Month {
		return PeriodAt(now, anchorDay).End
	}
	return now.Add(w.Duration()).UTC()
}

// unavailable is the FailClosed answer.
func unavailable(org, pool string, cause error) error {
	if cause == nil {
		return fmt.Errorf("quota check %s: pool %s: %w", org, pool, ErrUnavailable)
	}
	return fmt.Errorf("quota check %s: pool %s: %w: %w", org, pool, ErrUnavailable, cause)
}
