package httpapi

import (
	"fmt"
	"net/http"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Plans (operator).

// CreatePlan handles POST /v1/plans.
func (s *Server) CreatePlan(w http.ResponseWriter, r *http.Request) {
	var in api.PlanCreate
	if !requireOperator(w, r) || !decode(w, r, &in) {
		return
	}
	p, err := s.tenants.CreatePlan(r.Context(), actor(r), toPlanInput(in))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, fromPlan(p))
}

// ListPlans handles GET /v1/plans.
func (s *Server) ListPlans(w http.ResponseWriter, r *http.Request, params api.ListPlansParams) {
	if !requireOperator(w, r) {
		return
	}
	ps, next, err := s.tenants.ListPlans(r.Context(), page(params.Limit, params.Cursor))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.PlanList{Items: mapSlice(ps, fromPlan), NextCursor: nextPtr(next)})
}

// GetPlan handles GET /v1/plans/{plan}.
func (s *Server) GetPlan(w http.ResponseWriter, r *http.Request, plan api.PlanPath) {
	if !requireOperator(w, r) {
		return
	}
	p, err := s.tenants.GetPlan(r.Context(), plan)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fromPlan(p))
}

// PatchPlan handles PATCH /v1/plans/{plan}.
func (s *Server) PatchPlan(w http.ResponseWriter, r *http.Request, plan api.PlanPath) {
	var in api.PlanPatch
	if !requireOperator(w, r) {
		return
	}
	b, ok := readBody(w, r)
	if !ok {
		return
	}
	if err := decodeBytes(b, &in); err != nil {
		refuse(w, r, err)
		return
	}
	patch := toPlanPatch(in)
	patch.RemovePricing = sentNull(b, "pricing") // the generated type reads null as absent
	p, err := s.tenants.UpdatePlan(r.Context(), actor(r), plan, patch)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fromPlan(p))
}

// Orgs.

// CreateOrg handles POST /v1/orgs (operator).
func (s *Server) CreateOrg(w http.ResponseWriter, r *http.Request) {
	var in api.OrgCreate
	if !requireOperator(w, r) || !decode(w, r, &in) {
		return
	}
	o, err := s.tenants.CreateOrg(r.Context(), actor(r), toOrgInput(in))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, fromOrg(o))
}

// ListOrgs handles GET /v1/orgs (operator).
func (s *Server) ListOrgs(w http.ResponseWriter, r *http.Request, params api.ListOrgsParams) {
	if !requireOperator(w, r) {
		return
	}
	os, next, err := s.tenants.ListOrgs(r.Context(), page(params.Limit, params.Cursor))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.OrgList{Items: mapSlice(os, fromOrg), NextCursor: nextPtr(next)})
}

// GetOrg handles GET /v1/orgs/{org}.
func (s *Server) GetOrg(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	if !requireOrg(w, r, org, tenants.ScopeAdmin) {
		return
	}
	o, err := s.tenants.GetOrg(r.Context(), org)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fromOrg(o))
}

// PatchOrg handles PATCH /v1/orgs/{org}. plan, limits, redis_url and
// billing_anchor_day are the operator's alone.
func (s *Server) PatchOrg(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	var in api.OrgPatch
	if !requireOrg(w, r, org, tenants.ScopeAdmin) || !decode(w, r, &in) {
		return
	}
	patch := toOrgPatch(in)
	if f := patch.OperatorOnly(); len(f) > 0 && !callerOf(r).operator {
		errs := make([]FieldError, len(f))
		for i, name := range f {
			errs[i] = FieldError{Field: name, Message: "only the operator may change this field"}
		}
		refuse(w, r, derrors.E(derrors.Forbidden, fmt.Sprintf("only the operator may change %v", f), nil, errs...))
		return
	}
	o, err := s.tenants.UpdateOrg(r.Context(), actor(r), org, patch)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fromOrg(o))
}

// API keys.

// CreateApiKey handles POST /v1/orgs/{org}/api-keys; the secret is in this answer only.
func (s *Server) CreateApiKey(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	var in api.ApiKeyCreate
	if !requireOrg(w, r, org, tenants.ScopeAdmin) || !decode(w, r, &in) {
		return
	}
	k, secret, err := s.tenants.CreateAPIKey(r.Context(), actor(r), org, toKeyInput(in))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	v := fromKey(k)
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusCreated, api.ApiKeyCreated{Id: v.Id, Name: v.Name, Prefix: v.Prefix, Scopes: v.Scopes,
		CreatedAt: v.CreatedAt, LastUsedAt: v.LastUsedAt, RevokedAt: v.RevokedAt, Secret: secret})
}

// ListApiKeys handles GET /v1/orgs/{org}/api-keys.
func (s *Server) ListApiKeys(w http.ResponseWriter, r *http.Request, org api.OrgPath, params api.ListApiKeysParams) {
	if !requireOrg(w, r, org, tenants.ScopeAdmin) {
		return
	}
	ks, next, err := s.tenants.ListAPIKeys(r.Context(), org, page(params.Limit, params.Cursor))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.ApiKeyList{Items: mapSlice(ks, fromKey), NextCursor: nextPtr(next)})
}

