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
	f.h, err = httpapi.NewHandler(httpapi.Deps{Tenants: f.svc, Redis: testenv.Redis(t), Checker: router, AdminToken: operatorToken,
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
