package httpapi

import (
	"fmt"
	"net/http"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
)

// Billing exports: one org's, or every org's (the operator's).

// ExportOrgBilling handles GET /v1/orgs/{org}/billing/export.
func (s *Server) ExportOrgBilling(w http.ResponseWriter, r *http.Request, org api.OrgPath, params api.ExportOrgBillingParams) {
	if !s.billingReady(w, r) {
		return
	}
	s.export(w, r, org, deref(params.Period), params.Format)
}

// ExportBilling handles GET /v1/billing/export.
func (s *Server) ExportBilling(w http.ResponseWriter, r *http.Request, params api.ExportBillingParams) {
	if !s.billingReady(w, r) {
		return
	}
	s.export(w, r, "", deref(params.Period), params.Format)
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
