package httpapi

// Money: plans' rate cards (converted with the plan) and the operator's overrides of
// an org's rates.

import (
	"net/http"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// GetOrgRates handles GET /v1/orgs/{org}/rates.
func (s *Server) GetOrgRates(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	rc, err := s.tenants.OrgRates(r.Context(), org)
	respond(s, w, r, http.StatusOK, fromOrgRates, rc, err)
}

// PutOrgRates handles PUT /v1/orgs/{org}/rates.
func (s *Server) PutOrgRates(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	handle(s, w, r, http.StatusOK, fromOrgRates, func(in api.OrgRatesSet) (tenants.OrgRates, error) {
		return s.tenants.SetOrgRates(r.Context(), actor(r), org, toRates(in.Rates))
	})
}

func fromOrgRates(rc tenants.OrgRates) api.OrgRates {
	out := api.OrgRates{Org: rc.Org, PlanRates: fromRates(rc.Plan), Overrides: fromRates(rc.Overrides), Rates: fromRates(rc.Effective)}
	if rc.Currency != "" {
		c := rc.Currency
		out.Currency = &c
	}
	return out
}

func toRates(in []api.Rate) []tenants.Rate {
	out := make([]tenants.Rate, len(in))
	for i, r := range in {
		out[i] = tenants.Rate{Metric: r.Metric, Price: r.Price, Per: r.Per}
	}
	return out
}

func fromRates(in []tenants.Rate) api.Rates {
	out := make(api.Rates, len(in))
	for i, r := range in {
		out[i] = api.Rate{Metric: r.Metric, Price: r.Price, Per: r.Per}
	}
	return out
}

// rateCardIn is a plan request's currency and rates as tenants takes them.
func rateCardIn(cur *api.Currency, rates *api.Rates) (string, []tenants.Rate) {
	var rs []tenants.Rate
	if rates != nil {
		rs = toRates(*rates)
	}
	return deref(cur), rs
}

// rateCardOut sets a plan's currency and rates on out.
func rateCardOut(p tenants.Plan, out *api.Plan) {
	if p.Currency != "" {
		c := p.Currency
		out.Currency = &c
	}
	rs := fromRates(p.Rates)
	out.Rates = &rs
}
