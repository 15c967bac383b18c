package httpapi

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
)

// The HTTP metrics middleware: requests and latency by route pattern.

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

// preinitStatuses are the statuses whose request counters start at 0 for every route
// and method: the 5xx the api answers (problem.go: internal error, unavailable or
// overloaded), so the first of them on a route is a step from 0 that rate() and
// QuotaplaneHTTPErrors see, not a new series at 1 that they miss. Other statuses
// appear with their first request: bounded by routes x methods.
var preinitStatuses = []string{"500", "503"}

// preinit creates the request counters of preinitStatuses at 0 for every route and
// method of r, and of the "unmatched" route.
func (m *httpMetrics) preinit(r chi.Routes) error {
	for _, st := range preinitStatuses {
		m.requests.WithLabelValues("unmatched", http.MethodGet, st)
	}
	return chi.Walk(r, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		for _, st := range preinitStatuses {
			m.requests.WithLabelValues(route, metricMethod(method), st)
		}
		return nil
	})
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
		var ww interface {
			http.ResponseWriter
			Status() int
		}
		if st := stateOf(r.Context()); st != nil { // the request state's writer: no allocation
			st.w = statusWriter{ResponseWriter: w}
			ww = &st.w
		} else {
			ww = middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		}
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
