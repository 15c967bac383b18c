package httpapi

import (
	"net/http"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Throttles: the operator's on a plan, an org admin's (or the operator's) on an org.

func toThrottleInput(in api.ThrottleSet) tenants.ThrottleInput {
	out := tenants.ThrottleInput{Factor: in.Factor, ExpiresAt: in.ExpiresAt, TTLSeconds: in.TtlSeconds, Reason: in.Reason}
	if in.Month != nil {
		out.Month = *in.Month
	}
	return out
}

func fromThrottle(t tenants.Throttle) api.Throttle {
	return api.Throttle{Scope: api.ThrottleScope(t.Scope), Factor: t.Factor(), Month: t.Month, Reason: t.Reason,
		ExpiresAt: t.ExpiresAt.UTC(), CreatedAt: t.CreatedAt.UTC(), CreatedBy: t.CreatedBy}
}

// writeThrottle answers a GET of a throttle: 200 with it, or 204 when none is in
// force (not 404: having none is the usual state, and the console asks on every
// overview).
func writeThrottle(w http.ResponseWriter, r *http.Request, s *Server, t tenants.Throttle, ok bool, err error) {
	switch {
	case err != nil:
		s.fail(w, r, err)
	case !ok:
		w.WriteHeader(http.StatusNoContent)
	default:
		writeJSON(w, http.StatusOK, fromThrottle(t))
	}
}

func (s *Server) putThrottle(w http.ResponseWriter, r *http.Request, scope tenants.ThrottleScope, id string) {
	handle(s, w, r, http.StatusOK, fromThrottle, func(in api.ThrottleSet) (tenants.Throttle, error) {
		return s.tenants.SetThrottle(r.Context(), actor(r), scope, id, toThrottleInput(in))
	})
}

func (s *Server) deleteThrottle(w http.ResponseWriter, r *http.Request, scope tenants.ThrottleScope, id string) {
	s.noContent(w, r, s.tenants.DeleteThrottle(r.Context(), actor(r), scope, id))
}

// GetPlanThrottle handles GET /v1/plans/{plan}/throttle (operator).
func (s *Server) GetPlanThrottle(w http.ResponseWriter, r *http.Request, plan api.PlanPath) {
	t, ok, err := s.tenants.GetThrottle(r.Context(), tenants.ThrottlePlan, plan)
	writeThrottle(w, r, s, t, ok, err)
}

// PutPlanThrottle handles PUT /v1/plans/{plan}/throttle (operator).
func (s *Server) PutPlanThrottle(w http.ResponseWriter, r *http.Request, plan api.PlanPath) {
	s.putThrottle(w, r, tenants.ThrottlePlan, plan)
}

// DeletePlanThrottle handles DELETE /v1/plans/{plan}/throttle (operator).
func (s *Server) DeletePlanThrottle(w http.ResponseWriter, r *http.Request, plan api.PlanPath) {
	s.deleteThrottle(w, r, tenants.ThrottlePlan, plan)
}

// GetOrgThrottle handles GET /v1/orgs/{org}/throttle: the throttle in force, the
// org's own or its plan's.
func (s *Server) GetOrgThrottle(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	t, ok, err := s.tenants.ThrottleInForce(r.Context(), org)
	writeThrottle(w, r, s, t, ok, err)
}

// PutOrgThrottle handles PUT /v1/orgs/{org}/throttle.
func (s *Server) PutOrgThrottle(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	s.putThrottle(w, r, tenants.ThrottleOrg, org)
}

// DeleteOrgThrottle handles DELETE /v1/orgs/{org}/throttle.
func (s *Server) DeleteOrgThrottle(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	s.deleteThrottle(w, r, tenants.ThrottleOrg, org)
}