// RevokeApiKey handles DELETE /v1/orgs/{org}/api-keys/{key}.
func (s *Server) RevokeApiKey(w http.ResponseWriter, r *http.Request, org api.OrgPath, key api.KeyPath) {
	if !requireOrg(w, r, org, tenants.ScopeAdmin) {
		return
	}
	if err := s.tenants.RevokeAPIKey(r.Context(), actor(r), org, key); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// Console users.

// CreateConsoleUser handles POST /v1/orgs/{org}/console-users.
func (s *Server) CreateConsoleUser(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	var in api.ConsoleUserCreate
	if !requireOrg(w, r, org, tenants.ScopeAdmin) || !decode(w, r, &in) {
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
	if !requireOrg(w, r, org, tenants.ScopeAdmin) {
		return
	}
	us, next, err := s.tenants.ListConsoleUsers(r.Context(), org, page(params.Limit, params.Cursor))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.ConsoleUserList{Items: mapSlice(us, fromConsoleUser), NextCursor: nextPtr(next)})
}

// GetConsoleUser handles GET /v1/orgs/{org}/console-users/{id}.
func (s *Server) GetConsoleUser(w http.ResponseWriter, r *http.Request, org api.OrgPath, id api.ConsoleUserPath) {
	if !requireOrg(w, r, org, tenants.ScopeAdmin) {
		return
	}
	u, err := s.tenants.GetConsoleUser(r.Context(), org, id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fromConsoleUser(u))
}

// DeleteConsoleUser handles DELETE /v1/orgs/{org}/console-users/{id}.
func (s *Server) DeleteConsoleUser(w http.ResponseWriter, r *http.Request, org api.OrgPath, id api.ConsoleUserPath) {
	if !requireOrg(w, r, org, tenants.ScopeAdmin) {
		return
	}
	if err := s.tenants.DeleteConsoleUser(r.Context(), actor(r), org, id); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// ListAudit handles GET /v1/orgs/{org}/audit, newest first.
func (s *Server) ListAudit(w http.ResponseWriter, r *http.Request, org api.OrgPath, params api.ListAuditParams) {
	if !requireOrg(w, r, org, tenants.ScopeAdmin) {
		return
	}
	es, next, err := s.tenants.ListAudit(r.Context(), org, page(params.Limit, params.Cursor))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.AuditList{Items: mapSlice(es, fromAudit), NextCursor: nextPtr(next)})
}

// Teams.

// CreateTeam handles POST /v1/orgs/{org}/teams.
func (s *Server) CreateTeam(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	var in api.TeamCreate
	if !requireOrg(w, r, org, tenants.ScopeAdmin) || !decode(w, r, &in) {
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
	if !requireOrg(w, r, org, tenants.ScopeAdmin) {
		return
	}
	ts, next, err := s.tenants.ListTeams(r.Context(), org, page(params.Limit, params.Cursor))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.TeamList{Items: mapSlice(ts, fromTeam), NextCursor: nextPtr(next)})
}

// GetTeam handles GET /v1/orgs/{org}/teams/{team}.
func (s *Server) GetTeam(w http.ResponseWriter, r *http.Request, org api.OrgPath, team api.TeamPath) {
	if !requireOrg(w, r, org, tenants.ScopeAdmin) {
		return
	}
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
	if !requireOrg(w, r, org, tenants.ScopeAdmin) || !decode(w, r, &in) {
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
	if !requireOrg(w, r, org, tenants.ScopeAdmin) {
		return
	}
	if err := s.tenants.DeleteTeam(r.Context(), actor(r), org, team); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// Users.

// CreateUser handles POST /v1/orgs/{org}/teams/{team}/users.
func (s *Server) CreateUser(w http.ResponseWriter, r *http.Request, org api.OrgPath, team api.TeamPath) {
	var in api.UserCreate
	if !requireOrg(w, r, org, tenants.ScopeAdmin) || !decode(w, r, &in) {
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
	if !requireOrg(w, r, org, tenants.ScopeAdmin) {
		return
	}
	us, next, err := s.tenants.ListUsers(r.Context(), org, team, page(params.Limit, params.Cursor))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.UserList{Items: mapSlice(us, fromUser), NextCursor: nextPtr(next)})
}

// GetUser handles GET /v1/orgs/{org}/teams/{team}/users/{user}.
func (s *Server) GetUser(w http.ResponseWriter, r *http.Request, org api.OrgPath, team api.TeamPath, user api.UserPath) {
	if !requireOrg(w, r, org, tenants.ScopeAdmin) {
		return
	}
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
	if !requireOrg(w, r, org, tenants.ScopeAdmin) || !decode(w, r, &in) {
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
	if !requireOrg(w, r, org, tenants.ScopeAdmin) {
		return
	}
	if err := s.tenants.DeleteUser(r.Context(), actor(r), org, team, user); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
