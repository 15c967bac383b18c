package tenants

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ResolvedOrg is what the check path needs of an org: its settings and effective
// limits, its plan's fail mode and pool, the metrics it knows, and its teams with
// their limits and user defaults.
type ResolvedOrg struct {
	Org      Org
	FailMode FailMode
	Pool     string
	Teams    map[string]Team
	Metrics  MetricSet // a check of any other metric is refused
}

// ResolvedUser is a user id of an org as the check path sees it. Unregistered ids
// are valid: they get their team's user defaults.
type ResolvedUser struct {
	Registered bool
	TeamID     string
	Limits     []Limit // the user's own limits, without the team defaults
}

// ResolveOrg loads an org with everything a check needs, except its users.
func (s *Service) ResolveOrg(ctx context.Context, orgID string) (ResolvedOrg, error) {
	org, err := getOrg(ctx, s.pool, orgID)
	if err != nil {
		return ResolvedOrg{}, err
	}
	r := ResolvedOrg{Org: org, Teams: map[string]Team{}}
	var metered, priced []string
	if err := s.pool.QueryRow(ctx, `SELECT fail_mode, pool, `+planMetricCols+` FROM plans WHERE id = $1`, org.PlanID).Scan(&r.FailMode, &r.Pool, &metered, &priced); err != nil {
		return ResolvedOrg{}, fmt.Errorf("resolve org %q: plan: %w", orgID, err)
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
	return r, nil
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
