package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/httpapi"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// mustRateLimited is the routes fixture served by a handler with the admin rate limit
// set to n per minute and a real quota engine, so checks are decided.
func mustRateLimited(t *testing.T, n int) *fixture {
	t.Helper()
	f := mustFixture(t)
	router, err := quota.NewEngines(quota.EnginesConfig{DefaultURL: testenv.RedisURL(t), RedisTimeout: testRedisTimeout,
		Engine: quota.Config{KeyPrefix: testenv.ID(t, "rl")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = router.Close() })
	f.h, err = httpapi.NewHandler(httpapi.Deps{ServeMetrics: true, Tenants: f.svc, Redis: testenv.Redis(t), Checker: router, AdminToken: operatorToken,
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), AdminRateLimit: n, AdminRateWindow: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// mintKey creates an API key of org with scopes and returns its token.
func (f *fixture) mintKey(org string, scopes ...tenants.Scope) string {
	f.t.Helper()
	_, tok, err := f.svc.CreateAPIKey(context.Background(), tenants.Actor{Name: "seed"}, org,
		tenants.APIKeyInput{Name: "k", Scopes: scopes})
	if err != nil {
		f.t.Fatal(err)
	}
	return tok
}

func TestAdminRateLimitPerCredential(t *testing.T) {
	const limit = 5
	f := mustRateLimited(t, limit)
	a, b := f.tokens["acme-admin"], f.mintKey("acme", tenants.ScopeAdmin)
	for i := range limit {
		if rec := f.do("GET", "/v1/orgs/acme/teams", a, ""); rec.Code != 200 {
			t.Fatalf("request %d of %d: %d %s", i+1, limit, rec.Code, rec.Body)
		}
	}
	before := f.fingerprint()
	for _, req := range []struct{ method, path, body string }{
		{"GET", "/v1/orgs/acme/teams", ""},
		{"PATCH", "/v1/orgs/acme/teams/eng", `{"name":"Renamed"}`},
		{"POST", "/v1/orgs/acme/teams", `{"id":"late","name":"Late"}`},
		{"DELETE", "/v1/orgs/acme/teams/tmp", ""},
		{"PATCH", "/v1/orgs/acme/teams/eng", `{"name":`}, // limited before it is validated
	} {
		rec := f.do(req.method, req.path, a, req.body)
		var p api.Problem
		if err := json.Unmarshal(rec.Body.Bytes(), &p); rec.Code != 429 || err != nil || p.Status != 429 ||
			rec.Header().Get("Content-Type") != "application/problem+json" || rec.Header().Get("Retry-After") != "60" {
			t.Errorf("%s %s over the limit: %d %v %s", req.method, req.path, rec.Code, rec.Header(), rec.Body)
		}
	}
	if f.fingerprint() != before {
		t.Errorf("a request over the limit changed the database")
	}
	// Another key of the same org, the operator, and checks with the limited key's org.
	if rec := f.do("GET", "/v1/orgs/acme/teams", b, ""); rec.Code != 200 {
		t.Errorf("another key of the org: %d %s", rec.Code, rec.Body)
	}
	if rec := f.do("GET", "/v1/orgs/acme", operatorToken, ""); rec.Code != 200 {
		t.Errorf("operator: %d %s", rec.Code, rec.Body)
	}
	check := f.mintKey("acme", tenants.ScopeCheck, tenants.ScopeAdmin)
	for i := range limit {
		if rec := f.do("GET", "/v1/orgs/acme", check, ""); rec.Code != 200 {
			t.Fatalf("admin request %d of the check key: %d", i+1, rec.Code)
		}
	}
	if rec := f.do("GET", "/v1/orgs/acme", check, ""); rec.Code != 429 {
		t.Fatalf("check key over its admin limit: %d, want 429", rec.Code)
	}
	for i := range 4 * limit {
		if rec := f.do("POST", "/v1/check", check, `{"org":"acme","team":"eng","user":"alice"}`); rec.Code != 200 {
			t.Fatalf("check %d of a key over its admin limit: %d %s", i+1, rec.Code, rec.Body)
		}
		if rec := f.do("POST", "/v1/check/batch", check, `{"checks":[{"org":"acme","team":"eng"}]}`); rec.Code != 200 ||
			strings.Contains(rec.Body.String(), `"status":429`) {
			t.Fatalf("batch %d of a key over its admin limit: %d %s", i+1, rec.Code, rec.Body)
		}
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		if rec := f.do("GET", path, check, ""); rec.Code != 200 {
			t.Errorf("%s: %d", path, rec.Code)
		}
	}
}

// Concurrent requests of one key: exactly the limit gets through, whatever the
// interleaving (run under -race).
func TestAdminRateLimitConcurrent(t *testing.T) {
	const limit, clients = 7, 24
	f := mustRateLimited(t, limit)
	keys := []string{f.tokens["acme-admin"], f.tokens["other-admin"]}
	var mu sync.Mutex
	ok := map[string]int{}
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			tok := keys[i%len(keys)]
			code := f.do("GET", "/v1/orgs/"+map[string]string{keys[0]: "acme", keys[1]: "other"}[tok], tok, "").Code
			if code != 200 && code != 429 {
				t.Errorf("status %d", code)
			}
			if code == 200 {
				mu.Lock()
				ok[tok]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, k := range keys {
		if ok[k] != limit {
			t.Errorf("%d requests of one key passed, want %d", ok[k], limit)
		}
	}
}

// With no limit configured (the zero Deps), nothing is ever limited.
func TestAdminRateLimitOff(t *testing.T) {
	f := mustFixture(t)
	for i := range 200 {
		if rec := f.do("GET", "/v1/orgs/acme", f.tokens["acme-admin"], ""); rec.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i+1, rec.Code)
		}
	}
}

// Keys are cheap to make, so a per-key admin rate limit alone would let N keys of one
// org send N x the limit (outbound webhook tests included): the org's keys and console
// users share a per-org limit too; another org and the operator do not.
func TestAdminRateLimitPerOrg(t *testing.T) {
	const perKey, perOrg = 5, 8
	f := mustRateLimited(t, perKey)
	var err error
	f.h, err = httpapi.NewHandler(httpapi.Deps{Tenants: f.svc, Redis: testenv.Redis(t), AdminToken: operatorToken,
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), AdminRateLimit: perKey, AdminRateWindow: time.Minute,
		AdminOrgRateLimit: perOrg, AdminOrgRateWindow: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{f.tokens["acme-admin"], f.mintKey("acme", tenants.ScopeAdmin), f.mintKey("acme", tenants.ScopeAdmin)}
	passed := 0
	for i := range 3 * perKey { // 15 requests over 3 keys: within each key's 5
		rec := f.do("GET", "/v1/orgs/acme/teams", keys[i%len(keys)], "")
		switch rec.Code {
		case 200:
			passed++
		case 429:
			var p api.Problem
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.ViolatedPolicies == nil ||
				(*p.ViolatedPolicies)[0] != "admin-org" || rec.Header().Get("Retry-After") == "" {
				t.Errorf("over the org's limit: %s %v", rec.Body, rec.Header())
			}
		default:
			t.Fatalf("request %d: %d %s", i+1, rec.Code, rec.Body)
		}
	}
	if passed != perOrg {
		t.Errorf("%d requests of one org's 3 keys passed, want the org's %d", passed, perOrg)
	}
	if rec := f.do("GET", "/v1/orgs/other/teams", f.tokens["other-admin"], ""); rec.Code != 200 {
		t.Errorf("another org: %d", rec.Code)
	}
	if rec := f.do("GET", "/v1/orgs/acme", operatorToken, ""); rec.Code != 200 {
		t.Errorf("the operator: %d", rec.Code)
	}
}

// An org may hold at most QUOTA_MAX_KEYS_PER_ORG active keys; one more is a 422 naming
// the cap, and writes nothing; a revoked key frees its place.
func TestKeysPerOrgAreCapped(t *testing.T) {
	f := mustFixture(t)
	svc := tenants.NewService(f.pool, tenants.WithMaxKeysPerOrg(3))
	h, err := httpapi.NewHandler(httpapi.Deps{Tenants: svc, Redis: testenv.Redis(t), AdminToken: operatorToken,
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	f.h = h
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM api_keys WHERE org_id = 'acme' AND revoked_at IS NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	var last string
	for i := n; i < 3; i++ {
		rec := f.do("POST", "/v1/orgs/acme/api-keys", operatorToken, `{"name":"k","scopes":["check"]}`)
		if rec.Code != 201 {
			t.Fatalf("key %d of 3: %d %s", i+1, rec.Code, rec.Body)
		}
		var k api.ApiKeyCreated
		_ = json.Unmarshal(rec.Body.Bytes(), &k)
		last = k.Id
	}
	before := f.fingerprint()
	rec := f.do("POST", "/v1/orgs/acme/api-keys", operatorToken, `{"name":"k","scopes":["check"]}`)
	if rec.Code != 422 || !strings.Contains(rec.Body.String(), "QUOTA_MAX_KEYS_PER_ORG") ||
		rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("a key over the cap: %d %s", rec.Code, rec.Body)
	}
	if f.fingerprint() != before {
		t.Error("a refused key changed the database")
	}
	if rec := f.do("POST", "/v1/orgs/other/api-keys", operatorToken, `{"name":"k","scopes":["check"]}`); rec.Code != 201 {
		t.Errorf("another org's key: %d %s", rec.Code, rec.Body)
	}
	if last == "" {
		t.Skip("the fixture's org already held 3 keys")
	}
	if rec := f.do("DELETE", "/v1/orgs/acme/api-keys/"+last, operatorToken, ""); rec.Code != 204 {
		t.Fatalf("revoke: %d", rec.Code)
	}
	if rec := f.do("POST", "/v1/orgs/acme/api-keys", operatorToken, `{"name":"k","scopes":["check"]}`); rec.Code != 201 {
		t.Errorf("a key after one was revoked: %d %s", rec.Code, rec.Body)
	}
}

// /metrics names orgs and their traffic; the API's handler does not serve it unless
// told to (QUOTA_METRICS_ADDR=public): by default it is 404 there, and cmd/api serves
// it on its own listener.
func TestMetricsNotOnThePublicListenerByDefault(t *testing.T) {
	f := mustFixture(t)
	h, err := httpapi.NewHandler(httpapi.Deps{Tenants: f.svc, Redis: testenv.Redis(t), AdminToken: operatorToken,
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	f.h = h
	for _, tok := range []string{"", operatorToken} {
		if rec := f.do("GET", "/metrics", tok, ""); rec.Code != 404 || rec.Header().Get("Content-Type") != "application/problem+json" ||
			strings.Contains(rec.Body.String(), "quotaplane_") {
			t.Errorf("/metrics: %d %s", rec.Code, rec.Body)
		}
	}
}
