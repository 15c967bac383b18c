package httpapi

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/platform/problem"
)

// Health and metrics endpoints: /healthz, /readyz, /metrics.

// Healthz answers while the process is up.
func (s *Server) Healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// Readyz answers 200 when Postgres and Redis both answer within a second.
func (s *Server) Readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	checks := map[string]string{"postgres": "ok", "redis": "ok"}
	status, down := http.StatusOK, problem.Status(derrors.Unavailable)
	if err := s.tenants.Ping(ctx); err != nil {
		checks["postgres"], status = "unreachable", down
	}
	if s.redis == nil {
		checks["redis"], status = "not configured", down
	} else if err := s.redis.Ping(ctx).Err(); err != nil {
		checks["redis"], status = "unreachable", down
	}
	state := "ready"
	if status != http.StatusOK {
		state = "not ready"
	}
	writeJSON(w, status, map[string]any{"status": state, "checks": checks})
}

// Metrics serves the Prometheus registry.
func (s *Server) Metrics(w http.ResponseWriter, r *http.Request) {
	promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}).ServeHTTP(w, r)
}
