package billing

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Service answers the usage, would-block, adjustment and billing export API.
type Service struct {
	Store   *Store
	Tenants *tenants.Service
	// Counters reads the live counters of the current period; nil: the ledger only
	// (at most one flush interval behind).
	Counters ledger.CounterSource
	// Clock says which period is current (default time.Now).
	Clock  func() time.Time
	Logger *slog.Logger
}

// Usage is the usage of an org in one period.
type Usage struct {
	Org     string
	Period  vocab.Period
	Closed  bool
	Metrics []MetricUsage
	// Currency is the org's plan's rate currency: spend counts micro-units of it; ""
	// when the plan has none.
	Currency string
	// NextCursor is the cursor of the next page of users, "" on the last.
	NextCursor string
}

// MetricUsage is the usage of one metric at every level.
type MetricUsage struct {
	Metric string
	Org    LevelUsage
	Teams  []LevelUsage
	Users  []LevelUsage
	// Daily is the org's cumulative usage at the end of each UTC day with a recorded
	// change, oldest first; in the current period the last point is today's so far.
	Daily []ledger.DayUsage
}

// LevelUsage is the usage of one org, team or user with its month limit.
type LevelUsage struct {
	ID   string
	Team string // of a user
	// Used is the committed units; Reserved those held by open reservations. Both
	// count against Limits, whose month Used is their sum.
	Used     int64
	Reserved int64
	// InFlight is the units held at once by open reservations against a concurrent
	// limit (vocab.Concurrent), now; nil when the level has no concurrent limit of the
	// metric and nothing in flight (and for a period not current).
	InFlight *int64
	Limits   []WindowUsage
}

// WindowUsage is one limit with its use.
type WindowUsage struct {
	Window    string
	Limit     int64
	Used      int64
	Remaining int64
	// Burst is a token bucket's size (Limit is then its rate per window, Remaining
	// the whole tokens in it, Used Burst less Remaining); 0 for any other limit.
	Burst int64
	// Granted is the units of the org's active grants that Limit includes (the org's
	// month window of the current period only; 0 elsewhere).
	Granted int64
}

func (s *Service) now() time.Time {
	if s.Clock != nil {
		return s.Clock()
	}
	return time.Now()
}

// CurrentPeriod is the id of org's current period.
func (s *Service) CurrentPeriod(ctx context.Context, org string) (string, error) {
	o, err := s.Tenants.GetOrg(ctx, org)
	if err != nil {
		return "", err
	}
	return vocab.PeriodAt(s.now(), o.BillingAnchorDay).ID, nil
}

