package httpapi

import (
	"net/http"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Users of a team.

// CreateUser handles POST /v1/orgs/{org}/teams/{team}/users.
func (s *Server) CreateUser(w http.ResponseWriter, r *http.Request, org api.OrgPath, team api.TeamPath) {
	var in api.UserCreate
	if !decode(w, r, &in) {
		return
	}
	u, err := s.tenants.CreateUser(r.Context(), actor(r), org, team, toUserInput(in))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, fromUser(u))
}

// ListUsers handles GET /v1/orgs/{org}/teams/{team}/users.
func (s *Server) ListUsers(w http.ResponseWriter, r *http.Request, org api.OrgPath, team api.TeamPath, params api.ListUsersParams) {
	us, next, err := s.tenants.ListUsers(r.Context(), org, team, page(params.Limit, params.Cursor))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.UserList{Items: mapSlice(us, fromUser), NextCursor: nextPtr(next)})
}

// GetUser handles GET /v1/orgs/{org}/teams/{team}/users/{user}.
func (s *Server) GetUser(w http.ResponseWriter, r *http.Request, org api.OrgPath, team api.TeamPath, user api.UserPath) {
	u, err := s.tenants.GetUser(r.Context(), org, team, user)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fromUser(u))
}

// PatchUser handles PATCH /v1/orgs/{org}/teams/{team}/users/{user}.
func (s *Server) PatchUser(w http.ResponseWriter, r *http.Request, org api.OrgPath, team api.TeamPath, user api.UserPath) {
	var in api.UserPatch
	if !decode(w, r, &in) {
		return
	}
	u, err := s.tenants.UpdateUser(r.Context(), actor(r), org, team, user, tenants.UserPatch{Limits: toLimitsPtr(in.Limits)})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fromUser(u))
}

// DeleteUser handles DELETE /v1/orgs/{org}/teams/{team}/users/{user}.
func (s *Server) DeleteUser(w http.ResponseWriter, r *http.Request, org api.OrgPath, team api.TeamPath, user api.UserPath) {
	if err := s.tenants.DeleteUser(r.Context(), actor(r), org, team, user); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func toUserInput(in api.UserCreate) tenants.UserInput {
	return tenants.UserInput{ID: in.Id, Limits: optLimits(in.Limits)}
}

func fromUser(u tenants.User) api.User {
	return api.User{Id: u.ID, Org: u.OrgID, Team: u.TeamID, Limits: fromLimits(u.Limits), CreatedAt: u.CreatedAt, UpdatedAt: u.UpdatedAt}
}
