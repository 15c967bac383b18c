package quota

import (
	"fmt"
	"time"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// openResult is the FailOpen answer: allowed, usage unknown (reported as 0).
// ResetAt is when a limit's window would reset at the latest: now plus the window
// for sliding windows, the end of the billing period for month; a token bucket is
// reported full.
func openResult(req *Request, now time.Time) vocab.Result {
	res := vocab.Result{Allowed: true}
	add := func(level vocab.Level, id string, limits []vocab.Limit) {
		for _, l := range limits {
			ls := vocab.LevelStatus{
				Level: level, ID: id, Window: l.Window, Limit: l.Limit,
				Used: 0, Remaining: l.Limit, ResetAt: windowEnd(l.Window, now, req.AnchorDay),
			}
			if l.Bucket() { // a full bucket
				ls.Burst, ls.Remaining, ls.ResetAt = l.Burst, l.Burst, now.UTC()
			}
			res.Levels = append(res.Levels, ls)
		}
	}
	add(vocab.LevelOrg, req.Org, req.Limits.Org)
	if req.Team != "" {
		add(vocab.LevelTeam, req.Team, req.Limits.Team)
		if req.User != "" {
			add(vocab.LevelUser, req.User, req.Limits.User)
		}
	}
	return res
}

func windowEnd(w vocab.Window, now time.Time, anchorDay int) time.Time {
	if w == vocab.Month {
		return vocab.PeriodAt(now, anchorDay).End
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
