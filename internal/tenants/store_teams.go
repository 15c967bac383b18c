package tenants

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

const teamCols = `org_id, id, name, unknown_users, weight, created_at, updated_at`

func scanTeam(row pgx.Row) (Team, error) {
	var t Team
	err := row.Scan(&t.OrgID, &t.ID, &t.Name, &t.UnknownUsers, &t.Weight, &t.CreatedAt, &t.UpdatedAt)
	return t, err
}

func fillTeams(ctx context.Context, q querier, orgID string, teams []Team) error {
	if len(teams) == 0 {
		return nil
	}
	ids := make([]string, len(teams))
	for i, t := range teams {
		ids[i] = t.ID
	}
	own, err := limitsOf(ctx, q, `SELECT team_id, `+ownLimitCols+` FROM team_limits
		WHERE org_id = $1 AND team_id = ANY($2) AND kind = 'team'`, orgID, ids)
	if err != nil {
		return err
	}
	defaults, err := limitsOf(ctx, q, `SELECT team_id, `+ownLimitCols+` FROM team_limits
		WHERE org_id = $1 AND team_id = ANY($2) AND kind = 'user_default'`, orgID, ids)
	if err != nil {
		return err
	}
	for i := range teams {
		teams[i].Limits = normalize(own[teams[i].ID])
		teams[i].UserLimits = normalize(defaults[teams[i].ID])
	}
	return nil
}

func getTeam(ctx context.Context, q querier, orgID, teamID string) (Team, error) {
	t, err := scanTeam(q.QueryRow(ctx, `SELECT `+teamCols+` FROM teams WHERE org_id = $1 AND id = $2`, orgID, teamID))
	if err != nil {
		return Team{}, translate(err, fmt.Sprintf("team %q of org %q", teamID, orgID))
	}
	ts := []Team{t}
	if err := fillTeams(ctx, q, orgID, ts); err != nil {
		return Team{}, err
	}
	return ts[0], nil
}

func writeTeamLimits(ctx context.Context, tx pgx.Tx, orgID, teamID, kind string, ls []vocab.Limit) error {
	return replaceLimits(ctx, tx,
		`DELETE FROM team_limits WHERE org_id = $1 AND team_id = $2 AND kind = $3`, []any{orgID, teamID, kind},
		`INSERT INTO team_limits (org_id, team_id, kind, metric, time_window, max_units, burst)
		 SELECT $1, $2, $3, * FROM unnest($4::text[], $5::text[], $6::bigint[], $7::bigint[])`, ls, false)
}

// monthSums returns, per metric, the sum of the month limits the query selects.
func monthSums(ctx context.Context, q querier, sql string, args ...any) (map[string]int64, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	var metric string
	var sum int64
	_, err = pgx.ForEachRow(rows, []any{&metric, &sum}, func() error {
		out[metric] = sum
		return nil
	})
	return out, err
}

// userAggregate summarizes the own limits of a team's registered users.
func userAggregate(ctx context.Context, q querier, orgID, teamID string) (childAggregate, error) {
	agg := newChildAggregate()
	rows, err := q.Query(ctx, `SELECT ul.user_id, ul.metric, ul.time_window, ul.max_units, coalesce(ul.burst, 0)
		FROM user_limits ul JOIN users u ON u.org_id = ul.org_id AND u.id = ul.user_id
		WHERE u.org_id = $1 AND u.team_id = $2`, orgID, teamID)
	if err != nil {
		return agg, err
	}
	var owner string
	var l vocab.Limit
	_, err = pgx.ForEachRow(rows, []any{&owner, &l.Metric, &l.Window, &l.Limit, &l.Burst}, func() error {
		agg.add(owner, l)
		return nil
	})
	return agg, err
}

