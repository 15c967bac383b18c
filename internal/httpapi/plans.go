package httpapi

import (
	"net/http"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Plans: the operator's.

// CreatePlan handles POST /v1/plans.
func (s *Server) CreatePlan(w http.ResponseWriter, r *http.Request) {
	handle(s, w, r, http.StatusCreated, fromPlan, func(in api.PlanCreate) (tenants.Plan, error) {
		return s.tenants.CreatePlan(r.Context(), actor(r), toPlanInput(in))
	})
}

// ListPlans handles GET /v1/plans.
func (s *Server) ListPlans(w http.ResponseWriter, r *http.Request, params api.ListPlansParams) {
	ps, next, err := s.tenants.ListPlans(r.Context(), page(params.Limit, params.Cursor))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.PlanList{Items: mapSlice(ps, fromPlan), NextCursor: nextPtr(next)})
}

// GetPlan handles GET /v1/plans/{plan}.
func (s *Server) GetPlan(w http.ResponseWriter, r *http.Request, plan api.PlanPath) {
	p, err := s.tenants.GetPlan(r.Context(), plan)
	respond(s, w, r, http.StatusOK, fromPlan, p, err)
}

// PatchPlan handles PATCH /v1/plans/{plan}.
func (s *Server) PatchPlan(w http.ResponseWriter, r *http.Request, plan api.PlanPath) {
	var in api.PlanPatch
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
	respond(s, w, r, http.StatusOK, fromPlan, p, err)
}

func toPricing(in *api.Pricing) *tenants.Pricing {
	if in == nil {
		return nil
	}
	p := &tenants.Pricing{Currency: in.Currency, BasePrice: in.BasePrice, Metrics: []tenants.MetricPrice{}}
	for _, m := range in.Metrics {
		p.Metrics = append(p.Metrics, tenants.MetricPrice{Metric: m.Metric, IncludedUnits: m.IncludedUnits, OveragePrice: m.OveragePrice})
	}
	return p
}

func fromPricing(in *tenants.Pricing) *api.Pricing {
	if in == nil {
		return nil
	}
	p := &api.Pricing{Currency: in.Currency, BasePrice: in.BasePrice, Metrics: []api.MetricPrice{}}
	for _, m := range in.Metrics {
		p.Metrics = append(p.Metrics, api.MetricPrice{Metric: m.Metric, IncludedUnits: m.IncludedUnits, OveragePrice: m.OveragePrice})
	}
	return p
}

func toPlanInput(in api.PlanCreate) tenants.PlanInput {
	p := tenants.PlanInput{ID: in.Id, Name: in.Name, Limits: toLimits(in.Limits),
		FailMode: in.FailMode, Pricing: toPricing(in.Pricing)}
	p.Features = toFeatures(in.Features) // entitlements (features.go)
	if in.Metered != nil {
		p.Metered = *in.Metered
	}
	if in.Pool != nil {
		p.Pool = *in.Pool
	}
	if in.Weight != nil {
		p.Weight = *in.Weight
	}
	if in.Leases != nil {
		p.Leases = tenants.Leases(*in.Leases)
	}
	if in.ClientLeases != nil {
		p.ClientLeases = tenants.Leases(*in.ClientLeases)
	}
	if in.SlidingWindows != nil {
		p.SlidingWindows = tenants.SlidingWindows(*in.SlidingWindows)
	}
	p.Currency, p.Rates = rateCardIn(in.Currency, in.Rates) // money
	return p
}

func toPlanPatch(in api.PlanPatch) tenants.PlanPatch {
	p := tenants.PlanPatch{Name: in.Name, Limits: toLimitsPtr(in.Limits), Metered: in.Metered, Pool: in.Pool, Pricing: toPricing(in.Pricing),
		Weight: in.Weight}
	p.Features = toFeaturesPtr(in.Features) // entitlements (features.go)
	if in.FailMode != nil {
		fm := *in.FailMode
		p.FailMode = &fm
	}
	if in.Leases != nil {
		l := tenants.Leases(*in.Leases)
		p.Leases = &l
	}
	if in.ClientLeases != nil {
		l := tenants.Leases(*in.ClientLeases)
		p.ClientLeases = &l
	}
	if in.SlidingWindows != nil {
		w := tenants.SlidingWindows(*in.SlidingWindows)
		p.SlidingWindows = &w
	}
	p.Currency = in.Currency // money
	if in.Rates != nil {
		rs := toRates(*in.Rates)
		p.Rates = &rs
	}
	return p
}

func fromPlan(p tenants.Plan) api.Plan {
	out := api.Plan{Id: p.ID, Name: p.Name, Limits: fromLimits(p.Limits), Metered: p.Metered, FailMode: p.FailMode,
		Pool: p.Pool, Pricing: fromPricing(p.Pricing), Weight: &p.Weight, CreatedAt: p.CreatedAt, UpdatedAt: p.UpdatedAt}
	features := fromFeatures(p.Features) // entitlements (features.go)
	out.Features = &features
	if p.Leases != "" {
		l := api.PlanLeases(p.Leases)
		out.Leases = &l
	}
	if p.ClientLeases != "" {
		l := api.PlanClientLeases(p.ClientLeases)
		out.ClientLeases = &l
	}
	if p.SlidingWindows != "" {
		w := api.PlanSlidingWindows(p.SlidingWindows)
		out.SlidingWindows = &w
	}
	rateCardOut(p, &out) // money
	return out
}
