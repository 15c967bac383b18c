package httpapi

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// route is one operation of the spec: its method and pattern, the generated wrapper
// method that parses its parameters and calls the handler, and who may call it.
type route struct {
	method, pattern string
	op              func(*wrapper, http.ResponseWriter, *http.Request)
	access          access
}

// wrapper is the generated router's: it parses the path and query parameters of an
// operation, runs its HandlerMiddlewares, then calls the Server's method.
type wrapper = api.ServerInterfaceWrapper

// table is every operation of the spec with the access it requires, declared here
// and nowhere else: no handler checks its caller's org or scope. The access also
// picks the route's group (see routes). TestRouteTable checks that every operation of
// the spec has exactly one row, and that the row agrees with the spec's security,
// x-required-scopes and x-operator-only.
func table() []route {
	const get, post, put, patch, del = http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete
	admin, billing := tenants.ScopeAdmin, tenants.ScopeBilling
	return []route{
		{get, "/healthz", (*wrapper).Healthz, public},
		{get, "/readyz", (*wrapper).Readyz, public},
		{get, "/metrics", (*wrapper).Metrics, public},

		{post, "/v1/check", (*wrapper).Check, checkScoped},
		{post, "/v1/check/batch", (*wrapper).CheckBatch, checkScoped},
		{post, "/v1/reservations", (*wrapper).CreateReservation, checkScoped},
		{get, "/v1/reservations/{id}", (*wrapper).GetReservation, checkScoped},
		{del, "/v1/reservations/{id}", (*wrapper).ReleaseReservation, checkScoped},
		{post, "/v1/reservations/{id}/commit", (*wrapper).CommitReservation, checkScoped},
		{post, "/v1/reservations/{id}/extend", (*wrapper).ExtendReservation, checkScoped},
		{post, "/v1/leases", (*wrapper).CreateLease, checkScoped},
		{post, "/v1/leases/{id}/settle", (*wrapper).SettleLease, checkScoped},
		// Entitlements: resolved for the check path; an org's, set by the operator.
		{get, "/v1/entitlements", (*wrapper).GetEntitlements, checkScoped},
		{get, "/v1/orgs/{org}/features", (*wrapper).GetOrgFeatures, orgKey(admin, billing)},
		{put, "/v1/orgs/{org}/features", (*wrapper).PutOrgFeatures, orgOperator(admin, billing)},

		{get, "/v1/plans", (*wrapper).ListPlans, operator},
		{post, "/v1/plans", (*wrapper).CreatePlan, operator},
		{get, "/v1/plans/{plan}", (*wrapper).GetPlan, operator},
		{patch, "/v1/plans/{plan}", (*wrapper).PatchPlan, operator},
		{get, "/v1/capacities", (*wrapper).ListCapacities, operator},
		{post, "/v1/capacities", (*wrapper).CreateCapacity, operator},
		{get, "/v1/capacities/{id}", (*wrapper).GetCapacity, operator},
		{patch, "/v1/capacities/{id}", (*wrapper).PatchCapacity, operator},
		{del, "/v1/capacities/{id}", (*wrapper).DeleteCapacity, operator},
		{get, "/v1/plans/{plan}/throttle", (*wrapper).GetPlanThrottle, operator},
		{put, "/v1/plans/{plan}/throttle", (*wrapper).PutPlanThrottle, operator},
		{del, "/v1/plans/{plan}/throttle", (*wrapper).DeletePlanThrottle, operator},
		{get, "/v1/orgs", (*wrapper).ListOrgs, operator},
		{post, "/v1/orgs", (*wrapper).CreateOrg, operator},
		{get, "/v1/orgs/{org}", (*wrapper).GetOrg, orgKey(admin)},
		{patch, "/v1/orgs/{org}", (*wrapper).PatchOrg, orgKey(admin)},
		{get, "/v1/orgs/{org}/api-keys", (*wrapper).ListApiKeys, orgKey(admin)},
		{post, "/v1/orgs/{org}/api-keys", (*wrapper).CreateApiKey, orgKey(admin)},
		{del, "/v1/orgs/{org}/api-keys/{key}", (*wrapper).RevokeApiKey, orgKey(admin)},
		{get, "/v1/orgs/{org}/grants", (*wrapper).ListGrants, orgKey(admin, billing)},
		{post, "/v1/orgs/{org}/grants", (*wrapper).CreateGrant, orgOperator(admin, billing)},
		{del, "/v1/orgs/{org}/grants/{grant}", (*wrapper).RevokeGrant, orgOperator(admin, billing)},
		{get, "/v1/orgs/{org}/console-users", (*wrapper).ListConsoleUsers, orgKey(admin)},
		{post, "/v1/orgs/{org}/console-users", (*wrapper).CreateConsoleUser, orgKey(admin)},
		{del, "/v1/orgs/{org}/console-users/{id}", (*wrapper).DeleteConsoleUser, orgKey(admin)},
		{get, "/v1/orgs/{org}/console-users/{id}", (*wrapper).GetConsoleUser, orgKey(admin)},
		{get, "/v1/orgs/{org}/audit", (*wrapper).ListAudit, orgKey(admin)},
		{get, "/v1/orgs/{org}/teams", (*wrapper).ListTeams, orgKey(admin)},
		{post, "/v1/orgs/{org}/teams", (*wrapper).CreateTeam, orgKey(admin)},
		{del, "/v1/orgs/{org}/teams/{team}", (*wrapper).DeleteTeam, orgKey(admin)},
		{get, "/v1/orgs/{org}/teams/{team}", (*wrapper).GetTeam, orgKey(admin)},
		{patch, "/v1/orgs/{org}/teams/{team}", (*wrapper).PatchTeam, orgKey(admin)},
		{get, "/v1/orgs/{org}/teams/{team}/users", (*wrapper).ListUsers, orgKey(admin)},
		{post, "/v1/orgs/{org}/teams/{team}/users", (*wrapper).CreateUser, orgKey(admin)},
		{del, "/v1/orgs/{org}/teams/{team}/users/{user}", (*wrapper).DeleteUser, orgKey(admin)},
		{get, "/v1/orgs/{org}/teams/{team}/users/{user}", (*wrapper).GetUser, orgKey(admin)},
		{patch, "/v1/orgs/{org}/teams/{team}/users/{user}", (*wrapper).PatchUser, orgKey(admin)},
		{get, "/v1/orgs/{org}/usage", (*wrapper).GetUsage, orgKey(admin, billing)},
		{post, "/v1/orgs/{org}/usage/adjustments", (*wrapper).AdjustUsage, orgOperator(admin, billing)},
		{get, "/v1/orgs/{org}/reservations", (*wrapper).ListOpenReservations, orgKey(admin, billing)},
		{get, "/v1/orgs/{org}/would-block", (*wrapper).GetWouldBlock, orgKey(admin, billing)},
		{get, "/v1/orgs/{org}/billing/export", (*wrapper).ExportOrgBilling, orgKey(admin, billing)},
		{get, "/v1/orgs/{org}/rates", (*wrapper).GetOrgRates, orgOperator(admin, billing)}, // money
		{put, "/v1/orgs/{org}/rates", (*wrapper).PutOrgRates, orgOperator(admin, billing)},
		{get, "/v1/orgs/{org}/throttle", (*wrapper).GetOrgThrottle, orgKey(admin)},
		{put, "/v1/orgs/{org}/throttle", (*wrapper).PutOrgThrottle, orgKey(admin)},
		{del, "/v1/orgs/{org}/throttle", (*wrapper).DeleteOrgThrottle, orgKey(admin)},
		{get, "/v1/orgs/{org}/webhook", (*wrapper).GetWebhook, orgKey(admin)},
		{post, "/v1/orgs/{org}/webhook/test", (*wrapper).SendWebhookTest, orgKey(admin)},
		{post, "/v1/orgs/{org}/webhook/secret/rotate", (*wrapper).RotateWebhookSecret, orgKey(admin)},
		{get, "/v1/orgs/{org}/webhook-deliveries", (*wrapper).ListWebhookDeliveries, orgKey(admin)},
		{get, "/v1/billing/export", (*wrapper).ExportBilling, operator},
	}
}

