package httpapi

import (
	"net/http"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Console users of an org.

// CreateConsoleUser handles POST /v1/orgs/{org}/console-users.
func (s *Server) CreateConsoleUser(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	var in api.ConsoleUserCreate
	if !decode(w, r, &in) {
		return
	}
	u, err := s.tenants.CreateConsoleUser(r.Context(), actor(r), org,
		tenants.ConsoleUserInput{Email: in.Email, Password: in.Password, Role: tenants.Role(in.Role)})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, fromConsoleUser(u))
}

// ListConsoleUsers handles GET /v1/orgs/{org}/console-users.
func (s *Server) ListConsoleUsers(w http.ResponseWriter, r *http.Request, org api.OrgPath, params api.ListConsoleUsersParams) {
	us, next, err := s.tenants.ListConsoleUsers(r.Context(), org, page(params.Limit, params.Cursor))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.ConsoleUserList{Items: mapSlice(us, fromConsoleUser), NextCursor: nextPtr(next)})
}

// GetConsoleUser handles GET /v1/orgs/{org}/console-users/{id}.
func (s *Server) GetConsoleUser(w http.ResponseWriter, r *http.Request, org api.OrgPath, id api.ConsoleUserPath) {
	u, err := s.tenants.GetConsoleUser(r.Context(), org, id)
	respond(s, w, r, http.StatusOK, fromConsoleUser, u, err)
}

// DeleteConsoleUser handles DELETE /v1/orgs/{org}/console-users/{id}.
func (s *Server) DeleteConsoleUser(w http.ResponseWriter, r *http.Request, org api.OrgPath, id api.ConsoleUserPath) {
	s.noContent(w, r, s.tenants.DeleteConsoleUser(r.Context(), actor(r), org, id))
}

func fromConsoleUser(u tenants.ConsoleUser) api.ConsoleUser {
	return api.ConsoleUser{Id: u.ID, Email: u.Email, Role: api.ConsoleRole(u.Role), CreatedAt: u.CreatedAt}
}