// checkTeam applies the allocation rules to a team's new limits and user defaults:
// against its org, against the org's other teams, and against its own users.
func checkTeam(ctx context.Context, tx pgx.Tx, org Org, t Team, isNew bool) error {
	var others map[string]int64
	if !org.Oversubscribe {
		var err error
		others, err = monthSums(ctx, tx, `SELECT metric, sum(max_units)::bigint FROM team_limits
			WHERE org_id = $1 AND kind = 'team' AND time_window = 'month' AND team_id <> $2 GROUP BY metric`, org.ID, t.ID)
		if err != nil {
			return err
		}
	}
	vs := teamViolations(org, t, others)
	if !isNew {
		agg, err := userAggregate(ctx, tx, org.ID, t.ID)
		if err != nil {
			return err
		}
		vs = append(vs, parentCoversChildren("limits", t.Limits, fmt.Sprintf("team %q", t.ID), "user", agg, org.Oversubscribe)...)
	}
	return inMoney(ctx, tx, org.PlanID, allocErr(vs))
}

// teamViolations are the allocation rules a team's limits and user defaults break
// against its org, given the month limits the org's other teams hold per metric
// (others, read only when the org does not oversubscribe): the rules of a new team,
// which has no users yet.
func teamViolations(org Org, t Team, others map[string]int64) []Violation {
	teamLabel := fmt.Sprintf("team %q", t.ID)
	orgLabel := fmt.Sprintf("org %q", org.ID)
	vs := childWithinParent("limits", t.Limits, teamLabel, orgLabel, org.EffectiveLimits)
	if !org.Oversubscribe {
		vs = append(vs, sumWithinParent("limits", t.Limits, teamLabel, orgLabel, org.EffectiveLimits, others)...)
	}
	return append(vs, childWithinParent("user_limits", t.UserLimits, "user defaults of "+teamLabel, teamLabel, t.Limits)...)
}

// newTeam is the team in makes in org orgID, its limits normalized and its unset
// settings filled in; it has no times yet.
func newTeam(orgID string, in TeamInput) Team {
	if in.UnknownUsers == "" {
		in.UnknownUsers = UnknownUsersOrg
	}
	if in.Weight == 0 {
		in.Weight = 1
	}
	return Team{OrgID: orgID, ID: in.ID, Name: in.Name, Limits: normalize(in.Limits), UserLimits: normalize(in.UserLimits),
		UnknownUsers: in.UnknownUsers, Weight: in.Weight}
}

// asRequested is t with the limits and user defaults in the order in gave them, so
// that an allocation rule names the element of the request that breaks it.
func asRequested(t Team, in TeamInput) Team {
	t.Limits, t.UserLimits = in.Limits, in.UserLimits
	return t
}

