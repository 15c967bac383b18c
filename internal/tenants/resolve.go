package tenants

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// DefaultMaxOrgUsers is how many registered users ResolveOrg carries with an org: an
// org with more is resolved without them, and its user ids are looked up one by one.
const DefaultMaxOrgUsers = 20_000

// ResolvedOrg is what the check path needs of an org: its settings and effective
// limits, its plan's fail mode and pool, the metrics it knows, its teams with their
// limits and user defaults, and (up to a bound) its registered users.
type ResolvedOrg struct {
	Org      Org
	FailMode vocab.FailMode
	Pool     string
	// Leases is LeasesAuto or LeasesOff: the org's own setting, or its plan's when the
	// org follows its plan.
	Leases Leases
	// SlidingWindows is WindowsEstimate or WindowsPrecise: the org's own setting, or
	// its plan's when the org follows its plan.
	SlidingWindows SlidingWindows
	Teams          map[string]Team
	Metrics        MetricSet // a check of any other metric is refused
	// Users are the org's registered users by id when UsersComplete: then an id that
	// is not in it is unregistered, known without a query. An org above the bound
	// has UsersComplete false and Users nil.
	Users         map[string]ResolvedUser
	UsersComplete bool
	// Throttles are the org's own and its plan's that had not expired when it was
	// resolved; ThrottleOf picks the one a check applies, by the check's clock.
	Throttles []Throttle
}

// RouteOf is where and how the checks of org o, on plan p, run: the org's dedicated
// Redis, else its plan's pool class, with the plan's fail mode. It is the one place an
// org's route is built; the check path takes it from ResolvedOrg.Route, billing from
// the org and its plan (a zero Plan when the plan cannot be read: the default pool).
func RouteOf(o Org, p Plan) vocab.Route {
	return vocab.Route{Pool: p.Pool, RedisURL: o.RedisURL, FailMode: p.FailMode, Plan: o.PlanID}
}

// Route is the route of the resolved org: RouteOf the org and its plan's pool and fail
// mode.
func (r ResolvedOrg) Route() vocab.Route {
	return RouteOf(r.Org, Plan{Pool: r.Pool, FailMode: r.FailMode})
}

// User returns what the org snapshot knows of a user id, and whether it knows it:
// false when the org was resolved without its users (above the bound).
func (r ResolvedOrg) User(userID string) (ResolvedUser, bool) {
	if !r.UsersComplete {
		return ResolvedUser{}, false
	}
	return r.Users[userID], true
}

// ResolvedUser is a user id of an org as the check path sees it. Unregistered ids
// are valid: they get their team's user defaults.
type ResolvedUser struct {
	Registered bool
	TeamID     string
	Limits     []vocab.Limit // the user's own limits, without the team defaults
}

// ResolveOrg loads an org with everything a check needs, and its registered users
// when it has at most DefaultMaxOrgUsers.
func (s *Service) ResolveOrg(ctx context.Context, orgID string) (ResolvedOrg, error) {
	return s.ResolveOrgUsers(ctx, orgID, DefaultMaxOrgUsers)
}

// ResolveOrgUsers is ResolveOrg carrying the org's registered users when it has at
// most maxUsers of them (0: never).
func (s *Service) ResolveOrgUsers(ctx context.Context, orgID string, maxUsers int) (ResolvedOrg, error) {
	org, err := getOrg(ctx, s.pool, orgID, s.now())
	if err != nil {
		return ResolvedOrg{}, err
	}
	r := ResolvedOrg{Org: org, Teams: map[string]Team{}}
	var metered, priced []string
	if err := s.pool.QueryRow(ctx, `SELECT fail_mode, pool, leases, sliding_windows, `+planMetricCols+` FROM plans WHERE id = $1`, org.PlanID).Scan(&r.FailMode, &r.Pool, &r.Leases, &r.SlidingWindows, &metered, &priced); err != nil {
		return ResolvedOrg{}, fmt.Errorf("resolve org %q: plan: %w", orgID, err)
	}
	if org.Leases != LeasesPlan && org.Leases != "" {
		r.Leases = org.Leases
	}
	if org.SlidingWindows != WindowsPlan && org.SlidingWindows != "" {
		r.SlidingWindows = org.SlidingWindows
	}
	r.Metrics = NewMetricSet(limitMetrics(org.EffectiveLimits), priced, metered)
	rows, err := s.pool.Query(ctx, `SELECT `+teamCols+` FROM teams WHERE org_id = $1`, orgID)
	if err != nil {
		return ResolvedOrg{}, fmt.Errorf("resolve org %q: %w", orgID, err)
	}
	teams, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Team, error) { return scanTeam(r) })
	if err != nil {
		return ResolvedOrg{}, fmt.Errorf("resolve org %q: %w", orgID, err)
	}
	if err := fillTeams(ctx, s.pool, orgID, teams); err != nil {
		return ResolvedOrg{}, fmt.Errorf("resolve org %q: %w", orgID, err)
	}
	for _, t := range teams {
		r.Teams[t.ID] = t
	}
	if r.Throttles, err = resolveThrottles(ctx, s.pool, orgID, org.PlanID); err != nil {
		return ResolvedOrg{}, fmt.Errorf("resolve org %q: throttles: %w", orgID, err)
	}
	if maxUsers > 0 {
		if r.Users, err = orgUsers(ctx, s.pool, orgID, maxUsers); err != nil {
			return ResolvedOrg{}, fmt.Errorf("resolve org %q: users: %w", orgID, err)
		}
		r.UsersComplete = r.Users != nil
	}
	return r, nil
}

// orgUsers returns every registered user of an org with its own limits, or nil when
// the org has more than max of them.
func orgUsers(ctx context.Context, q querier, orgID string, max int) (map[string]ResolvedUser, error) {
	rows, err := q.Query(ctx, `SELECT id, team_id FROM users WHERE org_id = $1 LIMIT $2`, orgID, max+1)
	if err != nil {
		return nil, err
	}
	users := map[string]ResolvedUser{}
	var id, team string
	_, err = pgx.ForEachRow(rows, []any{&id, &team}, func() error {
		users[id] = ResolvedUser{Registered: true, TeamID: team}
		return nil
	})
	if err != nil || len(users) > max {
		return nil, err
	}
	own, err := limitsOf(ctx, q, `SELECT user_id, metric, time_window, max_units FROM user_limits WHERE org_id = $1`, orgID)
	if err != nil {
		return nil, err
	}
	for id, ls := range own {
		if u, ok := users[id]; ok {
			u.Limits = ls
			users[id] = u
		}
	}
	return users, nil
}

// ResolveUser looks a user id of an org up; an unregistered id is not an error.
func (s *Service) ResolveUser(ctx context.Context, orgID, userID string) (ResolvedUser, error) {
	u, err := scanUser(s.pool.QueryRow(ctx, `SELECT `+userCols+` FROM users WHERE org_id = $1 AND id = $2`, orgID, userID))
	if errors.Is(err, pgx.ErrNoRows) {
		return ResolvedUser{}, nil
	}
	if err != nil {
		return ResolvedUser{}, fmt.Errorf("resolve user %q: %w", userID, err)
	}
	us := []User{u}
	if err := fillUsers(ctx, s.pool, orgID, us); err != nil {
		return ResolvedUser{}, fmt.Errorf("resolve user %q: %w", userID, err)
	}
	return ResolvedUser{Registered: true, TeamID: u.TeamID, Limits: us[0].Limits}, nil
}
