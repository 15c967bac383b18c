package httpapi

import (
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/httprate"

	"github.com/quotaplane/quotaplane/internal/derrors"
)

// adminRateLimit limits each credential to n requests per window on every /v1 route
// except the checks, before the request is validated or served: a runaway script or a
// leaked key cannot flood the admin API and Postgres behind it. The checks are the hot
// path, already bounded per org by the engine, and must never wait on this. Counters
// live in this replica (httprate's sliding window), so N replicas admit up to N times
// n; it is a guard against floods, not a quota. n <= 0 disables it.
func adminRateLimit(n int, window time.Duration) func(http.Handler) http.Handler {
	if n <= 0 {
		return func(next http.Handler) http.Handler { return next }
	}
	if window <= 0 {
		window = time.Second
	}
	limiter := httprate.NewRateLimiter(n, window,
		httprate.WithKeyFuncs(func(r *http.Request) (string, error) { return rateKey(callerOf(r)), nil }),
		httprate.WithLimitHandler(func(w http.ResponseWriter, r *http.Request) {
			// httprate has set Retry-After (the window, in seconds) and X-RateLimit-*.
			refuse(w, r, derrors.E(derrors.RateLimited, "too many requests with these credentials; retry after "+
				w.Header().Get("Retry-After")+" s", nil))
		}))
	return func(next http.Handler) http.Handler {
		limited := limiter.Handler(next)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !rateLimited(r) {
				next.ServeHTTP(w, r)
				return
			}
			limited.ServeHTTP(w, r)
		})
	}
}

// rateLimited tells whether r counts against its caller's admin rate limit: an
// authenticated request to /v1 other than the checks.
func rateLimited(r *http.Request) bool {
	if !strings.HasPrefix(r.URL.Path, "/v1/") || r.URL.Path == "/v1/check" || r.URL.Path == "/v1/check/batch" {
		return false
	}
	_, ok := r.Context().Value(principalKey{}).(principal)
	return ok
}

// rateKey names the credential: the operator token, an API key by id, or a console
// user (every session of one person shares the limit).
func rateKey(p principal) string {
	switch {
	case p.operator:
		return "operator"
	case p.console != nil:
		return "console:" + p.console.UserID
	default:
		return "key:" + p.key.ID
	}
}
