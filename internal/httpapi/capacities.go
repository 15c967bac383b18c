package httpapi

import (
	"net/http"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Capacities: the operator's (docs/ARCHITECTURE.md "Capacities and fair share").

// CreateCapacity handles POST /v1/capacities.
func (s *Server) CreateCapacity(w http.ResponseWriter, r *http.Request) {
	handle(s, w, r, http.StatusCreated, fromCapacity, func(in api.CapacityCreate) (tenants.Capacity, error) {
		return s.tenants.CreateCapacity(r.Context(), actor(r), toCapacityInput(in))
	})
}

// ListCapacities handles GET /v1/capacities.
func (s *Server) ListCapacities(w http.ResponseWriter, r *http.Request, params api.ListCapacitiesParams) {
	cs, next, err := s.tenants.ListCapacities(r.Context(), page(params.Limit, params.Cursor))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.CapacityList{Items: mapSlice(cs, fromCapacity), NextCursor: nextPtr(next)})
}

// GetCapacity handles GET /v1/capacities/{capacity}: the capacity and its current
// window, read from its Redis through the check service.
func (s *Server) GetCapacity(w http.ResponseWriter, r *http.Request, capacity api.CapacityPath) {
	c, err := s.tenants.GetCapacity(r.Context(), capacity)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	cw, err := s.checks.CapacityWindow(r.Context(), c)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fromCapacityDetail(c, cw))
}

// PatchCapacity handles PATCH /v1/capacities/{capacity}.
func (s *Server) PatchCapacity(w http.ResponseWriter, r *http.Request, capacity api.CapacityPath) {
	handle(s, w, r, http.StatusOK, fromCapacity, func(in api.CapacityPatch) (tenants.Capacity, error) {
		return s.tenants.UpdateCapacity(r.Context(), actor(r), capacity, tenants.CapacityPatch{Limit: in.Limit, Saturation: in.Saturation})
	})
}

// DeleteCapacity handles DELETE /v1/capacities/{capacity}.
func (s *Server) DeleteCapacity(w http.ResponseWriter, r *http.Request, capacity api.CapacityPath) {
	s.noContent(w, r, s.tenants.DeleteCapacity(r.Context(), actor(r), capacity))
}

func toCapacityInput(in api.CapacityCreate) tenants.CapacityInput {
	c := tenants.CapacityInput{ID: in.Id, Metric: in.Metric, Window: in.Window, Limit: in.Limit}
	if in.Saturation != nil {
		c.Saturation = *in.Saturation
	}
	return c
}

func fromCapacity(c tenants.Capacity) api.Capacity {
	return api.Capacity{Id: c.ID, Metric: c.Metric, Window: c.Window, Limit: c.Limit, Saturation: c.Saturation,
		CreatedAt: c.CreatedAt, UpdatedAt: c.UpdatedAt}
}

func fromCapacityDetail(c tenants.Capacity, cw checks.CapacityWindow) api.CapacityDetail {
	out := api.CapacityDetail{Id: c.ID, Metric: c.Metric, Window: c.Window, Limit: c.Limit, Saturation: c.Saturation,
		CreatedAt: c.CreatedAt, UpdatedAt: c.UpdatedAt,
		Current: api.CapacityWindow{Used: cw.Used, Limit: cw.Limit, Saturation: c.Saturation, Saturated: cw.Saturated,
			Orgs: make([]api.CapacityOrg, len(cw.Members))}}
	for i, m := range cw.Members {
		out.Current.Orgs[i] = api.CapacityOrg{Org: m.ID, Weight: m.Weight, Share: m.Share, Used: m.Used}
	}
	return out
}
