package httpapi

import (
	"net/http"
	"time"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Grants (top-ups). Reading them is the org's (admin or billing); creating and
// revoking them the operator's alone (orgOperator in the route table: a key of
// another org gets 404 as on every org route, and one of the org 403).

// CreateGrant handles POST /v1/orgs/{org}/grants.
func (s *Server) CreateGrant(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	var in api.GrantCreate
	if !decode(w, r, &in) {
		return
	}
	g, err := s.tenants.CreateGrant(r.Context(), actor(r), org, toGrantInput(in))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, fromGrant(g, s.tenants.Now()))
}

// ListGrants handles GET /v1/orgs/{org}/grants.
func (s *Server) ListGrants(w http.ResponseWriter, r *http.Request, org api.OrgPath, params api.ListGrantsParams) {
	gs, next, err := s.tenants.ListGrants(r.Context(), org, page(params.Limit, params.Cursor))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	now := s.tenants.Now()
	writeJSON(w, http.StatusOK, api.GrantList{Items: mapSlice(gs, func(g tenants.Grant) api.Grant { return fromGrant(g, now) }),
		NextCursor: nextPtr(next)})
}

// RevokeGrant handles DELETE /v1/orgs/{org}/grants/{grant}.
func (s *Server) RevokeGrant(w http.ResponseWriter, r *http.Request, org api.OrgPath, grant api.GrantPath) {
	s.noContent(w, r, s.tenants.RevokeGrant(r.Context(), actor(r), org, grant))
}

func toGrantInput(in api.GrantCreate) tenants.GrantInput {
	out := tenants.GrantInput{Metric: in.Metric, Units: in.Units, Reason: in.Reason}
	if in.Until != nil {
		out.Until = *in.Until
	}
	return out
}

func fromGrant(g tenants.Grant, now time.Time) api.Grant {
	return api.Grant{Id: g.ID, Org: g.OrgID, Metric: g.Metric, Units: g.Units, Reason: g.Reason, Until: g.Until,
		CreatedAt: g.CreatedAt, RevokedAt: g.RevokedAt, Active: g.Active(now)}
}
