package httpapi

import (
	"fmt"
	"net/http"

	openapi_types "github.com/oapi-codegen/runtime/types"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/webhooks"
)

// GetUsage handles GET /v1/orgs/{org}/usage.
func (s *Server) GetUsage(w http.ResponseWriter, r *http.Request, org api.OrgPath, params api.GetUsageParams) {
	if !requireOrg(w, r, org, tenants.ScopeAdmin, tenants.ScopeBilling) || !s.billingReady(w, r) {
		return
	}
	u, err := s.billing.Usage(r.Context(), org, deref(params.Period))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fromUsage(u))
}

// ExportOrgBilling handles GET /v1/orgs/{org}/billing/export.
func (s *Server) ExportOrgBilling(w http.ResponseWriter, r *http.Request, org api.OrgPath, params api.ExportOrgBillingParams) {
	if !requireOrg(w, r, org, tenants.ScopeAdmin, tenants.ScopeBilling) || !s.billingReady(w, r) {
		return
	}
	s.export(w, r, org, deref(params.Period), params.Format)
}

// ExportBilling handles GET /v1/billing/export.
func (s *Server) ExportBilling(w http.ResponseWriter, r *http.Request, params api.ExportBillingParams) {
	if !requireOperator(w, r) || !s.billingReady(w, r) {
		return
	}
	s.export(w, r, "", deref(params.Period), params.Format)
}

func (s *Server) billingReady(w http.ResponseWriter, r *http.Request) bool {
	if s.billing == nil {
		s.fail(w, r, derrors.E(derrors.Unavailable, "usage and billing are not configured on this server", nil))
		return false
	}
	return true
}

// webhooksReady is billingReady for the webhook API (webhooks.Service), with the 503
// it answered when both were one service.
func (s *Server) webhooksReady(w http.ResponseWriter, r *http.Request) bool {
	if s.webhooks == nil {
		s.fail(w, r, derrors.E(derrors.Unavailable, "usage and billing are not configured on this server", nil))
		return false
	}
	return true
}

// export streams the rows: headers go out with the first bytes, so only errors found
// before any row (bad input, unknown org, database down) become problem documents.
func (s *Server) export(w http.ResponseWriter, r *http.Request, org, period string, f *api.ExportFormat) {
	format := billing.JSON
	if f != nil {
		format = billing.Format(*f)
	}
	sw := &startWriter{w: w, start: func() {
		name := "quotaplane-billing"
		if org != "" {
			name += "-" + org
		}
		if period != "" {
			name += "-" + period
		}
		if format == billing.CSV {
			w.Header().Set("Content-Type", "text/csv; charset=utf-8")
			name += ".csv"
		} else {
			w.Header().Set("Content-Type", "application/json")
			name += ".json"
		}
		w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", name))
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(http.StatusOK)
	}}
	err := s.billing.Export(r.Context(), sw, org, period, format)
	if err == nil {
		return
	}
	if !sw.started {
		s.fail(w, r, err)
		return
	}
	s.log.Error("billing export failed midway; the response is truncated", "err", err, "org", org, "period", period)
}

// startWriter writes the response headers just before the first byte of the body.
type startWriter struct {
	w       http.ResponseWriter
	start   func()
	started bool
}

// Write starts the response on the first call.
func (s *startWriter) Write(p []byte) (int, error) {
	if !s.started {
		s.started = true
		s.start()
	}
	return s.w.Write(p)
}

// Flush sends what is buffered to the client.
func (s *startWriter) Flush() {
	if f, ok := s.w.(http.Flusher); ok && s.started {
		f.Flush()
	}
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// GetWebhook handles GET /v1/orgs/{org}/webhook: the URL and the signing secret.
func (s *Server) GetWebhook(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	if !requireOrg(w, r, org, tenants.ScopeAdmin) || !s.webhooksReady(w, r) {
		return
	}
	info, err := s.webhooks.Webhook(r.Context(), org)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := fromWebhook(info)
	// A console viewer reads everything but this key, with which it could forge the
	// org's webhooks.
	if c := callerOf(r).console; c != nil && !c.CanChange() && out.SigningSecret != nil {
		note := "a console viewer cannot see the signing secret; ask an admin of the org"
		out.SigningSecret, out.Note = nil, &note
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, out)
}

// ListWebhookDeliveries handles GET /v1/orgs/{org}/webhook-deliveries, newest first.
func (s *Server) ListWebhookDeliveries(w http.ResponseWriter, r *http.Request, org api.OrgPath, params api.ListWebhookDeliveriesParams) {
	if !requireOrg(w, r, org, tenants.ScopeAdmin) || !s.webhooksReady(w, r) {
		return
	}
	ds, next, err := s.webhooks.Deliveries(r.Context(), org, page(params.Limit, params.Cursor))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.WebhookDeliveryList{Items: mapSlice(ds, fromDelivery), NextCursor: nextPtr(next)})
}

