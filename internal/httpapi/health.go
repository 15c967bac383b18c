package httpapi

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/platform/problem"
)

// Health and metrics endpoints: /healthz, /readyz, /metrics.

// Healthz answers while the process is up.
func (s *Server) Healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// Readyz answers 200 while this replica can answer checks, which it can with Postgres
// or Redis unreachable: orgs' limits are cached, and when Redis does not answer each
// plan's fail mode does (open allows, local decides per replica, closed answers 503
// with Retry-After: the caller's own answer, not a refused connection). The status is
// then "degraded" and checks names what is down. A 503 then would come from every
// replica at once, so Kubernetes would empty the Service and no fail mode would reach
// a caller. 503 only when this replica has no Redis configured at all.
func (s *Server) Readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	checks := map[string]string{"postgres": "ok", "redis": "ok"}
	state, status := "ready", http.StatusOK
	if err := s.tenants.Ping(ctx); err != nil {
		checks["postgres"], state = "unreachable", "degraded"
	}
	switch {
	case s.redis == nil:
		checks["redis"], state, status = "not configured", "not ready", problem.Status(derrors.Unavailable)
	case s.redis.Ping(ctx).Err() != nil:
		checks["redis"], state = "unreachable", "degraded"
	}
	writeJSON(w, status, map[string]any{"status": state, "checks": checks})
}

// Metrics serves the Prometheus registry when Deps.ServeMetrics says so; otherwise
// the route does not exist on this listener (404).
func (s *Server) Metrics(w http.ResponseWriter, r *http.Request) {
	if !s.metrics {
		notFound(w, r)
		return
	}
	MetricsHandler(s.registry).ServeHTTP(w, r)
}

// MetricsHandler serves reg in the Prometheus exposition format, for the api's
// metrics listener (QUOTA_METRICS_ADDR).
func MetricsHandler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}
