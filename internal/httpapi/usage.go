package httpapi

import (
	"net/http"

	openapi_types "github.com/oapi-codegen/runtime/types"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Usage of an org: the period's counters, and the operator's adjustments.

// GetUsage handles GET /v1/orgs/{org}/usage.
func (s *Server) GetUsage(w http.ResponseWriter, r *http.Request, org api.OrgPath, params api.GetUsageParams) {
	if !s.billingReady(w, r) {
		return
	}
	u, err := s.billing.Usage(r.Context(), org, deref(params.Period), page(params.Limit, params.Cursor))
	respond(s, w, r, http.StatusOK, fromUsage, u, err)
}

func fromUsage(u billing.Usage) api.Usage {
	out := api.Usage{Org: u.Org, Period: u.Period.ID, PeriodStart: u.Period.Start, PeriodEnd: u.Period.End,
		Metrics: make([]api.MetricUsage, len(u.Metrics))}
	if u.NextCursor != "" { // null on the last page, as the other lists (NextCursor is nullable)
		out.NextCursor = &u.NextCursor
	}
	for i, m := range u.Metrics {
		mu := api.MetricUsage{Metric: m.Metric, Org: fromLevelUsage(m.Org),
			Teams: make([]api.UsageLevel, len(m.Teams)), Users: make([]api.UsageLevel, len(m.Users))}
		for j, t := range m.Teams {
			mu.Teams[j] = fromLevelUsage(t)
		}
		for j, us := range m.Users {
			mu.Users[j] = fromLevelUsage(us)
		}
		daily := make([]api.DailyUsage, len(m.Daily))
		for j, d := range m.Daily {
			daily[j] = api.DailyUsage{Day: openapi_types.Date{Time: d.Day}, Used: d.Used}
		}
		mu.Daily = &daily
		if m.Metric == tenants.SpendMetric && u.Currency != "" { // money
			inMoney(&mu, u.Currency)
		}
		out.Metrics[i] = mu
	}
	return out
}

func fromLevelUsage(l billing.LevelUsage) api.UsageLevel {
	out := api.UsageLevel{Id: l.ID, Used: l.Used, Reserved: l.Reserved, InFlight: l.InFlight, Limits: make([]api.WindowUsage, len(l.Limits))}
	if l.Team != "" {
		team := l.Team
		out.Team = &team
	}
	for i, w := range l.Limits {
		out.Limits[i] = api.WindowUsage{Window: api.Window(w.Window), Limit: w.Limit, Used: w.Used, Remaining: w.Remaining, Burst: burstOf(w.Burst)}
		if w.Granted > 0 {
			g := w.Granted
			out.Limits[i].Granted = &g
		}
	}
	return out
}

// AdjustUsage handles POST /v1/orgs/{org}/usage/adjustments: an operator's audited
// correction of one month counter (billing.Service.AdjustUsage).
func (s *Server) AdjustUsage(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	var in api.UsageAdjustmentCreate
	if !decode(w, r, &in) || !s.billingReady(w, r) {
		return
	}
	adj, err := s.billing.AdjustUsage(r.Context(), actor(r), org, toAdjustInput(in))
	respond(s, w, r, http.StatusOK, fromAdjustment, adj, err)
}

func toAdjustInput(in api.UsageAdjustmentCreate) billing.AdjustInput {
	return billing.AdjustInput{Metric: in.Metric, Team: deref(in.Team), User: deref(in.User), Set: in.Set, Add: in.Add,
		Reason: in.Reason}
}

func fromAdjustment(a billing.Adjustment) api.UsageAdjustment {
	out := api.UsageAdjustment{Org: a.Org, Period: a.Period, Metric: a.Counter.Metric,
		Level: api.UsageAdjustmentLevel(a.Counter.Level), Before: a.Before, After: a.After, Reason: a.Reason,
		Actor: a.Actor, At: a.At}
	if a.Counter.Team != "" {
		out.Team = &a.Counter.Team
	}
	if a.Counter.User != "" {
		out.User = &a.Counter.User
	}
	return out
}

// inMoney says spend's usage in money: the currency, and each level's used, reserved,
// limits and remaining as decimal amounts of it.
func inMoney(mu *api.MetricUsage, currency string) {
	mu.Currency = &currency
	amt := func(n int64) *string { s := tenants.FormatMicros(n); return &s }
	level := func(l *api.UsageLevel) {
		l.UsedAmount, l.ReservedAmount = amt(l.Used), amt(l.Reserved)
		for i := range l.Limits {
			l.Limits[i].LimitAmount, l.Limits[i].RemainingAmount = amt(l.Limits[i].Limit), amt(l.Limits[i].Remaining)
		}
	}
	level(&mu.Org)
	for i := range mu.Teams {
		level(&mu.Teams[i])
	}
	for i := range mu.Users {
		level(&mu.Users[i])
	}
}
