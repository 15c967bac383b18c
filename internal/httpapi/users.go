package httpapi

import (
	"net/http"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Users of a team.

// CreateUser handles POST /v1/orgs/{org}/teams/{team}/users.
func (s *Server) CreateUser(w http.ResponseWriter, r *http.Request, org api.OrgPath, team api.TeamPath) {
	handle(s, w, r, http.StatusCreated, fromUser, func(in api.UserCreate) (tenants.User, error) {
		return s.tenants.CreateUser(r.Context(), actor(r), org, team, toUserInput(in))
	})
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
	respond(s, w, r, http.StatusOK, fromUser, u, err)
}

// PatchUser handles PATCH /v1/orgs/{org}/teams/{team}/users/{user}.
func (s *Server) PatchUser(w http.ResponseWriter, r *http.Request, org api.OrgPath, team api.TeamPath, user api.UserPath) {
	handle(s, w, r, http.StatusOK, fromUser, func(in api.UserPatch) (tenants.User, error) {
		return s.tenants.UpdateUser(r.Context(), actor(r), org, team, user, tenants.UserPatch{Limits: toLimitsPtr(in.Limits)})
	})
}

// DeleteUser handles DELETE /v1/orgs/{org}/teams/{team}/users/{user}.
func (s *Server) DeleteUser(w http.ResponseWriter, r *http.Request, org api.OrgPath, team api.TeamPath, user api.UserPath) {
	s.noContent(w, r, s.tenants.DeleteUser(r.Context(), actor(r), org, team, user))
}

func toUserInput(in api.UserCreate) tenants.UserInput {
	return tenants.UserInput{ID: in.Id, Limits: optLimits(in.Limits)}
}

func fromUser(u tenants.User) api.User {
	return api.User{Id: u.ID, Org: u.OrgID, Team: u.TeamID, Limits: fromLimits(u.Limits), CreatedAt: u.CreatedAt, UpdatedAt: u.UpdatedAt}
}
