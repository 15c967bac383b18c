package tenants

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

const userCols = `org_id, team_id, id, created_at, updated_at`

func scanUser(row pgx.Row) (User, error) {
	var u User
	err := row.Scan(&u.OrgID, &u.TeamID, &u.ID, &u.CreatedAt, &u.UpdatedAt)
	return u, err
}

func fillUsers(ctx context.Context, q querier, orgID string, users []User) error {
	if len(users) == 0 {
		return nil
	}
	ids := make([]string, len(users))
	for i, u := range users {
		ids[i] = u.ID
	}
	own, err := limitsOf(ctx, q, `SELECT user_id, `+ownLimitCols+` FROM user_limits
		WHERE org_id = $1 AND user_id = ANY($2)`, orgID, ids)
	if err != nil {
		return err
	}
	for i := range users {
		users[i].Limits = normalize(own[users[i].ID])
	}
	return nil
}

// getUser returns a registered user of a team; a user of another team is not found.
func getUser(ctx context.Context, q querier, orgID, teamID, userID string) (User, error) {
	u, err := scanUser(q.QueryRow(ctx, `SELECT `+userCols+` FROM users WHERE org_id = $1 AND team_id = $2 AND id = $3`,
		orgID, teamID, userID))
	if err != nil {
		return User{}, translate(err, fmt.Sprintf("user %q of team %q", userID, teamID))
	}
	us := []User{u}
	if err := fillUsers(ctx, q, orgID, us); err != nil {
		return User{}, err
	}
	return us[0], nil
}

// checkUser applies the allocation rules to a user's own limits: against its team and
// the team's other users.
func checkUser(ctx context.Context, tx pgx.Tx, org Org, team Team, userID string, limits []vocab.Limit) error {
	userLabel := fmt.Sprintf("user %q", userID)
	teamLabel := fmt.Sprintf("team %q", team.ID)
	vs := childWithinParent("limits", limits, userLabel, teamLabel, team.Limits)
	if !org.Oversubscribe {
		others, err := monthSums(ctx, tx, `SELECT ul.metric, sum(ul.max_units)::bigint
			FROM user_limits ul JOIN users u ON u.org_id = ul.org_id AND u.id = ul.user_id
			WHERE u.org_id = $1 AND u.team_id = $2 AND ul.time_window = 'month' AND u.id <> $3
			GROUP BY ul.metric`, org.ID, team.ID, userID)
		if err != nil {
			return err
		}
		vs = append(vs, sumWithinParent("limits", limits, userLabel, teamLabel, team.Limits, others)...)
	}
	return inMoney(ctx, tx, org.PlanID, allocErr(vs))
}

func writeUserLimits(ctx context.Context, tx pgx.Tx, orgID, userID string, ls []vocab.Limit) error {
	return replaceLimits(ctx, tx, `DELETE FROM user_limits WHERE org_id = $1 AND user_id = $2`, []any{orgID, userID},
		`INSERT INTO user_limits (org_id, user_id, metric, time_window, max_units, burst)
		 SELECT $1, $2, * FROM unnest($3::text[], $4::text[], $5::bigint[], $6::bigint[])`, ls, false)
}

// CreateUser registers a user in a team. User ids are unique within the org.
func (s *Service) CreateUser(ctx context.Context, a Actor, orgID, teamID string, in UserInput) (User, error) {
	if err := in.Validate(); err != nil {
		return User{}, err
	}
	var out User
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		org, err := lockOrg(ctx, tx, orgID, s.now())
		if err != nil {
			return err
		}
		team, err := getTeam(ctx, tx, orgID, teamID)
		if err != nil {
			return err
		}
		if err := checkAllocatedMetrics(ctx, tx, org, fmt.Sprintf("user %q", in.ID), limitList{"limits", in.Limits}); err != nil {
			return fmt.Errorf("create user %q: %w", in.ID, err)
		}
		if err := checkUser(ctx, tx, org, team, in.ID, in.Limits); err != nil {
			return fmt.Errorf("create user %q: %w", in.ID, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO users (org_id, team_id, id) VALUES ($1, $2, $3)`, orgID, teamID, in.ID); err != nil {
			return translate(err, fmt.Sprintf("create user %q", in.ID))
		}
		if err := writeUserLimits(ctx, tx, orgID, in.ID, normalize(in.Limits)); err != nil {
			return err
		}
		if out, err = getUser(ctx, tx, orgID, teamID, in.ID); err != nil {
			return err
		}
		return audit(ctx, tx, a, orgID, "user.create", "user:"+in.ID, nil, out)
	})
	if err == nil {
		s.changed(orgID)
	}
	return out, err
}

// GetUser returns a registered user of a team.
func (s *Service) GetUser(ctx context.Context, orgID, teamID, userID string) (User, error) {
	return getUser(ctx, s.pool, orgID, teamID, userID)
}

// ListUsers returns one page of a team's registered users ordered by id.
func (s *Service) ListUsers(ctx context.Context, orgID, teamID string, page Page) ([]User, string, error) {
	if _, err := getTeam(ctx, s.pool, orgID, teamID); err != nil {
		return nil, "", err
	}
	users, next, err := listPage(ctx, s.pool, "users", page, `SELECT `+userCols+` FROM users
		WHERE org_id = $1 AND team_id = $2 AND id > $3 ORDER BY id LIMIT $4`,
		scanUser, func(u User) string { return u.ID }, orgID, teamID)
	if err == nil {
		err = fillUsers(ctx, s.pool, orgID, users)
	}
	return users, next, err
}

// UpdateUser replaces a user's own limits.
func (s *Service) UpdateUser(ctx context.Context, a Actor, orgID, teamID, userID string, patch UserPatch) (User, error) {
	if err := patch.Validate(); err != nil {
		return User{}, err
	}
	var out User
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		org, err := lockOrg(ctx, tx, orgID, s.now())
		if err != nil {
			return err
		}
		team, err := getTeam(ctx, tx, orgID, teamID)
		if err != nil {
			return err
		}
		before, err := getUser(ctx, tx, orgID, teamID, userID)
		if err != nil {
			return err
		}
		if patch.Limits != nil {
			if err := checkAllocatedMetrics(ctx, tx, org, fmt.Sprintf("user %q", userID), limitList{"limits", *patch.Limits}); err != nil {
				return fmt.Errorf("update user %q: %w", userID, err)
			}
			if err := checkUser(ctx, tx, org, team, userID, *patch.Limits); err != nil {
				return fmt.Errorf("update user %q: %w", userID, err)
			}
			if err := writeUserLimits(ctx, tx, orgID, userID, normalize(*patch.Limits)); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE users SET updated_at = now() WHERE org_id = $1 AND id = $2`, orgID, userID); err != nil {
			return err
		}
		if out, err = getUser(ctx, tx, orgID, teamID, userID); err != nil {
			return err
		}
		return audit(ctx, tx, a, orgID, "user.update", "user:"+userID, before, out)
	})
	if err == nil {
		s.changed(orgID)
	}
	return out, err
}

// DeleteUser removes a registered user; the id then gets the team's user defaults again.
func (s *Service) DeleteUser(ctx context.Context, a Actor, orgID, teamID, userID string) error {
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := lockOrg(ctx, tx, orgID, s.now()); err != nil {
			return err
		}
		before, err := getUser(ctx, tx, orgID, teamID, userID)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM users WHERE org_id = $1 AND id = $2`, orgID, userID); err != nil {
			return err
		}
		return audit(ctx, tx, a, orgID, "user.delete", "user:"+userID, before, nil)
	})
	if err == nil {
		s.changed(orgID)
	}
	return err
}
