package httpapi

import (
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
)

// routes declares the api's routes in three groups, each with the middleware that
// applies to it and no other (chi runs a group's middleware after routing, so no
// middleware compares paths):
//
//   - operations and the console: /healthz, /readyz, /metrics and /console/, with no
//     credentials (the console authenticates its own endpoints) and no body;
//   - checks: /v1/check, /v1/check/batch and /v1/reservations..., the hot path: authenticated, the body
//     capped, validated by hand once (checks.Input.Validate: walking the spec's schema would
//     cost more than the check) and never under the admin rate limit (the engine
//     bounds each org's checks in flight);
//   - the admin API: every other operation of the spec, authenticated, rate limited
//     per credential, then validated against the spec before its handler runs.
//
// The handlers are the generated wrappers (api.ServerInterfaceWrapper), which parse
// path and query parameters; TestEveryOperationIsRouted checks that every operation
// of the spec is in exactly one group.
func (s *Server) routes(r chi.Router, app http.Handler, admin ...func(http.Handler) http.Handler) {
	w := &api.ServerInterfaceWrapper{Handler: s, ErrorHandlerFunc: paramError}
	r.Group(func(r chi.Router) {
		r.Get("/healthz", w.Healthz)
		r.Get("/readyz", w.Readyz)
		r.Get("/metrics", w.Metrics)
		if app != nil {
			r.Mount("/console", app)
		}
	})
	r.Group(func(r chi.Router) {
		r.Use(limitBody, s.authenticate)
		r.Post("/v1/check", w.Check)
		r.Post("/v1/check/batch", w.CheckBatch)
		r.Post("/v1/reservations", w.CreateReservation)
		r.Get("/v1/reservations/{id}", w.GetReservation)
		r.Delete("/v1/reservations/{id}", w.ReleaseReservation)
		r.Post("/v1/reservations/{id}/commit", w.CommitReservation)
	})
	r.Group(func(r chi.Router) {
		r.Use(limitBody, s.authenticate)
		r.Use(admin...)
		r.Get("/v1/plans", w.ListPlans)
		r.Post("/v1/plans", w.CreatePlan)
		r.Get("/v1/plans/{plan}", w.GetPlan)
		r.Patch("/v1/plans/{plan}", w.PatchPlan)
		r.Get("/v1/plans/{plan}/throttle", w.GetPlanThrottle)
		r.Put("/v1/plans/{plan}/throttle", w.PutPlanThrottle)
		r.Delete("/v1/plans/{plan}/throttle", w.DeletePlanThrottle)
		r.Get("/v1/orgs", w.ListOrgs)
		r.Post("/v1/orgs", w.CreateOrg)
		r.Get("/v1/orgs/{org}", w.GetOrg)
		r.Patch("/v1/orgs/{org}", w.PatchOrg)
		r.Get("/v1/orgs/{org}/api-keys", w.ListApiKeys)
		r.Post("/v1/orgs/{org}/api-keys", w.CreateApiKey)
		r.Delete("/v1/orgs/{org}/api-keys/{key}", w.RevokeApiKey)
		r.Get("/v1/orgs/{org}/grants", w.ListGrants)
		r.Post("/v1/orgs/{org}/grants", w.CreateGrant)
		r.Delete("/v1/orgs/{org}/grants/{grant}", w.RevokeGrant)
		r.Get("/v1/orgs/{org}/console-users", w.ListConsoleUsers)
		r.Post("/v1/orgs/{org}/console-users", w.CreateConsoleUser)
		r.Delete("/v1/orgs/{org}/console-users/{id}", w.DeleteConsoleUser)
		r.Get("/v1/orgs/{org}/console-users/{id}", w.GetConsoleUser)
		r.Get("/v1/orgs/{org}/audit", w.ListAudit)
		r.Get("/v1/orgs/{org}/teams", w.ListTeams)
		r.Post("/v1/orgs/{org}/teams", w.CreateTeam)
		r.Delete("/v1/orgs/{org}/teams/{team}", w.DeleteTeam)
		r.Get("/v1/orgs/{org}/teams/{team}", w.GetTeam)
		r.Patch("/v1/orgs/{org}/teams/{team}", w.PatchTeam)
		r.Get("/v1/orgs/{org}/teams/{team}/users", w.ListUsers)
		r.Post("/v1/orgs/{org}/teams/{team}/users", w.CreateUser)
		r.Delete("/v1/orgs/{org}/teams/{team}/users/{user}", w.DeleteUser)
		r.Get("/v1/orgs/{org}/teams/{team}/users/{user}", w.GetUser)
		r.Patch("/v1/orgs/{org}/teams/{team}/users/{user}", w.PatchUser)
		r.Get("/v1/orgs/{org}/usage", w.GetUsage)
		r.Post("/v1/orgs/{org}/usage/adjustments", w.AdjustUsage)
		r.Get("/v1/orgs/{org}/reservations", w.ListOpenReservations)
		r.Get("/v1/orgs/{org}/would-block", w.GetWouldBlock)
		r.Get("/v1/orgs/{org}/billing/export", w.ExportOrgBilling)
		r.Get("/v1/orgs/{org}/throttle", w.GetOrgThrottle)
		r.Put("/v1/orgs/{org}/throttle", w.PutOrgThrottle)
		r.Delete("/v1/orgs/{org}/throttle", w.DeleteOrgThrottle)
		r.Get("/v1/orgs/{org}/webhook", w.GetWebhook)
		r.Post("/v1/orgs/{org}/webhook/test", w.SendWebhookTest)
		r.Get("/v1/orgs/{org}/webhook-deliveries", w.ListWebhookDeliveries)
		r.Get("/v1/billing/export", w.ExportBilling)
	})
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