// routes mounts the table in three groups, each with the middleware that applies to
// it and no other (chi runs a group's middleware after routing, so no middleware
// compares paths); a route's access picks its group:
//
//   - public: /healthz, /readyz, /metrics, and the console's /console/, with no
//     credentials (the console authenticates its own endpoints) and no body;
//   - checkScoped: /v1/check, /v1/check/batch and /v1/reservations..., the hot path:
//     authenticated, the body capped, validated by hand once (checks.Input.Validate:
//     walking the spec's schema would cost more than the check) and never under the
//     admin rate limit (the engine bounds each org's checks in flight);
//   - every other access is the admin API's: authenticated, rate limited per
//     credential, then validated against the spec before its handler runs.
//
// Each route gets its own generated wrapper, whose HandlerMiddlewares is the route's
// authorization: it runs after the wrapper has parsed the parameters and just before
// the handler, so no handler checks its caller itself. A route whose access is not
// declared is an error.
//
// validate (the request validator) runs after the access check, inside the wrapper:
// a caller without access learns 403 or 404, never what its body lacked (an org key
// on an operator route gets no 400 for a missing field).
// org key on an operator route got 400 for a missing field).
func (s *Server) routes(r chi.Router, app http.Handler, validate func(http.Handler) http.Handler, admin ...func(http.Handler) http.Handler) error {
	ops := r.With()
	if app != nil {
		ops.Mount("/console", app)
	}
	checks := r.With(limitBody, s.authenticate)
	adminAPI := r.With(append([]func(http.Handler) http.Handler{limitBody, s.authenticate}, admin...)...)
	for _, rt := range table() {
		if err := rt.access.valid(rt.pattern); err != nil {
			return fmt.Errorf("route %s %s: %w", rt.method, rt.pattern, err)
		}
		g, validated := adminAPI, validate != nil
		switch rt.access.kind {
		case publicAccess:
			g, validated = ops, false
		case checkAccess:
			g, validated = checks, false
		}
		w := &wrapper{Handler: s, ErrorHandlerFunc: paramError}
		if validated { // innermost: the wrapper applies the last middleware outermost
			w.HandlerMiddlewares = append(w.HandlerMiddlewares, api.MiddlewareFunc(validate))
		}
		if mw := rt.access.middleware(); mw != nil {
			w.HandlerMiddlewares = append(w.HandlerMiddlewares, mw)
		}
		op := rt.op
		g.MethodFunc(rt.method, rt.pattern, func(rw http.ResponseWriter, req *http.Request) { op(w, rw, req) })
	}
	return nil
}

// notFound answers a path no route has.
func notFound(w http.ResponseWriter, r *http.Request) {
	refuse(w, r, derrors.E(derrors.NotFound, "no such route: "+r.Method+" "+r.URL.Path, nil))
}

// methodNotAllowed answers 405 with the Allow header listing the methods the path has.
func methodNotAllowed(root chi.Routes) http.HandlerFunc {
	methods := []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}
	return func(w http.ResponseWriter, r *http.Request) {
		var allow []string
		for _, m := range methods {
			if root.Match(chi.NewRouteContext(), m, r.URL.Path) {
				allow = append(allow, m)
			}
		}
		w.Header().Set("Allow", strings.Join(allow, ", "))
		refuse(w, r, derrors.E(derrors.MethodNotAllowed, "method "+r.Method+" is not allowed on "+r.URL.Path+
			"; use "+strings.Join(allow, " or "), nil))
	}
}