// CreateTeam creates a team in an org, its allocation checked against the org's.
func (s *Service) CreateTeam(ctx context.Context, a Actor, orgID string, in TeamInput) (Team, error) {
	if err := in.Validate(); err != nil {
		return Team{}, err
	}
	var out Team
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		org, err := lockOrg(ctx, tx, orgID, s.now())
		if err != nil {
			return err
		}
		t := newTeam(orgID, in)
		if err := checkAllocatedMetrics(ctx, tx, org, fmt.Sprintf("team %q", in.ID),
			limitList{"limits", in.Limits}, limitList{"user_limits", in.UserLimits}); err != nil {
			return fmt.Errorf("create team %q: %w", in.ID, err)
		}
		if err := checkTeam(ctx, tx, org, asRequested(t, in), true); err != nil {
			return fmt.Errorf("create team %q: %w", in.ID, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO teams (org_id, id, name, unknown_users, weight) VALUES ($1, $2, $3, $4, $5)`,
			orgID, in.ID, in.Name, t.UnknownUsers, t.Weight); err != nil {
			return translate(err, fmt.Sprintf("create team %q", in.ID))
		}
		if err := writeTeamLimits(ctx, tx, orgID, in.ID, "team", t.Limits); err != nil {
			return err
		}
		if err := writeTeamLimits(ctx, tx, orgID, in.ID, "user_default", t.UserLimits); err != nil {
			return err
		}
		if out, err = getTeam(ctx, tx, orgID, in.ID); err != nil {
			return err
		}
		return audit(ctx, tx, a, orgID, "team.create", "team:"+in.ID, nil, out)
	})
	if err == nil {
		s.changed(orgID)
	}
	return out, err
}

// GetTeam returns a team of an org.
func (s *Service) GetTeam(ctx context.Context, orgID, teamID string) (Team, error) {
	return getTeam(ctx, s.pool, orgID, teamID)
}

// ListTeams returns one page of an org's teams ordered by id.
func (s *Service) ListTeams(ctx context.Context, orgID string, page Page) ([]Team, string, error) {
	if _, err := getOrg(ctx, s.pool, orgID, s.now()); err != nil {
		return nil, "", err
	}
	teams, next, err := listPage(ctx, s.pool, "teams", page, `SELECT `+teamCols+` FROM teams WHERE org_id = $1 AND id > $2 ORDER BY id LIMIT $3`,
		scanTeam, func(t Team) string { return t.ID }, orgID)
	if err == nil {
		err = fillTeams(ctx, s.pool, orgID, teams)
	}
	return teams, next, err
}

// UpdateTeam changes a team. New limits are checked against the org and the other
// teams, and must still cover the team's users.
func (s *Service) UpdateTeam(ctx context.Context, a Actor, orgID, teamID string, patch TeamPatch) (Team, error) {
	if err := patch.Validate(); err != nil {
		return Team{}, err
	}
	var out Team
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		org, err := lockOrg(ctx, tx, orgID, s.now())
		if err != nil {
			return err
		}
		before, err := getTeam(ctx, tx, orgID, teamID)
		if err != nil {
			return err
		}
		after := before
		if patch.Name != nil {
			after.Name = *patch.Name
		}
		if patch.Limits != nil {
			after.Limits = *patch.Limits
		}
		if patch.UserLimits != nil {
			after.UserLimits = *patch.UserLimits
		}
		if patch.UnknownUsers != nil {
			after.UnknownUsers = *patch.UnknownUsers
		}
		if patch.Weight != nil {
			after.Weight = *patch.Weight
		}
		if patch.Limits != nil || patch.UserLimits != nil {
			var set []limitList
			if patch.Limits != nil {
				set = append(set, limitList{"limits", *patch.Limits})
			}
			if patch.UserLimits != nil {
				set = append(set, limitList{"user_limits", *patch.UserLimits})
			}
			if err := checkAllocatedMetrics(ctx, tx, org, fmt.Sprintf("team %q", teamID), set...); err != nil {
				return fmt.Errorf("update team %q: %w", teamID, err)
			}
			if err := checkTeam(ctx, tx, org, after, false); err != nil {
				return fmt.Errorf("update team %q: %w", teamID, err)
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE teams SET name = $3, unknown_users = $4, weight = $5, updated_at = now() WHERE org_id = $1 AND id = $2`,
			orgID, teamID, after.Name, after.UnknownUsers, after.Weight); err != nil {
			return err
		}
		if patch.Limits != nil {
			if err := writeTeamLimits(ctx, tx, orgID, teamID, "team", normalize(after.Limits)); err != nil {
				return err
			}
		}
		if patch.UserLimits != nil {
			if err := writeTeamLimits(ctx, tx, orgID, teamID, "user_default", normalize(after.UserLimits)); err != nil {
				return err
			}
		}
		if out, err = getTeam(ctx, tx, orgID, teamID); err != nil {
			return err
		}
		return audit(ctx, tx, a, orgID, "team.update", "team:"+teamID, before, out)
	})
	if err == nil {
		s.changed(orgID)
	}
	return out, err
}

// DeleteTeam deletes a team with its users.
func (s *Service) DeleteTeam(ctx context.Context, a Actor, orgID, teamID string) error {
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := lockOrg(ctx, tx, orgID, s.now()); err != nil {
			return err
		}
		before, err := getTeam(ctx, tx, orgID, teamID)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM teams WHERE org_id = $1 AND id = $2`, orgID, teamID); err != nil {
			return err
		}
		return audit(ctx, tx, a, orgID, "team.delete", "team:"+teamID, before, nil)
	})
	if err == nil {
		s.changed(orgID)
	}
	return err
}
