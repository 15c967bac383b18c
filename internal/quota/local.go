package quota

import (
	"sync"
	"time"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// localLimiter decides checks of FailLocal plans while their Redis is unavailable.
// It keeps one fixed-window counter per (org, team, user, metric, level, window),
// sized to this replica's share of the limit: limit / replicas, rounded down, so
// that replicas together never admit more than the limit within one local window.
//
// It is an approximation, and says so by flagging every answer degraded:
//   - It knows nothing of the usage Redis had counted before the outage: each
//     replica starts from zero, so a tenant already near a limit gets up to one more
//     share per replica.
//   - Sliding windows become fixed windows aligned to the clock (a minute limit
//     resets on the minute), so up to two shares can pass around a boundary.
//   - A month limit is a counter for the billing period (from the local clock and
//     the org's anchor day) that lives in this process: it accumulates the usage
//     admitted locally over every outage of the period, not the period's real usage.
//   - What it admits is not written back to Redis after recovery: usage during an
//     outage is under-counted in Redis and in billing.
//   - Idempotency keys are ignored (a repeat counts again); Shadow and Warn count and
//     allow as in Redis, reporting WouldBlock.
//
// Counters whose window has ended are swept at most once a minute.
type localLimiter struct {
	replicas int64

	mu        sync.Mutex
	counters  map[localKey]*localCounter
	lastSweep time.Time
}

type localKey struct {
	org, team, user, metric string
	level                   vocab.Level
	window                  vocab.Window
}

type localCounter struct {
	end  time.Time // window end; the counter is void from then on
	used int64
}

func newLocalLimiter(replicas int) *localLimiter {
	return &localLimiter{replicas: int64(max(replicas, 1)), counters: map[localKey]*localCounter{}}
}

// share is this replica's part of limit.
func (l *localLimiter) share(limit int64) int64 { return limit / l.replicas }

// decide answers req from the local counters at now. req must be valid.
func (l *localLimiter) decide(req *Request, now time.Time) vocab.Result {
	type slot struct {
		metric string
		cost   int64
		level  vocab.Level
		id     string
		window vocab.Window
		share  int64
		c      *localCounter
	}
	var slots [16]slot
	ss := slots[:0]

	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.lastSweep) > time.Minute {
		for k, c := range l.counters {
			if !now.Before(c.end) {
				delete(l.counters, k)
			}
		}
		l.lastSweep = now
	}
	var cost int64 // the metric's being added
	add := func(level vocab.Level, id string, k localKey, limits []vocab.Limit) {
		k.level = level
		for _, lim := range limits {
			if lim.Window == vocab.Concurrent {
				continue // nothing is held in process: in-flight is Redis's alone
			}
			k.window = lim.Window
			c := l.counters[k]
			if c == nil || !now.Before(c.end) {
				c = &localCounter{end: localWindowEnd(lim.Window, now, req.AnchorDay)}
				l.counters[k] = c
			}
			ss = append(ss, slot{metric: k.metric, cost: cost, level: level, id: id, window: lim.Window, share: l.share(lim.Limit), c: c})
		}
	}
	for m := range req.metricCount() { // every metric of a multi-metric request, all or nothing
		metric, mc, ls := req.metricAt(m)
		cost = mc
		k := localKey{org: req.Org, metric: metric}
		add(vocab.LevelOrg, req.Org, k, ls.Org)
		if req.Team != "" {
			k.team = req.Team
			add(vocab.LevelTeam, req.Team, k, ls.Team)
			if req.User != "" {
				k.user = req.User
				add(vocab.LevelUser, req.User, k, ls.User)
			}
		}
	}

	// The blocking limit is the broadest window exceeded, at equal windows the
	// highest level, as in Redis.
	var blocked *slot
	for i := range ss {
		s := &ss[i]
		if s.c.used+s.cost <= s.share {
			continue
		}
		if blocked == nil || windowRank(s.window) > windowRank(blocked.window) {
			blocked = s
		}
	}
	res := vocab.Result{Allowed: true}
	if blocked != nil {
		b := &vocab.Blocked{Metric: blocked.metric, Level: blocked.level, ID: blocked.id, Window: blocked.window}
		if req.Mode == vocab.Shadow || req.Mode == vocab.Warn {
			res.WouldBlock = b
		} else {
			res.Allowed, res.BlockedAt = false, b
			res.RetryAfter = blocked.c.end.Sub(now)
		}
	}
	if res.Allowed {
		for i := range ss {
			ss[i].c.used += ss[i].cost
		}
	}
	res.Levels = make([]vocab.LevelStatus, len(ss))
	for i, s := range ss {
		res.Levels[i] = vocab.LevelStatus{
			Metric: s.metric, Level: s.level, ID: s.id, Window: s.window, Limit: s.share,
			Used: s.c.used, Remaining: max(s.share-s.c.used, 0), ResetAt: s.c.end,
		}
	}
	return res
}

func windowRank(w vocab.Window) int {
	if w == vocab.Month {
		return 5
	}
	for i, sw := range slidingWindows {
		if sw == w {
			return i + 1
		}
	}
	return 0
}

// localWindowEnd is the end of the fixed local window containing now.
func localWindowEnd(w vocab.Window, now time.Time, anchorDay int) time.Time {
	if w == vocab.Month {
		return vocab.PeriodAt(now, anchorDay).End
	}
	d := w.Duration()
	return now.UTC().Truncate(d).Add(d)
}
