package billing

import (
	"context"
	"sort"
	"time"

	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// WouldBlockReport is who enforcing would have hurt in one period of an org.
type WouldBlockReport struct {
	Org    string
	Period vocab.Period
	// Mode is the org's enforcement mode now.
	Mode string
	// Capped is true when more distinct rows would have blocked than the cap, and
	// the rest are counted in the row of level "other".
	Capped bool
	Total  quota.WouldBlockCount
	// Days are the totals per UTC day with any count, oldest first.
	Days []WouldBlockDay
	// Rows are the limits that would have blocked, most checks first.
	Rows []WouldBlockRow
}

// WouldBlockRow is one limit that would have blocked checks in the period.
type WouldBlockRow struct {
	Metric string
	Level  string // org, team, user or other
	ID     string // the org, team or user id; "" for other
	Team   string // of a user
	Window string
	quota.WouldBlockCount
	Days []WouldBlockDay
}

// WouldBlockDay is one UTC day's count.
type WouldBlockDay struct {
	Day time.Time
	quota.WouldBlockCount
}

// WouldBlock reports the would-block record of org in period ("" for the current
// one): the stored counts of every epoch, with the live record in Redis (when it
// answers) raised over its own epoch's stored counts.
//
// Errors: ErrInvalid for a bad period or one that has not begun; tenants.ErrNotFound
// for an unknown org.
func (s *Service) WouldBlock(ctx context.Context, org, period string) (WouldBlockReport, error) {
	o, err := s.Tenants.GetOrg(ctx, org)
	if err != nil {
		return WouldBlockReport{}, err
	}
	per, err := periodAsked(period, o.BillingAnchorDay, vocab.PeriodAt(s.now(), o.BillingAnchorDay))
	if err != nil {
		return WouldBlockReport{}, err
	}
	stored, err := s.Store.ledger.StoredWouldBlock(ctx, org, per.ID)
	if err != nil {
		return WouldBlockReport{}, err
	}
	if s.Counters != nil {
		var plan tenants.Plan
		if p, err := s.Tenants.GetPlan(ctx, o.PlanID); err == nil {
			plan = p
		}
		if cs, err := s.Counters.CountersFor(org, tenants.RouteOf(o, plan)); err == nil {
			live, err := cs.WouldBlock(ctx, org, per.ID)
			if err != nil && s.Logger != nil {
				s.Logger.Warn("would-block: live record unavailable, answering from Postgres", "org", org, "err", err.Error())
			}
			if err == nil && live.Epoch != "" {
				m := stored[live.Epoch]
				if m == nil {
					m = map[quota.WouldBlockKey]quota.WouldBlockCount{}
					stored[live.Epoch] = m
				}
				for k, c := range live.Counts {
					old := m[k]
					m[k] = quota.WouldBlockCount{Checks: max(old.Checks, c.Checks), Units: max(old.Units, c.Units)}
				}
			}
		}
	}
	out := WouldBlockReport{Org: org, Period: per, Mode: string(o.Mode), Days: []WouldBlockDay{}, Rows: []WouldBlockRow{}}
	type rowKey struct{ metric, level, team, user, window string }
	rows := map[rowKey]*WouldBlockRow{}
	rowDays := map[rowKey]map[string]quota.WouldBlockCount{}
	days := map[string]quota.WouldBlockCount{}
	for _, m := range stored {
		for k, c := range m {
			rk := rowKey{k.Metric, string(k.Level), k.Team, k.User, string(k.Window)}
			r := rows[rk]
			if r == nil {
				r = &WouldBlockRow{Metric: k.Metric, Level: string(k.Level), Window: string(k.Window)}
				switch k.Level {
				case vocab.LevelOrg:
					r.ID = org
				case vocab.LevelTeam:
					r.ID = k.Team
				case vocab.LevelUser:
					r.ID, r.Team = k.User, k.Team
				}
				rows[rk] = r
				rowDays[rk] = map[string]quota.WouldBlockCount{}
			}
			r.Checks += c.Checks
			r.Units += c.Units
			rowDays[rk][k.Day] = addCount(rowDays[rk][k.Day], c)
			days[k.Day] = addCount(days[k.Day], c)
			out.Total = addCount(out.Total, c)
			if k.Level == quota.LevelOther {
				out.Capped = true
			}
		}
	}
	out.Days = sortedDays(days)
	for rk, r := range rows {
		r.Days = sortedDays(rowDays[rk])
		out.Rows = append(out.Rows, *r)
	}
	sort.Slice(out.Rows, func(i, j int) bool {
		a, b := out.Rows[i], out.Rows[j]
		if a.Checks != b.Checks {
			return a.Checks > b.Checks
		}
		if a.Level != b.Level {
			return a.Level < b.Level
		}
		if a.Team+"|"+a.ID != b.Team+"|"+b.ID {
			return a.Team+"|"+a.ID < b.Team+"|"+b.ID
		}
		if a.Metric != b.Metric {
			return a.Metric < b.Metric
		}
		return a.Window < b.Window
	})
	return out, nil
}

func addCount(a, b quota.WouldBlockCount) quota.WouldBlockCount {
	return quota.WouldBlockCount{Checks: a.Checks + b.Checks, Units: a.Units + b.Units}
}

func sortedDays(m map[string]quota.WouldBlockCount) []WouldBlockDay {
	out := make([]WouldBlockDay, 0, len(m))
	for d, c := range m {
		t, err := time.Parse(time.DateOnly, d)
		if err != nil {
			continue
		}
		out = append(out, WouldBlockDay{Day: t, WouldBlockCount: c})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Day.Before(out[j].Day) })
	return out
}