// Usage returns the usage of org in period ("" for the current one): for a closed
// period its final rows with the month limits in force at close; otherwise the
// ledger, raised to Redis's live values when Redis answers, with the current limits.
// For the current period, the sliding windows (second to day) limiting each level are
// reported too, read with cost-0 checks (which count nothing); a closed period has
// only its month limits.
//
// Errors: ErrInvalid for a bad period or one that has not begun; tenants.ErrNotFound
// for an unknown org.
//
// Users come a page at a time: page.Limit users (1..1000, default 100) after
// page.Cursor, ordered by team and id, each with its counters of every metric; the org
// and its teams are on every page. Only the page's users cost a read of their sliding
// windows, so a page's cost does not grow with the org's users. tenants.ValidationError
// naming cursor for a cursor this API did not return.
func (s *Service) Usage(ctx context.Context, org, period string, page tenants.Page) (Usage, error) {
	o, err := s.Tenants.GetOrg(ctx, org)
	if err != nil {
		return Usage{}, err
	}
	cur := vocab.PeriodAt(s.now(), o.BillingAnchorDay)
	per, err := periodAsked(period, o.BillingAnchorDay, cur)
	if err != nil {
		return Usage{}, err
	}
	out := Usage{Org: org, Period: per, Metrics: []MetricUsage{}}
	if p, err := s.Tenants.GetPlan(ctx, o.PlanID); err == nil { // money
		out.Currency = p.Currency
	}
	usage, limits, closed, err := s.Store.ClosedUsage(ctx, org, per.ID)
	if err != nil {
		return Usage{}, fmt.Errorf("usage of %s %s: %w", org, per.ID, err)
	}
	out.Closed = closed
	if closed {
		if out.NextCursor, err = pageUsers(usage, page); err != nil {
			return Usage{}, err
		}
	}
	var cs ledger.Counters
	var held map[quota.Counter]int64 // units of open reservations, not in usage (committed units)
	var sliding map[quota.Counter][]WindowUsage
	var inflight map[quota.Counter]int64 // units held against concurrent limits, now
	var concurrent func(quota.Counter) bool
	if !closed {
		if usage, err = s.Store.ledger.Usage(ctx, org, per.ID); err != nil {
			return Usage{}, fmt.Errorf("usage of %s %s: %w", org, per.ID, err)
		}
		if s.Counters != nil {
			var plan tenants.Plan
			if p, err := s.Tenants.GetPlan(ctx, o.PlanID); err == nil {
				plan = p
			}
			if cs, err = s.Counters.CountersFor(org, tenants.RouteOf(o, plan)); err == nil {
				live, err := cs.MonthUsage(ctx, org, per.ID)
				if err != nil {
					cs = nil
					if s.Logger != nil {
						s.Logger.Warn("usage: live counters unavailable, answering from the ledger", "org", org, "err", err.Error())
					}
				}
				for c, v := range live {
					usage[c] = max(usage[c], v)
				}
				if err == nil {
					if held, err = cs.HeldUnits(ctx, org, per.ID); err != nil {
						held = nil
					}
				}
				if f, ok := cs.(inFlighter); ok && err == nil && per.ID == cur.ID {
					if inflight, err = f.InFlight(ctx, org); err != nil {
						inflight = nil
					}
					for c := range inflight {
						if _, ok := usage[c]; !ok {
							usage[c] = 0
						}
					}
				}
			}
		}
		if out.NextCursor, err = pageUsers(usage, page); err != nil {
			return Usage{}, err
		}
		ol, err := ledger.LoadLimits(ctx, s.Tenants, org)
		if err != nil {
			return Usage{}, err
		}
		if q, ok := cs.(batchChecker); ok && per.ID == cur.ID {
			sliding = s.slidingUsage(ctx, q, ol, usage)
		}
		concurrent = func(c quota.Counter) bool {
			for _, l := range ol.Of(c) {
				if l.Window == vocab.Concurrent {
					return true
				}
			}
			return false
		}
		limits = map[quota.Counter]int64{}
		for c := range usage {
			if l, ok := ol.Month(c); ok {
				limits[c] = l
			}
		}
		// The org's own month limits show even for metrics not used yet.
		for _, l := range o.EffectiveLimits {
			c := quota.Counter{Metric: l.Metric, Level: vocab.LevelOrg}
			if l.Window == vocab.Month {
				if _, ok := usage[c]; !ok {
					usage[c] = 0
				}
				limits[c] = l.Limit
			}
		}
	}
	daily, err := s.Store.ledger.Daily(ctx, org, per.ID)
	if err != nil {
		return Usage{}, err
	}
	byMetric := map[string]*MetricUsage{}
	for c, v := range usage {
		m := byMetric[c.Metric]
		if m == nil {
			m = &MetricUsage{Metric: c.Metric, Org: LevelUsage{ID: org, Limits: []WindowUsage{}}, Teams: []LevelUsage{}, Users: []LevelUsage{},
				Daily: append([]ledger.DayUsage{}, daily[c.Metric]...)}
			byMetric[c.Metric] = m
		}
		lu := LevelUsage{Used: v, Reserved: held[c], Limits: append([]WindowUsage{}, sliding[c]...)}
		if n, ok := inflight[c]; ok || (inflight != nil && concurrent(c)) {
			lu.InFlight = &n
		}
		if l, ok := limits[c]; ok {
			counted := v + held[c]
			wu := WindowUsage{Window: string(vocab.Month), Limit: l, Used: counted, Remaining: max(l-counted, 0)}
			if c.Level == vocab.LevelOrg && !closed {
				wu.Granted = o.Granted[c.Metric]
			}
			lu.Limits = append(lu.Limits, wu)
		}
		switch c.Level {
		case vocab.LevelOrg:
			lu.ID = org
			m.Org = lu
		case vocab.LevelTeam:
			lu.ID = c.Team
			m.Teams = append(m.Teams, lu)
		case vocab.LevelUser:
			lu.ID, lu.Team = c.User, c.Team
			m.Users = append(m.Users, lu)
		}
	}
	for _, m := range byMetric {
		if !closed && per.ID == cur.ID {
			m.Daily = withToday(m.Daily, s.now(), m.Org.Used)
		}
		sort.Slice(m.Teams, func(i, j int) bool { return m.Teams[i].ID < m.Teams[j].ID })
		sort.Slice(m.Users, func(i, j int) bool {
			if m.Users[i].Team != m.Users[j].Team {
				return m.Users[i].Team < m.Users[j].Team
			}
			return m.Users[i].ID < m.Users[j].ID
		})
		out.Metrics = append(out.Metrics, *m)
	}
	sort.Slice(out.Metrics, func(i, j int) bool { return out.Metrics[i].Metric < out.Metrics[j].Metric })
	return out, nil
}

