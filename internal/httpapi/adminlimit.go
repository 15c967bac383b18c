package httpapi

import (
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/httprate"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/platform/problem"
)

// adminRateLimit limits each credential to n requests per window on the admin group
// of routes (see routes), before the request is validated or served: a runaway script
// or a leaked key cannot flood the admin API and Postgres behind it. The checks are
// the hot path, already bounded per org by the engine, and are in another group. Counters
// live in this replica (httprate's sliding window), so N replicas admit up to N times
// n; it is a guard against floods, not a quota. n <= 0 disables it.
//
// Its headers follow the checks' convention: RateLimit-Limit, RateLimit-Remaining and
// RateLimit-Reset in seconds (httprate's X-RateLimit-Reset is a unix time); on a 429,
// RateLimit-Reset equals Retry-After, when a retry can succeed. Beside them (as mode
// says) the draft-11 fields of one policy, "admin": RateLimit-Policy "admin";q=n;w=
// the window's seconds, and RateLimit "admin";r=remaining;t=reset; a 429's problem
// document names it in violated-policies.
func adminRateLimit(n int, window time.Duration, mode checks.HeaderMode) func(http.Handler) http.Handler {
	if n <= 0 {
		return func(next http.Handler) http.Handler { return next }
	}
	if window <= 0 {
		window = time.Second
	}
	policy := []string{`"admin";q=` + strconv.Itoa(n) + `;w=` + strconv.FormatInt(max(int64(window/time.Second), 1), 10)}
	// fields turns httprate's legacy headers into what mode asks for. httprate and
	// Header.Set write them under Go's canonical key ("Ratelimit-Limit"); they are
	// moved to the map key spelled as the contract and the check routes spell it
	// (RateLimit-Limit), which net/http writes as it is.
	fields := func(h http.Header) {
		rem, err1 := strconv.Atoi(h.Get("RateLimit-Remaining"))
		reset, err2 := strconv.Atoi(h.Get("RateLimit-Reset"))
		if mode.Draft() && err1 == nil && err2 == nil {
			h["RateLimit-Policy"] = policy
			h["RateLimit"] = []string{`"admin";r=` + strconv.Itoa(max(rem, 0)) + `;t=` + strconv.Itoa(max(reset, 0))}
		}
		for _, name := range [...]string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"} {
			canonical := http.CanonicalHeaderKey(name)
			if v, ok := h[canonical]; ok {
				delete(h, canonical)
				if mode.Legacy() {
					h[name] = v
				}
			}
		}
	}
	limiter := httprate.NewRateLimiter(n, window,
		httprate.WithKeyFuncs(func(r *http.Request) (string, error) { return rateKey(callerOf(r)), nil }),
		httprate.WithResponseHeaders(httprate.ResponseHeaders{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining",
			RetryAfter: "Retry-After"}), // Reset: set below, in seconds
		httprate.WithLimitHandler(func(w http.ResponseWriter, r *http.Request) {
			// httprate has set Retry-After: the window, in seconds, after which its
			// sliding window has forgotten every request of this one.
			retry := w.Header().Get("Retry-After")
			w.Header().Set("RateLimit-Reset", retry)
			fields(w.Header())
			d := problem.From(derrors.E(derrors.RateLimited, "too many requests with these credentials; retry after "+retry+" s", nil))
			d.ViolatedPolicies = []string{"admin"}
			problem.WriteDocument(w, d)
		}))
	return func(next http.Handler) http.Handler {
		limited := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fields(w.Header()) // httprate has set the legacy headers
			next.ServeHTTP(w, r)
		}))
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// Seconds until httprate's current window ends (its windows are aligned to
			// the clock), where the limit counts afresh; the limit handler overrides it.
			now := time.Now()
			end := now.Truncate(window).Add(window)
			w.Header().Set("RateLimit-Reset", strconv.FormatInt(int64(math.Ceil(end.Sub(now).Seconds())), 10))
			limited.ServeHTTP(w, r)
		})
	}
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

// adminOrgRateLimit limits each org to n requests per window on the admin group,
// whichever of its keys and console users sends them, after the per-credential limit:
// keys are cheap to make, so a per-key limit alone would let one org send N keys x the
// limit, outbound webhook tests included (the keys per org are capped too,
// tenants.WithMaxKeysPerOrg). The operator has no org and is not counted. Like the
// per-credential limit it is this replica's (N replicas admit up to N times n), and n
// <= 0 disables it. Its answers carry only Retry-After; a 429's problem document names
// the policy "admin-org" in violated-policies.
func adminOrgRateLimit(n int, window time.Duration) func(http.Handler) http.Handler {
	if n <= 0 {
		return func(next http.Handler) http.Handler { return next }
	}
	if window <= 0 {
		window = time.Second
	}
	limiter := httprate.NewRateLimiter(n, window,
		httprate.WithKeyFuncs(func(r *http.Request) (string, error) { return callerOf(r).key.OrgID, nil }),
		httprate.WithResponseHeaders(httprate.ResponseHeaders{RetryAfter: "Retry-After"}),
		httprate.WithLimitHandler(func(w http.ResponseWriter, r *http.Request) {
			retry := w.Header().Get("Retry-After")
			d := problem.From(derrors.E(derrors.RateLimited, "too many requests for this organization, from all its keys and console users together; retry after "+retry+" s", nil))
			d.ViolatedPolicies = []string{"admin-org"}
			problem.WriteDocument(w, d)
		}))
	return func(next http.Handler) http.Handler {
		limited := limiter.Handler(next)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if p := callerOf(r); p.operator || p.key.OrgID == "" {
				next.ServeHTTP(w, r)
				return
			}
			limited.ServeHTTP(w, r)
		})
	}
}
