package httpapi

import (
	"net/http"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Teams of an org.

// CreateTeam handles POST /v1/orgs/{org}/teams.
func (s *Server) CreateTeam(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	handle(s, w, r, http.StatusCreated, fromTeam, func(in api.TeamCreate) (tenants.Team, error) {
		return s.tenants.CreateTeam(r.Context(), actor(r), org, toTeamInput(in))
	})
}

// ListTeams handles GET /v1/orgs/{org}/teams.
func (s *Server) ListTeams(w http.ResponseWriter, r *http.Request, org api.OrgPath, params api.ListTeamsParams) {
	ts, next, err := s.tenants.ListTeams(r.Context(), org, page(params.Limit, params.Cursor))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.TeamList{Items: mapSlice(ts, fromTeam), NextCursor: nextPtr(next)})
}

// GetTeam handles GET /v1/orgs/{org}/teams/{team}.
func (s *Server) GetTeam(w http.ResponseWriter, r *http.Request, org api.OrgPath, team api.TeamPath) {
	t, err := s.tenants.GetTeam(r.Context(), org, team)
	respond(s, w, r, http.StatusOK, fromTeam, t, err)
}

// PatchTeam handles PATCH /v1/orgs/{org}/teams/{team}.
func (s *Server) PatchTeam(w http.ResponseWriter, r *http.Request, org api.OrgPath, team api.TeamPath) {
	handle(s, w, r, http.StatusOK, fromTeam, func(in api.TeamPatch) (tenants.Team, error) {
		return s.tenants.UpdateTeam(r.Context(), actor(r), org, team, toTeamPatch(in))
	})
}

// DeleteTeam handles DELETE /v1/orgs/{org}/teams/{team}, with the team's users.
func (s *Server) DeleteTeam(w http.ResponseWriter, r *http.Request, org api.OrgPath, team api.TeamPath) {
	s.noContent(w, r, s.tenants.DeleteTeam(r.Context(), actor(r), org, team))
}

func toTeamInput(in api.TeamCreate) tenants.TeamInput {
	t := tenants.TeamInput{ID: in.Id, Name: in.Name, Limits: optLimits(in.Limits), UserLimits: optLimits(in.UserLimits)}
	if in.Weight != nil {
		t.Weight = *in.Weight
	}
	if in.UnknownUsers != nil {
		t.UnknownUsers = tenants.UnknownUsers(*in.UnknownUsers)
	}
	return t
}

func toTeamPatch(in api.TeamPatch) tenants.TeamPatch {
	p := tenants.TeamPatch{Name: in.Name, Limits: toLimitsPtr(in.Limits), UserLimits: toLimitsPtr(in.UserLimits), Weight: in.Weight}
	if in.UnknownUsers != nil {
		u := tenants.UnknownUsers(*in.UnknownUsers)
		p.UnknownUsers = &u
	}
	return p
}

func fromTeam(t tenants.Team) api.Team {
	out := api.Team{Id: t.ID, Org: t.OrgID, Name: t.Name, Limits: fromLimits(t.Limits), UserLimits: fromLimits(t.UserLimits),
		Weight: &t.Weight, CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt}
	if t.UnknownUsers != "" {
		u := api.TeamUnknownUsers(t.UnknownUsers)
		out.UnknownUsers = &u
	}
	return out
}
