package httpapi

import (
	"net/http"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Teams of an org.

// CreateTeam handles POST /v1/orgs/{org}/teams.
func (s *Server) CreateTeam(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	var in api.TeamCreate
	if !decode(w, r, &in) {
		return
	}
	t, err := s.tenants.CreateTeam(r.Context(), actor(r), org, toTeamInput(in))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, fromTeam(t))
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
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fromTeam(t))
}

// PatchTeam handles PATCH /v1/orgs/{org}/teams/{team}.
func (s *Server) PatchTeam(w http.ResponseWriter, r *http.Request, org api.OrgPath, team api.TeamPath) {
	var in api.TeamPatch
	if !decode(w, r, &in) {
		return
	}
	t, err := s.tenants.UpdateTeam(r.Context(), actor(r), org, team, toTeamPatch(in))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fromTeam(t))
}

// DeleteTeam handles DELETE /v1/orgs/{org}/teams/{team}, with the team's users.
func (s *Server) DeleteTeam(w http.ResponseWriter, r *http.Request, org api.OrgPath, team api.TeamPath) {
	if err := s.tenants.DeleteTeam(r.Context(), actor(r), org, team); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func toTeamInput(in api.TeamCreate) tenants.TeamInput {
	return tenants.TeamInput{ID: in.Id, Name: in.Name, Limits: optLimits(in.Limits), UserLimits: optLimits(in.UserLimits)}
}

func toTeamPatch(in api.TeamPatch) tenants.TeamPatch {
	return tenants.TeamPatch{Name: in.Name, Limits: toLimitsPtr(in.Limits), UserLimits: toLimitsPtr(in.UserLimits)}
}

func fromTeam(t tenants.Team) api.Team {
	return api.Team{Id: t.ID, Org: t.OrgID, Name: t.Name, Limits: fromLimits(t.Limits), UserLimits: fromLimits(t.UserLimits),
		CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt}
}
