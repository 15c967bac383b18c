package httpapi

import (
	"net/http"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Entitlements: the check path's GET /v1/entitlements, served from the resolved-org
// cache; an org's features (GET for its admins and the console, PUT for the operator's
// overrides); and the converters of plan features.

// GetEntitlements handles GET /v1/entitlements: the org's resolved features.
func (s *Server) GetEntitlements(w http.ResponseWriter, r *http.Request, params api.GetEntitlementsParams) {
	e, err := s.checks.Entitlements(r.Context(), callerOfCheck(r), params.Org, deref(params.Team), deref(params.User))
	respond(s, w, r, http.StatusOK, fromEntitlements, e, err)
}

// GetOrgFeatures handles GET /v1/orgs/{org}/features.
func (s *Server) GetOrgFeatures(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	f, err := s.tenants.OrgFeatures(r.Context(), org)
	respond(s, w, r, http.StatusOK, fromOrgFeatures, f, err)
}

// PutOrgFeatures handles PUT /v1/orgs/{org}/features (the operator's).
func (s *Server) PutOrgFeatures(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	handle(s, w, r, http.StatusOK, fromOrgFeatures, func(in api.OrgFeaturesSet) (tenants.OrgFeatures, error) {
		return s.tenants.SetOrgFeatures(r.Context(), actor(r), org, toOverrides(in.Features))
	})
}

func fromEntitlements(e checks.Entitlements) api.Entitlements {
	return api.Entitlements{Org: e.Org, Team: nonZero(e.Team), User: nonZero(e.User),
		Features: fromFeatures(e.Features), Sources: fromSources(e.Sources)}
}

func fromOrgFeatures(f tenants.OrgFeatures) api.OrgFeatures {
	over := make(api.FeatureOverrides, len(f.Overrides))
	for k, v := range f.Overrides {
		if v == nil {
			over[k] = nil
			continue
		}
		over[k] = &v
	}
	return api.OrgFeatures{Org: f.Org, Plan: f.Plan, PlanFeatures: fromFeatures(f.PlanFeatures), Overrides: over,
		Features: fromFeatures(f.Features), Sources: fromSources(f.Sources)}
}

func fromFeatures(fs tenants.Features) api.Features {
	out := make(api.Features, len(fs))
	for k, v := range fs {
		out[k] = v
	}
	return out
}

func fromSources(src map[string]tenants.FeatureSource) api.FeatureSources {
	out := make(api.FeatureSources, len(src))
	for k, v := range src {
		out[k] = string(v)
	}
	return out
}

// toFeatures is a plan's features as sent (nil when absent); the service validates
// and normalizes the values.
func toFeatures(in *api.Features) tenants.Features {
	if in == nil {
		return nil
	}
	out := make(tenants.Features, len(*in))
	for k, v := range *in {
		out[k] = v
	}
	return out
}

func toFeaturesPtr(in *api.Features) *tenants.Features {
	if in == nil {
		return nil
	}
	fs := toFeatures(in)
	return &fs
}

// toOverrides is an org's overrides as sent: a null value (nil) removes a feature.
func toOverrides(in api.FeatureOverrides) tenants.Features {
	out := make(tenants.Features, len(in))
	for k, v := range in {
		if v == nil {
			out[k] = nil
			continue
		}
		out[k] = *v
	}
	return out
}
