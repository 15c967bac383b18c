// Package httpapi is the HTTP layer of quotaplane-api: the /v1 REST API generated from
// api/openapi.yaml, authentication and authorization, problem+json errors, health and
// metrics. Handlers decode, convert with named converters, call the domain services
// and encode; they hold no business rules.
package httpapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/console"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/httpapi/problem"
	"github.com/quotaplane/quotaplane/internal/tenants"
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
	// AdminRateLimit requests per AdminRateWindow are allowed to each credential on
	// every /v1 route but the checks; over it, 429. 0 (the zero value) is no limit.
	AdminRateLimit  int
	AdminRateWindow time.Duration
	// TracerProvider, when set, gives every request a server span (named after its
	// route) for the engine's and Postgres's spans to nest in; nil (tracing off) adds
	// nothing to a request.
	TracerProvider trace.TracerProvider
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
	console    *console.Handler
	billing    *billing.Service
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
		console: d.Console, billing: d.Billing, adminToken: sha256.Sum256([]byte(d.AdminToken)), hasAdmin: d.AdminToken != ""}
	s.checks = checks.NewService(checks.Config{Cache: d.Cache, Engine: d.Checker, Logger: d.Logger})
	validate, err := newRequestValidator()
	if err != nil {
		return nil, fmt.Errorf("load request validator: %w", err)
	}
	m := newHTTPMetrics(d.Registry)

	r := chi.NewRouter()
	r.Use(middleware.RequestID, s.recoverer, m.middleware)
	if d.TracerProvider != nil {
		r.Use(nameSpan)
	}
	r.NotFound(notFound)
	r.MethodNotAllowed(methodNotAllowed(r))
	var app http.Handler // the console's; a nil *console.Handler would be a non-nil Handler
	if d.Console != nil {
		app = d.Console
	}
	s.routes(r, app, adminRateLimit(d.AdminRateLimit, d.AdminRateWindow), validate)
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

// principal is the authenticated caller. A console session acts as an org key of
// its org with the admin and billing scopes; a viewer's session may only read.
type principal struct {
	operator bool
	key      tenants.APIKey
	console  *console.Session
}

func (p principal) actorName() string {
	if p.operator {
		return "operator"
	}
	if p.console != nil {
		return "console:" + p.console.Email
	}
	return "key:" + p.key.ID
}

type principalKey struct{}

func callerOf(r *http.Request) principal {
	p, _ := r.Context().Value(principalKey{}).(principal)
	return p
}

func actor(r *http.Request) tenants.Actor {
	return tenants.Actor{Name: callerOf(r).actorName(), RequestID: middleware.GetReqID(r.Context())}
}

// authenticate resolves the bearer token to the operator or an org API key; any other
// token, or none, is 401. Authorization (scope, org) is each handler's.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.console != nil && r.Header.Get("Authorization") == "" {
			if p, present, ok := s.consoleSession(w, r); present {
				if ok {
					next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
				}
				return
			}
		}
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		token = strings.TrimSpace(token)
		if !ok || token == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="quotaplane"`)
			refuse(w, r, derrors.E(derrors.Unauthenticated, "missing credentials: send Authorization: Bearer <token>", nil))
			return
		}
		var p principal
		sum := sha256.Sum256([]byte(token)) // once: the operator check and the key cache both use it
		if s.hasAdmin && subtle.ConstantTimeCompare(sum[:], s.adminToken[:]) == 1 {
			p.operator = true
		} else {
			k, err := s.cache.AuthenticateHashed(r.Context(), token, sum)
			if errors.Is(err, tenants.ErrBadToken) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="quotaplane", error="invalid_token"`)
				refuse(w, r, derrors.E(derrors.Unauthenticated, "invalid, unknown or revoked token", err))
				return
			}
			if err != nil {
				s.fail(w, r, err)
				return
			}
			p.key = k
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	})
}

