package httpapi

import (
	"net/http"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/redact"
	"github.com/quotaplane/quotaplane/internal/webhooks"
)

// An org's webhook: its URL and signing secret, its deliveries, a test event.

// GetWebhook handles GET /v1/orgs/{org}/webhook: the URL and the signing secret.
func (s *Server) GetWebhook(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	if !s.webhooksReady(w, r) {
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
	if c := callerOf(r).console; c != nil && !c.CanChange() && out.Url != nil {
		u := redact.WebhookURL(*out.Url) // nor the URL's credentials
		out.Url = &u
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, out)
}

// ListWebhookDeliveries handles GET /v1/orgs/{org}/webhook-deliveries, newest first.
func (s *Server) ListWebhookDeliveries(w http.ResponseWriter, r *http.Request, org api.OrgPath, params api.ListWebhookDeliveriesParams) {
	if !s.webhooksReady(w, r) {
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
	if !s.webhooksReady(w, r) {
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

// RotateWebhookSecret handles POST /v1/orgs/{org}/webhook/secret/rotate: a new random
// signing secret, shown this once; the previous one signs beside it for a day.
func (s *Server) RotateWebhookSecret(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	if !s.webhooksReady(w, r) {
		return
	}
	rot, err := s.webhooks.RotateSecret(r.Context(), actor(r), org)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, api.WebhookSecretRotation{SigningSecret: rot.Secret, PreviousExpiresAt: rot.PreviousUntil})
}

func fromTestDelivery(d webhooks.TestDelivery) api.WebhookTestResult {
	return api.WebhookTestResult{Event: webhooks.EventTest, Url: d.URL, Succeeded: d.Succeeded,
		DurationMs: d.Duration.Milliseconds(), At: d.At,
		StatusCode: nonZero(d.StatusCode), Error: nonZero(d.Error), UrlWarning: nonZero(d.URLWarning)}
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