// SendWebhookTest handles POST /v1/orgs/{org}/webhook/test: one signed test event,
// sent now, and what the receiver answered.
func (s *Server) SendWebhookTest(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	if !requireOrg(w, r, org, tenants.ScopeAdmin) || !s.webhooksReady(w, r) {
		return
	}
	d, err := s.webhooks.TestWebhook(r.Context(), org)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := fromTestDelivery(d)
	if err := s.tenants.RecordAudit(r.Context(), actor(r), org, "webhook.test", "org:"+org, out); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func fromTestDelivery(d webhooks.TestDelivery) api.WebhookTestResult {
	return api.WebhookTestResult{Event: webhooks.EventTest, Url: d.URL, Succeeded: d.Succeeded,
		DurationMs: d.Duration.Milliseconds(), At: d.At,
		StatusCode: nonZero(d.StatusCode), Error: nonZero(d.Error), UrlWarning: nonZero(d.URLWarning)}
}

// nonZero is v's address, or nil for the zero value: an optional field of an answer.
func nonZero[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

// noSecretNote explains a null signing_secret.
const noSecretNote = "QUOTA_WEBHOOK_SECRET is not set on this server, so no signing secret exists and no webhook is sent; ask the operator to set it (the same value on the api and the worker)"

func fromWebhook(in webhooks.WebhookInfo) api.Webhook {
	out := api.Webhook{SignatureHeader: in.SignatureHeader, Events: in.Events,
		Url: nonZero(in.URL), UrlWarning: nonZero(in.URLWarning), SigningSecret: nonZero(in.SigningSecret)}
	if in.SigningSecret == "" {
		note := noSecretNote
		out.Note = &note
	}
	return out
}

func fromDelivery(d webhooks.Delivery) api.WebhookDelivery {
	return api.WebhookDelivery{Id: d.ID, Event: d.EventType, EventId: d.EventID, Url: d.URL, Attempt: d.Attempt,
		Succeeded: d.Succeeded, At: d.AttemptedAt, StatusCode: nonZero(d.StatusCode), Error: nonZero(d.Error)}
}

func fromUsage(u billing.Usage) api.Usage {
	out := api.Usage{Org: u.Org, Period: u.Period.ID, PeriodStart: u.Period.Start, PeriodEnd: u.Period.End,
		Metrics: make([]api.MetricUsage, len(u.Metrics))}
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
		out.Metrics[i] = mu
	}
	return out
}

func fromLevelUsage(l billing.LevelUsage) api.UsageLevel {
	out := api.UsageLevel{Id: l.ID, Used: l.Used, Reserved: l.Reserved, Limits: make([]api.WindowUsage, len(l.Limits))}
	if l.Team != "" {
		team := l.Team
		out.Team = &team
	}
	for i, w := range l.Limits {
		out.Limits[i] = api.WindowUsage{Window: api.Window(w.Window), Limit: w.Limit, Used: w.Used, Remaining: w.Remaining}
		if w.Granted > 0 {
			g := w.Granted
			out.Limits[i].Granted = &g
		}
	}
	return out
}

// GetWouldBlock handles GET /v1/orgs/{org}/would-block: the shadow and warn report.
func (s *Server) GetWouldBlock(w http.ResponseWriter, r *http.Request, org api.OrgPath, params api.GetWouldBlockParams) {
	if !requireOrg(w, r, org, tenants.ScopeAdmin, tenants.ScopeBilling) || !s.billingReady(w, r) {
		return
	}
	rep, err := s.billing.WouldBlock(r.Context(), org, deref(params.Period))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fromWouldBlock(rep))
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

// AdjustUsage handles POST /v1/orgs/{org}/usage/adjustments: an operator's audited
// correction of one month counter (billing.Service.AdjustUsage).
func (s *Server) AdjustUsage(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	var in api.UsageAdjustmentCreate
	if !requireOrg(w, r, org, tenants.ScopeAdmin, tenants.ScopeBilling) || !requireOperator(w, r) ||
		!decode(w, r, &in) || !s.billingReady(w, r) {
		return
	}
	adj, err := s.billing.AdjustUsage(r.Context(), actor(r), org, toAdjustInput(in))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fromAdjustment(adj))
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