// consoleSession authenticates a request by its console session cookie. present is
// false when there is no cookie: the caller goes on to the bearer token. Otherwise ok
// tells whether the caller is authenticated; when it is not, the request has been
// answered: 401 for an ended session, 403 for a change without the CSRF token or by a
// viewer.
func (s *Server) consoleSession(w http.ResponseWriter, r *http.Request) (p principal, present, ok bool) {
	sess, present, err := s.console.Authenticate(r)
	switch {
	case !present:
		return principal{}, false, false
	case errors.Is(err, console.ErrNoSession):
		refuse(w, r, derrors.E(derrors.Unauthenticated, "the console session has ended: sign in again", err))
		return principal{}, true, false
	case err != nil:
		s.fail(w, r, err)
		return principal{}, true, false
	case !console.CSRFOK(r):
		refuse(w, r, derrors.E(derrors.Forbidden, "a change made with a console session needs its "+console.CSRFHeader+" header", nil))
		return principal{}, true, false
	case r.Method != http.MethodGet && r.Method != http.MethodHead && !sess.CanChange():
		refuse(w, r, derrors.E(derrors.Forbidden, "a console viewer can read but not change anything", nil))
		return principal{}, true, false
	}
	return principal{console: &sess, key: tenants.APIKey{ID: "console:" + sess.UserID, OrgID: sess.OrgID,
		Scopes: []tenants.Scope{tenants.ScopeAdmin, tenants.ScopeBilling}}}, true, true
}

// requireOperator answers 403 unless the caller is the operator.
func requireOperator(w http.ResponseWriter, r *http.Request) bool {
	if callerOf(r).operator {
		return true
	}
	refuse(w, r, derrors.E(derrors.Forbidden, "this operation needs the operator token", nil))
	return false
}

// requireOrg lets the operator through, and an org key of that org with the scope.
// A key of another org gets 404 whatever the route, so it learns nothing of the org.
func requireOrg(w http.ResponseWriter, r *http.Request, orgID string, scopes ...tenants.Scope) bool {
	p := callerOf(r)
	if p.operator {
		return true
	}
	if p.key.OrgID != orgID {
		refuse(w, r, derrors.E(derrors.NotFound, fmt.Sprintf("org %q not found", orgID), nil))
		return false
	}
	for _, sc := range scopes {
		if p.key.HasScope(sc) {
			return true
		}
	}
	names := make([]string, len(scopes))
	for i, sc := range scopes {
		names[i] = string(sc)
	}
	refuse(w, r, derrors.E(derrors.Forbidden, "this key lacks the scope this operation needs: "+strings.Join(names, " or "), nil))
	return false
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

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

type httpMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	children sync.Map // httpLabels -> httpChildren, looked up once: WithLabelValues hashes per call
}

type httpLabels struct {
	route, method string
	status        int
}

type httpChildren struct {
	requests prometheus.Counter
	duration prometheus.Observer
}

func newHTTPMetrics(reg *prometheus.Registry) *httpMetrics {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotaplane_http_requests_total", Help: "HTTP requests by route pattern, method and status.",
		}, []string{"route", "method", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "quotaplane_http_request_duration_seconds", Help: "HTTP request latency by route pattern.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"route", "method"}),
	}
	reg.MustRegister(m.requests, m.duration)
	return m
}

// metricMethod bounds the method label: a client may send any method name.
func metricMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions:
		return m
	}
	return "OTHER"
}

func (m *httpMetrics) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		next.ServeHTTP(ww, r)
		route := chi.RouteContext(r.Context()).RoutePattern()
		if route == "" {
			route = "unmatched"
		}
		l := httpLabels{route: route, method: metricMethod(r.Method), status: ww.Status()}
		v, ok := m.children.Load(l)
		if !ok {
			v = httpChildren{requests: m.requests.WithLabelValues(l.route, l.method, strconv.Itoa(l.status)),
				duration: m.duration.WithLabelValues(l.route, l.method)}
			m.children.Store(l, v)
		}
		c := v.(httpChildren)
		c.requests.Inc()
		c.duration.Observe(time.Since(start).Seconds())
	})
}
