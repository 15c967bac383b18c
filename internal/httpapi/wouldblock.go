package httpapi

import (
	"net/http"

	openapi_types "github.com/oapi-codegen/runtime/types"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
)

// The would-block report: what shadow and warn modes would have refused.

// GetWouldBlock handles GET /v1/orgs/{org}/would-block: the shadow and warn report.
func (s *Server) GetWouldBlock(w http.ResponseWriter, r *http.Request, org api.OrgPath, params api.GetWouldBlockParams) {
	if !s.billingReady(w, r) {
		return
	}
	rep, err := s.billing.WouldBlock(r.Context(), org, deref(params.Period))
	respond(s, w, r, http.StatusOK, fromWouldBlock, rep, err)
}

func fromWouldBlock(in billing.WouldBlockReport) api.WouldBlockReport {
	out := api.WouldBlockReport{Org: in.Org, Period: in.Period.ID, PeriodStart: in.Period.Start, PeriodEnd: in.Period.End,
		Mode: api.Mode(in.Mode), Capped: in.Capped, Checks: in.Total.Checks, Units: in.Total.Units,
		Days: fromWouldBlockDays(in.Days), Rows: make([]api.WouldBlockRow, len(in.Rows))}
	for i, r := range in.Rows {
		row := api.WouldBlockRow{Level: api.WouldBlockRowLevel(r.Level), Checks: r.Checks, Units: r.Units, Days: fromWouldBlockDays(r.Days)}
		if r.Level != "other" {
			metric, id, win := r.Metric, r.ID, api.Window(r.Window)
			row.Metric, row.Id, row.Window = &metric, &id, &win
		}
		if r.Team != "" {
			team := r.Team
			row.Team = &team
		}
		out.Rows[i] = row
	}
	return out
}

func fromWouldBlockDays(in []billing.WouldBlockDay) []api.WouldBlockDay {
	out := make([]api.WouldBlockDay, len(in))
	for i, d := range in {
		out[i] = api.WouldBlockDay{Day: openapi_types.Date{Time: d.Day}, Checks: d.Checks, Units: d.Units}
	}
	return out
}
