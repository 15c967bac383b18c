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
//   - A token bucket stays a bucket, of this replica's share of its rate and of its
//     burst (limit / replicas and burst / replicas, rounded down), starting full: the
//     replicas together admit at most burst + rate x span of the bucket over any span
//     of the outage, plus what Redis's bucket had already given. As on Redis, its
//     debt is at most 2^52 us (so it never overflows a time.Duration): a bucket
//     holds at most that many microseconds' tokens.
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
	// tat is a token bucket's theoretical arrival time (its end too: full from then,
	// and swept): the bucket holds burst - (tat - now) / per tokens.
	tat time.Time
}

func newLocalLimiter(replicas int) *localLimiter {
	return &localLimiter{replicas: int64(max(replicas, 1)), counters: map[localKey]*localCounter{}}
}

// share is this replica's part of limit.
func (l *localLimiter) share(limit int64) int64 { return limit / l.replicas }

// decide answers req from the local counters at now. req must be valid.
func (l *localLimiter) decide(req *Request, now time.Time) vocab.Result {
	type slot = localSlot
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
			sl := slot{metric: k.metric, cost: cost, level: level, id: id, window: lim.Window, share: l.share(lim.Limit)}
			if lim.Bucket() {
				k.window += "/bucket" // apart from a sliding window of the same span
				sl.bucket, sl.burst = true, l.share(lim.Burst)
				if sl.share > 0 {
					sl.per = max(lim.Window.Duration()/time.Duration(sl.share), 1)
				}
			}
			c := l.counters[k]
			if c == nil || !now.Before(c.end) {
				c = &localCounter{end: localWindowEnd(lim.Window, now, req.AnchorDay)}
				if sl.bucket {
					c.end, c.tat = now, now // full
				}
				l.counters[k] = c
			}
			sl.c = c
			ss = append(ss, sl)
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
	var retry time.Duration
	for i := range ss {
		s := &ss[i]
		wait, fits := s.wait(now)
		if fits {
			continue
		}
		if blocked == nil || windowRank(s.window) > windowRank(blocked.window) {
			blocked = s
		}
		if wait < 0 || retry < 0 {
			retry = -1 // never: no Retry-After
		} else {
			retry = max(retry, wait)
		}
	}
	res := vocab.Result{Allowed: true}
	if blocked != nil {
		b := &vocab.Blocked{Metric: blocked.metric, Level: blocked.level, ID: blocked.id, Window: blocked.window}
		if req.Mode == vocab.Shadow || req.Mode == vocab.Warn {
			res.WouldBlock = b
		} else {
			res.Allowed, res.BlockedAt = false, b
			res.RetryAfter = max(retry, 0)
		}
	}
	if res.Allowed {
		for i := range ss {
			ss[i].take(now)
		}
	}
	res.Levels = make([]vocab.LevelStatus, len(ss))
	for i, s := range ss {
		res.Levels[i] = s.status(now)
	}
	return res
}

// wait reports whether the slot's cost fits at now and, when not, how long until it
// does: -1 never (a token bucket whose share of the burst is below the cost).
func (s *localSlot) wait(now time.Time) (time.Duration, bool) {
	if !s.bucket {
		if s.c.used+s.cost <= s.share {
			return 0, true
		}
		return s.c.end.Sub(now), false
	}
	if s.cost == 0 {
		return 0, true
	}
	if s.per == 0 || s.cost > s.depth() {
		return -1, false
	}
	need := s.debt(now) + time.Duration(s.cost-s.depth())*s.per
	return max(need, 0), need <= 0
}

// localDebtCap is the most debt a token bucket keeps: check.lua's GCAP (2^52 us, 142
// years), so a debt and a cost's time (each at most the cap) add up without passing
// time.Duration's 292 years.
const localDebtCap = bucketDebtCap * time.Microsecond

// depth is the most tokens a token bucket of per > 0 holds: its burst, or as many as
// localDebtCap holds when that is less (1/day: 52,124).
func (s *localSlot) depth() int64 { return min(s.burst, int64(localDebtCap/s.per)) }

// debt is how long until a token bucket is full again.
func (s *localSlot) debt(now time.Time) time.Duration { return max(s.c.tat.Sub(now), 0) }

// take counts the slot's cost: a window's count, or a token bucket's arrival time
// moved on (never past empty: shadow and warn count past it as empty).
func (s *localSlot) take(now time.Time) {
	if !s.bucket {
		s.c.used += s.cost
		return
	}
	if s.per == 0 || s.cost == 0 {
		return
	}
	// forced past empty: empty; a debt already past it stays (never gives tokens)
	d := time.Duration(s.depth()) * s.per
	if s.cost < s.depth() {
		d = min(s.debt(now)+time.Duration(s.cost)*s.per, d)
	}
	d = max(d, s.debt(now))
	s.c.tat = now.Add(d)
	s.c.end = s.c.tat
}

// status is the slot's level as an answer reports it.
func (s *localSlot) status(now time.Time) vocab.LevelStatus {
	ls := vocab.LevelStatus{Metric: s.metric, Level: s.level, ID: s.id, Window: s.window, Limit: s.share,
		Used: s.c.used, Remaining: max(s.share-s.c.used, 0), ResetAt: s.c.end}
	if s.bucket {
		ls.Burst, ls.ResetAt = s.burst, now.Add(s.debt(now))
		remaining := int64(0)
		if s.per > 0 {
			remaining = max(s.depth()-int64((s.debt(now)+s.per-1)/s.per), 0)
		}
		ls.Used, ls.Remaining = s.burst-remaining, remaining
	}
	return ls
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

// localSlot is one limit of a locally decided check: its counter and this replica's
// share of the limit.
type localSlot struct {
	metric string
	cost   int64
	level  vocab.Level
	id     string
	window vocab.Window
	share  int64
	c      *localCounter
	bucket bool          // a token bucket: burst and per below, else a fixed window
	burst  int64         // a token bucket's share of its burst
	per    time.Duration // a token bucket's time per unit at its share of the rate; 0: a share of 0
}

// localWindowEnd is the end of the fixed local window containing now.
func localWindowEnd(w vocab.Window, now time.Time, anchorDay int) time.Time {
	if w == vocab.Month {
		return vocab.PeriodAt(now, anchorDay).End
	}
	d := w.Duration()
	return now.UTC().Truncate(d).Add(d)
}
