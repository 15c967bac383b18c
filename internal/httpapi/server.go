package httpapi

import (
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/console"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/problem"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/webhooks"
)

// MaxBodyBytes caps every request body.
const MaxBodyBytes = 1 << 20

// Deps is what the HTTP layer needs.
type Deps struct {
	Tenants    *tenants.Service
	Cache      *tenants.Cache        // resolved orgs and keys; a private one when nil
	Checker    checks.Engine         // decides /v1/check and holds reservations; nil answers 503
	Redis      redis.UniversalClient // for /readyz
	AdminToken string                // empty disables the operator API
	Logger     *slog.Logger
	Registry   *prometheus.Registry // /metrics; a new one when nil
	Console    *console.Handler     // serves /console/ and accepts its session cookie; nil disables both
	Billing    *billing.Service     // usage and billing exports; nil answers 503
	Webhooks   *webhooks.Service    // the webhook API; nil answers 503
	// AdminRateLimit requests per AdminRateWindow are allowed to each credential on
	// every /v1 route but the checks; over it, 429. 0 (the zero value) is no limit.
	AdminRateLimit  int
	AdminRateWindow time.Duration
	// AdminOrgRateLimit requests per AdminOrgRateWindow are allowed to each org, all
	// its keys and console users together, on the same routes; 0 is no limit.
	AdminOrgRateLimit  int
	AdminOrgRateWindow time.Duration
	// ServeMetrics serves GET /metrics on this handler, beside the API
	// (QUOTA_METRICS_ADDR=public). Off (the default), /metrics is 404 here and the api
	// serves MetricsHandler on its own listener (QUOTA_METRICS_ADDR): the metrics name
	// orgs and their traffic, which the public listener must not show.
	ServeMetrics bool
	// TracerProvider, when set, gives every request a server span (named after its
	// route) for the engine's and Postgres's spans to nest in; nil (tracing off) adds
	// nothing to a request.
	TracerProvider trace.TracerProvider
	// RateLimitHeaders says which RateLimit header fields checks and reservations
	// carry (QUOTA_RATELIMIT_HEADERS); the zero value is both generations.
	RateLimitHeaders checks.HeaderMode
}

// Server implements the generated api.ServerInterface.
type Server struct {
	tenants    *tenants.Service
	cache      *tenants.Cache
	checks     *checks.Service // every check and reservation
	redis      redis.UniversalClient
	adminToken [32]byte // SHA-256 of the operator token, so comparison leaks no length
	hasAdmin   bool
	log        *slog.Logger
	registry   *prometheus.Registry
	metrics    bool // serve /metrics (Deps.ServeMetrics)
	console    *console.Handler
	billing    *billing.Service
	webhooks   *webhooks.Service
	headers    checks.HeaderMode // which RateLimit header fields answers carry
}

var _ api.ServerInterface = (*Server)(nil)

// NewHandler returns the complete HTTP handler of the api.
func NewHandler(d Deps) (http.Handler, error) {
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if d.Registry == nil {
		d.Registry = prometheus.NewRegistry()
	}
	if d.Cache == nil {
		d.Cache = tenants.NewCache(d.Tenants, tenants.CacheOptions{Logger: d.Logger})
	}
	s := &Server{tenants: d.Tenants, cache: d.Cache, redis: d.Redis, log: d.Logger, registry: d.Registry,
		console: d.Console, billing: d.Billing, webhooks: d.Webhooks, adminToken: sha256.Sum256([]byte(d.AdminToken)), hasAdmin: d.AdminToken != "",
		headers: d.RateLimitHeaders, metrics: d.ServeMetrics}
	s.checks = checks.NewService(checks.Config{Cache: d.Cache, Engine: d.Checker, Logger: d.Logger})
	validate, err := newRequestValidator()
	if err != nil {
		return nil, fmt.Errorf("load request validator: %w", err)
	}
	m := newHTTPMetrics(d.Registry)

	r := chi.NewRouter()
	r.Use(begin, s.recoverer, m.middleware) // begin: chi's RequestID, one allocation with the others (reqstate.go)
	if d.TracerProvider != nil {
		r.Use(nameSpan)
	}
	r.NotFound(notFound)
	r.MethodNotAllowed(methodNotAllowed(r))
	var app http.Handler // the console's; a nil *console.Handler would be a non-nil Handler
	if d.Console != nil {
		app = d.Console
	}
	if err := s.routes(r, app, validate, adminRateLimit(d.AdminRateLimit, d.AdminRateWindow, d.RateLimitHeaders),
		adminOrgRateLimit(d.AdminOrgRateLimit, d.AdminOrgRateWindow)); err != nil {
		return nil, err
	}
	if err := m.preinit(r); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if d.TracerProvider != nil {
		return traced(r, d.TracerProvider), nil
	}
	return r, nil
}

func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil && v != http.ErrAbortHandler {
				s.fail(w, r, fmt.Errorf("panic in handler: %v", v)) // logged there, with the request id
			}
		}()
		next.ServeHTTP(w, r)
	})
}

func limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > MaxBodyBytes {
			refuse(w, r, errTooLarge)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
		next.ServeHTTP(w, r)
	})
}

// writeJSON answers v as JSON, <, > and & as they are (problem.Encoder): names a
// caller chose read as given, and nosniff keeps a browser from taking them for HTML.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = problem.Encoder(w).Encode(v)
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
