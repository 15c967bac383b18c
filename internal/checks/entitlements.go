package checks

import (
	"context"
	"fmt"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Entitlements is the answer of GET /v1/entitlements: the org's resolved features,
// for the team and user asked about (the registered user's team when none was named).
type Entitlements struct {
	Org, Team, User string
	tenants.Entitlements
}

// Entitlements resolves the features of org for team and user (both optional, ""
// when absent) from the resolved-org cache, as a check resolves its limits: no
// Postgres query once the org and the caller's key are warm, and the org's changes
// arrive as its limits' do. The caller is authorized as for a check (another org is
// not found); team and user are resolved as a check resolves them: an unknown team
// is not found, a registered user's team may be omitted and may not differ. Errors:
// derrors Invalid, NotFound, Forbidden, Unavailable.
func (s *Service) Entitlements(ctx context.Context, c Caller, org, team, user string) (Entitlements, error) {
	switch {
	case org == "":
		return Entitlements{}, derrors.Field("org", msgRequired)
	case !vocab.ValidID(org):
		return Entitlements{}, derrors.Field("org", idMsg)
	case team != "" && !vocab.ValidID(team):
		return Entitlements{}, derrors.Field("team", idMsg)
	case user != "" && !vocab.ValidID(user):
		return Entitlements{}, derrors.Field("user", idMsg)
	}
	if err := c.Authorize(org); err != nil {
		return Entitlements{}, err
	}
	o, err := s.org(ctx, org)
	if err != nil {
		return Entitlements{}, err
	}
	if user != "" {
		u, err := s.cache.User(ctx, o, user)
		if err != nil {
			return Entitlements{}, derrors.E(derrors.Unavailable, "the tenancy store is unavailable; retry shortly", err)
		}
		switch {
		case u.Registered && team == "":
			team = u.TeamID
		case u.Registered && team != u.TeamID:
			return Entitlements{}, derrors.Field("team", fmt.Sprintf("user %q is registered in team %q", user, u.TeamID))
		}
	}
	if team != "" {
		if _, ok := o.Teams[team]; !ok {
			return Entitlements{}, derrors.E(derrors.NotFound, fmt.Sprintf("team %q of org %q not found", team, org), nil)
		}
	}
	return Entitlements{Org: org, Team: team, User: user, Entitlements: o.Entitlements}, nil
}