// pageUsers keeps in usage the counters of one page of users (every metric's), ordered
// by team then id after page.Cursor, and returns the next page's cursor ("" on the
// last): base64url of "<team> <user>" (a space sorts before every id character, so
// the keys sort by team, then user).
func pageUsers(usage map[quota.Counter]int64, page tenants.Page) (string, error) {
	var after string
	if page.Cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(page.Cursor)
		team, user, ok := strings.Cut(string(b), " ")
		if err != nil || !ok || !vocab.ValidID(team) || !vocab.ValidID(user) {
			return "", &tenants.ValidationError{Fields: []tenants.FieldError{{Field: "cursor", Message: "is not a cursor this API returned"}}}
		}
		after = string(b)
	}
	limit := page.Limit
	switch {
	case limit <= 0:
		limit = 100
	case limit > 1000:
		limit = 1000
	}
	seen := map[string]bool{}
	var keys []string
	for c := range usage {
		if c.Level != vocab.LevelUser {
			continue
		}
		if k := c.Team + " " + c.User; !seen[k] && k > after {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	next := ""
	if len(keys) > limit {
		keys = keys[:limit]
		next = base64.RawURLEncoding.EncodeToString([]byte(keys[limit-1]))
	}
	keep := make(map[string]bool, len(keys))
	for _, k := range keys {
		keep[k] = true
	}
	for c := range usage {
		if c.Level == vocab.LevelUser && !keep[c.Team+" "+c.User] {
			delete(usage, c)
		}
	}
	return next, nil
}

// withToday makes the last point of a current period's daily history today's usage so
// far (used, read live), unless nothing has been used yet.
func withToday(daily []ledger.DayUsage, now time.Time, used int64) []ledger.DayUsage {
	if used <= 0 {
		return daily
	}
	now = now.UTC()
	today := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	if n := len(daily); n > 0 && !daily[n-1].Day.Before(today) {
		daily[n-1].Used = max(daily[n-1].Used, used)
		return daily
	}
	return append(daily, ledger.DayUsage{Day: today, Used: used})
}

// Export streams the billing export of period ("" for the current one) of org ("" for
// every org) to w. For one org it first checks that the org exists.
//
// Errors: ErrInvalid for a bad period or format; tenants.ErrNotFound for an unknown
// org. Errors after the first byte was written leave the output truncated.
func (s *Service) Export(ctx context.Context, w io.Writer, org, period string, format Format) error {
	if format != CSV && format != JSON {
		return badFormat(format)
	}
	if period != "" {
		if err := ParsePeriod(period); err != nil {
			return err
		}
	}
	if org != "" {
		o, err := s.Tenants.GetOrg(ctx, org)
		if err != nil {
			return err
		}
		if period == "" {
			period = vocab.PeriodAt(s.now(), o.BillingAnchorDay).ID
		}
	} else if period == "" {
		period = vocab.PeriodAt(s.now(), 1).ID
	}
	return s.Store.WriteExport(ctx, w, org, period, format)
}

// inFlighter is what usage's in_flight needs of a quota engine (quota.Engine.InFlight).
type inFlighter interface {
	InFlight(ctx context.Context, org string) (map[quota.Counter]int64, error)
}

// batchChecker is what slidingUsage needs of a quota engine.
type batchChecker interface {
	CheckBatch(ctx context.Context, reqs []quota.Request) ([]vocab.Result, []error)
}

// slidingUsage reads, with one cost-0 check per counter (pipelined by the engine),
// the use of every sliding window and token bucket that limits an org, team or user
// with usage.
func (s *Service) slidingUsage(ctx context.Context, q batchChecker, ol *ledger.Limits, usage map[quota.Counter]int64) map[quota.Counter][]WindowUsage {
	sliding := func(ls []vocab.Limit) []vocab.Limit {
		var out []vocab.Limit
		for _, l := range ls {
			if l.Window != vocab.Month {
				out = append(out, vocab.Limit{Window: l.Window, Limit: l.Limit, Burst: l.Burst})
			}
		}
		return out
	}
	var reqs []quota.Request
	var counters []quota.Counter
	for c := range usage {
		own := sliding(ol.Of(c))
		if len(own) == 0 {
			continue
		}
		req := quota.Request{Org: ol.Org.ID, Metric: c.Metric, AnchorDay: ol.Org.BillingAnchorDay}
		switch c.Level {
		case vocab.LevelOrg:
			req.Limits.Org = own
		case vocab.LevelTeam:
			req.Team, req.Limits.Team = c.Team, own
		case vocab.LevelUser:
			req.Team, req.User, req.Limits.User = c.Team, c.User, own
		}
		reqs = append(reqs, req)
		counters = append(counters, c)
	}
	out := map[quota.Counter][]WindowUsage{}
	const chunk = 500
	for i := 0; i < len(reqs); i += chunk {
		end := min(i+chunk, len(reqs))
		res, errs := q.CheckBatch(ctx, reqs[i:end])
		for j, r := range res {
			if errs[j] != nil {
				continue // Redis trouble: report the month only
			}
			c := counters[i+j]
			for _, l := range r.Levels {
				if l.Level == c.Level {
					out[c] = append(out[c], WindowUsage{Window: string(l.Window), Limit: l.Limit, Burst: l.Burst, Used: l.Used, Remaining: max(l.Remaining, 0)})
				}
			}
		}
	}
	return out
}
