package httpapi

import (
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// traced wraps h in an OpenTelemetry server span per request (otelhttp), from tp.
// The api is a public endpoint: a caller's traceparent is linked, not adopted as the
// parent, so a client can neither join the operator's traces nor force them sampled.
func traced(h http.Handler, tp trace.TracerProvider) http.Handler {
	return otelhttp.NewHandler(h, "quotaplane-api",
		otelhttp.WithTracerProvider(tp),
		otelhttp.WithPropagators(propagation.TraceContext{}),
		otelhttp.WithPublicEndpointFn(func(*http.Request) bool { return true }),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method }),
		otelhttp.WithFilter(untracedPath))
}

// untracedPath leaves out what probes and scrapers call every few seconds.
func untracedPath(r *http.Request) bool {
	switch r.URL.Path {
	case "/healthz", "/readyz", "/metrics":
		return false
	}
	return true
}

// nameSpan names the request's span after the route chi matched ("POST /v1/check",
// "GET /v1/orgs/{org}"), known only once routing is done, and records the request id
// the logs carry. It is installed only with tracing on.
func nameSpan(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r)
		span := trace.SpanFromContext(r.Context())
		if !span.IsRecording() {
			return
		}
		if rc := chi.RouteContext(r.Context()); rc != nil {
			if p := rc.RoutePattern(); p != "" {
				span.SetName(r.Method + " " + p)
				span.SetAttributes(attribute.String("http.route", p))
			}
		}
		if id := middleware.GetReqID(r.Context()); id != "" {
			span.SetAttributes(attribute.String("quotaplane.request_id", id))
		}
	})
}
