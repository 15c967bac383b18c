package billing

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Would-block records (quota's wouldblock.go): the api's engines keep them in Redis,
// the Flusher copies them into would_block (migration 000011) whenever their version
// changed, and Service.WouldBlock reports them, stored and live.

// flushWouldBlock copies org's would-block record of period into Postgres when its
// epoch or version changed since the last copy. A record written while it was read
// is copied again next time (its version was read first).
func (f *Flusher) flushWouldBlock(ctx context.Context, cs Counters, org, period string, seen map[string]string) error {
	epoch, version, err := cs.WouldBlockVersion(ctx, org, period)
	if err != nil || epoch == "" {
		return err
	}
	mark := fmt.Sprintf("%s:%d", epoch, version)
	f.mu.Lock()
	done := f.wbSeen[org][period] == mark
	f.mu.Unlock()
	if done {
		seen[period] = mark
		return nil
	}
	rec, err := cs.WouldBlock(ctx, org, period)
	if err != nil {
		return err
	}
	if err := f.cfg.Store.PersistWouldBlock(ctx, org, period, rec); err != nil {
		return err
	}
	seen[period] = fmt.Sprintf("%s:%d", rec.Epoch, rec.Version)
	return nil
}

// PersistWouldBlock raises the stored would-block counts of org in period to rec's
// (GREATEST: a stale or repeated write changes nothing), under rec's epoch.
func (s *Store) PersistWouldBlock(ctx context.Context, org, period string, rec quota.WouldBlockRecord) error {
	if len(rec.Counts) == 0 {
		return nil
	}
	keys := make([]quota.WouldBlockKey, 0, len(rec.Counts))
	for k := range rec.Counts {
		keys = append(keys, k)
	}
	// One order everywhere, so concurrent upserts lock rows in the same order.
	slices.SortFunc(keys, wbCompare)
	n := len(keys)
	metrics, levels, teams, users, wins, days := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	checks, units := make([]int64, n), make([]int64, n)
	for i, k := range keys {
		c := rec.Counts[k]
		metrics[i], levels[i], teams[i], users[i], wins[i], days[i] = k.Metric, string(k.Level), k.Team, k.User, string(k.Window), k.Day
		checks[i], units[i] = c.Checks, c.Units
	}
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO would_block (org_id, period, epoch, metric, level, team_id, user_id, win, day, checks, units)
			SELECT $1, $2, $3, m, l, t, u, w, d::date, c, n
			FROM unnest($4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::bigint[], $11::bigint[]) AS x(m, l, t, u, w, d, c, n)
			ON CONFLICT (org_id, period, epoch, metric, level, team_id, user_id, win, day) DO UPDATE
			SET checks = GREATEST(would_block.checks, EXCLUDED.checks), units = GREATEST(would_block.units, EXCLUDED.units), updated_at = now()
			WHERE would_block.checks < EXCLUDED.checks OR would_block.units < EXCLUDED.units`,
			org, period, rec.Epoch, metrics, levels, teams, users, wins, days, checks, units)
		return err
	})
	if err != nil {
		return fmt.Errorf("persist would-block record of %s %s: %w", org, period, err)
	}
	return nil
}

func wbCompare(a, b quota.WouldBlockKey) int {
	return cmp.Or(cmp.Compare(a.Metric, b.Metric), cmp.Compare(a.Level, b.Level), cmp.Compare(a.Team, b.Team),
		cmp.Compare(a.User, b.User), cmp.Compare(a.Window, b.Window), cmp.Compare(a.Day, b.Day))
}

// StoredWouldBlock reads the stored would-block counts of org in period by epoch.
func (s *Store) StoredWouldBlock(ctx context.Context, org, period string) (map[string]map[quota.WouldBlockKey]quota.WouldBlockCount, error) {
	rows, err := s.pool.Query(ctx, `SELECT epoch, metric, level, team_id, user_id, win, to_char(day, 'YYYY-MM-DD'), checks, units
		FROM would_block WHERE org_id = $1 AND period = $2`, org, period)
	if err != nil {
		return nil, fmt.Errorf("would-block record of %s %s: %w", org, period, err)
	}
	out := map[string]map[quota.WouldBlockKey]quota.WouldBlockCount{}
	var epoch, level, win string
	var k quota.WouldBlockKey
	var c quota.WouldBlockCount
	_, err = pgx.ForEachRow(rows, []any{&epoch, &k.Metric, &level, &k.Team, &k.User, &win, &k.Day, &c.Checks, &c.Units}, func() error {
		k.Level, k.Window = vocab.Level(level), vocab.Window(win)
		if out[epoch] == nil {
			out[epoch] = map[quota.WouldBlockKey]quota.WouldBlockCount{}
		}
		out[epoch][k] = c
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("would-block record of %s %s: %w", org, period, err)
	}
	return out, nil
}

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
// Errors: ErrInvalid for a bad period; tenants.ErrNotFound for an unknown org.
func (s *Service) WouldBlock(ctx context.Context, org, period string) (WouldBlockReport, error) {
	o, err := s.Tenants.GetOrg(ctx, org)
	if err != nil {
		return WouldBlockReport{}, err
	}
	per := vocab.PeriodAt(s.now(), o.BillingAnchorDay)
	if period != "" {
		if per, err = PeriodOf(period, o.BillingAnchorDay); err != nil {
			return WouldBlockReport{}, err
		}
	}
	stored, err := s.Store.StoredWouldBlock(ctx, org, per.ID)
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
