package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/httpapi"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
	"github.com/quotaplane/quotaplane/internal/webhooks"
)

const operatorToken = "test-operator-token-0123456789"

// fixture is a running handler on a fresh database with two orgs.
type fixture struct {
	t       *testing.T
	h       http.Handler
	pool    *pgxpool.Pool
	svc     *tenants.Service
	logs    *bytes.Buffer
	tokens  map[string]string // name -> bearer token
	oldKey  string            // id of a key to revoke
	consoID string            // id of a console user
	grantID string            // id of a grant of acme, made when first asked for (grant)
	capID   string            // id of a capacity, made when first asked for (capacity)
}

func lim(metric string, w vocab.Window, n int64) vocab.Limit {
	return vocab.Limit{Metric: metric, Window: w, Limit: n}
}

func mustFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	svc := tenants.NewService(pool, tenants.WithPasswordCost(64, 1))
	logs := &bytes.Buffer{}
	// A quota engine on its own key prefix, so the routes that read the org's Redis
	// (its open reservations, usage, a counter adjustment) answer as in production
	// rather than 503.
	router, err := quota.NewEngines(quota.EnginesConfig{DefaultURL: testenv.RedisURL(t), RedisTimeout: testRedisTimeout,
		Engine: quota.Config{KeyPrefix: testenv.ID(t, "fx")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = router.Close() })
	h, err := httpapi.NewHandler(httpapi.Deps{ServeMetrics: true, Tenants: svc, Checker: router, Redis: testenv.Redis(t), AdminToken: operatorToken,
		Logger:   slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Billing:  &billing.Service{Store: billing.NewStore(pool), Tenants: svc, Counters: ledger.EngineCounters(router)},
		Webhooks: &webhooks.Service{Store: webhooks.NewStore(pool), Tenants: svc, Secret: []byte("routes-test-webhook-secret")}})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, h: h, pool: pool, svc: svc, logs: logs, tokens: map[string]string{"operator": operatorToken, "none": "", "bogus": "qpk_0000000000000000_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}}
	seed := tenants.Actor{Name: "seed"}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err = svc.CreatePlan(ctx, seed, tenants.PlanInput{ID: "pro", Name: "Pro", FailMode: vocab.FailOpen,
		Limits: []vocab.Limit{lim("requests", vocab.Month, 1000), lim("requests", vocab.Minute, 100)}})
	must(err)
	_, err = svc.CreatePlan(ctx, seed, tenants.PlanInput{ID: "free", Name: "Free", FailMode: vocab.FailClosed})
	must(err)
	for _, org := range []string{"acme", "other"} {
		_, err = svc.CreateOrg(ctx, seed, tenants.OrgInput{ID: org, Name: org, PlanID: "pro"})
		must(err)
		_, tok, err := svc.CreateAPIKey(ctx, seed, org, tenants.APIKeyInput{Name: "admin", Scopes: []tenants.Scope{tenants.ScopeAdmin}})
		must(err)
		f.tokens[org+"-admin"] = tok
	}
	_, tok, err := svc.CreateAPIKey(ctx, seed, "acme", tenants.APIKeyInput{Name: "check", Scopes: []tenants.Scope{tenants.ScopeCheck}})
	must(err)
	f.tokens["acme-check"] = tok
	old, _, err := svc.CreateAPIKey(ctx, seed, "acme", tenants.APIKeyInput{Name: "old", Scopes: []tenants.Scope{tenants.ScopeCheck}})
	must(err)
	f.oldKey = old.ID
	_, err = svc.CreateTeam(ctx, seed, "acme", tenants.TeamInput{ID: "eng", Name: "Eng", Limits: []vocab.Limit{lim("requests", vocab.Month, 600)}})
	must(err)
	_, err = svc.CreateTeam(ctx, seed, "acme", tenants.TeamInput{ID: "tmp", Name: "Tmp"})
	must(err)
	for _, u := range []string{"alice", "dave"} {
		_, err = svc.CreateUser(ctx, seed, "acme", "eng", tenants.UserInput{ID: u, Limits: []vocab.Limit{lim("requests", vocab.Month, 100)}})
		must(err)
	}
	cu, err := svc.CreateConsoleUser(ctx, seed, "acme", tenants.ConsoleUserInput{Email: "ada@acme.test", Password: "correct horse battery", Role: tenants.RoleAdmin})
	must(err)
	f.consoID = cu.ID
	return f
}

func (f *fixture) do(method, path, token, body string) *httptest.ResponseRecorder {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, rd)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, req)
	return rec
}

// acmeRequests is org acme's requests counters, holds included, as a check of cost 0
// with key sees them: level, window, used and remaining of each.
func (f *fixture) acmeRequests(key string) string {
	f.t.Helper()
	rec := f.do("POST", "/v1/check", key, `{"org":"acme","metric":"requests","cost":0}`)
	var out api.CheckResult
	if err := json.Unmarshal(rec.Body.Bytes(), &out); rec.Code != 200 || err != nil {
		f.t.Fatalf("check of cost 0 = %d %s", rec.Code, rec.Body)
	}
	var s strings.Builder
	for _, l := range out.Levels {
		fmt.Fprintf(&s, "%s/%s:%d:%d ", l.Id, l.Window, l.Used, l.Remaining)
	}
	return s.String()
}

// fingerprint hashes every row of every table of the tenancy model, except the
// last_used_at stamp that authentication itself refreshes.
func (f *fixture) fingerprint() string {
	f.t.Helper()
	var out strings.Builder
	for _, q := range []string{
		"SELECT t::text FROM plans t", "SELECT t::text FROM plan_limits t", "SELECT t::text FROM plan_prices t",
		"SELECT t::text FROM orgs t", "SELECT t::text FROM org_limits t", "SELECT t::text FROM teams t",
		"SELECT t::text FROM team_limits t", "SELECT t::text FROM users t", "SELECT t::text FROM user_limits t",
		"SELECT (id, org_id, name, prefix, digest, scopes, created_at, revoked_at)::text FROM api_keys",
		"SELECT t::text FROM console_users t", "SELECT t::text FROM audit_log t", "SELECT t::text FROM grants t",
		"SELECT t::text FROM throttles t", "SELECT t::text FROM capacities t",
	} {
		var s *string
		if err := f.pool.QueryRow(context.Background(), "SELECT md5(string_agg(x, ',' ORDER BY x)) FROM ("+q+") AS r(x)").Scan(&s); err != nil {
			f.t.Fatal(err)
		}
		if s != nil {
			out.WriteString(*s)
		}
		out.WriteString("|")
	}
	return out.String()
}

// grant returns the id of a grant of 10 requests to acme, made on the first call
// only: a grant raises acme's month limit, which the other cases must not see.
func (f *fixture) grant() string {
	f.t.Helper()
	if f.grantID == "" {
		g, err := f.svc.CreateGrant(context.Background(), tenants.Actor{Name: "seed"}, "acme",
			tenants.GrantInput{Metric: "requests", Units: 10, Reason: "seed"})
		if err != nil {
			f.t.Fatal(err)
		}
		f.grantID = g.ID
	}
	return f.grantID
}

// capacity returns the id of a capacity of 1000 tokens a minute, made on the first
// call only: acme's checks of tokens would draw on it.
func (f *fixture) capacity() string {
	f.t.Helper()
	if f.capID == "" {
		c, err := f.svc.CreateCapacity(context.Background(), tenants.Actor{Name: "seed"},
			tenants.CapacityInput{ID: "seeded", Metric: "tokens", Window: vocab.Minute, Limit: 1000})
		if err != nil {
			f.t.Fatal(err)
		}
		f.capID = c.ID
	}
	return f.capID
}

func (f *fixture) auditRows() int {
	var n int
	if err := f.pool.QueryRow(context.Background(), "SELECT count(*) FROM audit_log").Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

type routeCase struct {
	name   string
	op     string // operationId, for the coverage check
	method string
	path   string // {old} and {cu} are replaced with the fixture's ids
	token  string // fixture token name
	body   string
	want   int
}

const (
	planBody = `{"id":"team-plan","name":"Team","limits":[{"metric":"requests","window":"month","limit":50}],"fail_mode":"local"}`
	limit700 = `[{"metric":"requests","window":"month","limit":700}]`
)

// routeCases drive every route of API.md's plans, orgs, keys, console users, audit,
// teams and users sections, and the org's webhook settings and delivery log. They run in order against one fixture.
func routeCases() []routeCase {
	soon := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	return []routeCase{
		// Plans (operator).
		{"create", "createPlan", "POST", "/v1/plans", "operator", planBody, 201},
		{"malformed", "createPlan", "POST", "/v1/plans", "operator", `{"id":`, 400},
		{"unknown field", "createPlan", "POST", "/v1/plans", "operator", `{"id":"p2","name":"x","limits":[],"fail_mode":"open","owner":"me"}`, 400},
		{"bad id", "createPlan", "POST", "/v1/plans", "operator", `{"id":"-p","name":"x","limits":[],"fail_mode":"open"}`, 400},
		{"bad window", "createPlan", "POST", "/v1/plans", "operator", `{"id":"p2","name":"x","limits":[{"metric":"requests","window":"week","limit":1}],"fail_mode":"open"}`, 400},
		{"repeated limit", "createPlan", "POST", "/v1/plans", "operator", `{"id":"p2","name":"x","limits":[{"metric":"r","window":"day","limit":1},{"metric":"r","window":"day","limit":2}],"fail_mode":"open"}`, 400},
		{"no token", "createPlan", "POST", "/v1/plans", "none", planBody, 401},
		{"unknown token", "createPlan", "POST", "/v1/plans", "bogus", planBody, 401},
		{"org key", "createPlan", "POST", "/v1/plans", "acme-admin", planBody, 403},
		{"duplicate", "createPlan", "POST", "/v1/plans", "operator", strings.Replace(planBody, "team-plan", "pro", 1), 409},
		{"list", "listPlans", "GET", "/v1/plans?limit=1", "operator", "", 200},
		{"bad cursor", "listPlans", "GET", "/v1/plans?cursor=!!", "operator", "", 400},
		{"no token", "listPlans", "GET", "/v1/plans", "none", "", 401},
		{"org key", "listPlans", "GET", "/v1/plans", "acme-admin", "", 403},
		{"get", "getPlan", "GET", "/v1/plans/pro", "operator", "", 200},
		{"missing", "getPlan", "GET", "/v1/plans/nope", "operator", "", 404},
		{"bad id", "getPlan", "GET", "/v1/plans/-x", "operator", "", 400},
		{"no token", "getPlan", "GET", "/v1/plans/pro", "none", "", 401},
		{"org key", "getPlan", "GET", "/v1/plans/pro", "acme-admin", "", 403},
		{"patch", "patchPlan", "PATCH", "/v1/plans/pro", "operator", `{"name":"Pro II"}`, 200},
		{"malformed", "patchPlan", "PATCH", "/v1/plans/pro", "operator", `{"name":`, 400},
		{"unknown field", "patchPlan", "PATCH", "/v1/plans/pro", "operator", `{"nam":"x"}`, 400},
		{"no token", "patchPlan", "PATCH", "/v1/plans/pro", "none", `{"name":"x"}`, 401},
		{"org key", "patchPlan", "PATCH", "/v1/plans/pro", "acme-admin", `{"name":"x"}`, 403},
		{"missing", "patchPlan", "PATCH", "/v1/plans/nope", "operator", `{"name":"x"}`, 404},
		{"below an org's teams", "patchPlan", "PATCH", "/v1/plans/pro", "operator", `{"limits":[{"metric":"requests","window":"month","limit":500}]}`, 422},
		{"weight", "patchPlan", "PATCH", "/v1/plans/pro", "operator", `{"weight":4}`, 200},
		{"weight 0", "patchPlan", "PATCH", "/v1/plans/pro", "operator", `{"weight":0}`, 400},
		{"weight 1001", "patchPlan", "PATCH", "/v1/plans/pro", "operator", `{"weight":1001}`, 400},
		{"weight 1001", "createPlan", "POST", "/v1/plans", "operator", `{"id":"p3","name":"x","limits":[],"fail_mode":"open","weight":1001}`, 400},
		{"fair_share on a month", "patchPlan", "PATCH", "/v1/plans/pro", "operator", `{"limits":[{"metric":"requests","window":"month","limit":1000,"fair_share":true}]}`, 400},

		// Capacities (operator).
		{"create", "createCapacity", "POST", "/v1/capacities", "operator", `{"id":"gpu","metric":"tokens","window":"minute","limit":1000}`, 201},
		{"duplicate", "createCapacity", "POST", "/v1/capacities", "operator", `{"id":"gpu","metric":"tokens","window":"minute","limit":1000}`, 409},
		{"saturation 0", "createCapacity", "POST", "/v1/capacities", "operator", `{"id":"c2","metric":"tokens","window":"minute","limit":10,"saturation":0}`, 400},
		{"saturation above 1", "createCapacity", "POST", "/v1/capacities", "operator", `{"id":"c2","metric":"tokens","window":"minute","limit":10,"saturation":1.2}`, 400},
		{"month window", "createCapacity", "POST", "/v1/capacities", "operator", `{"id":"c2","metric":"tokens","window":"month","limit":10}`, 400},
		{"limit 0", "createCapacity", "POST", "/v1/capacities", "operator", `{"id":"c2","metric":"tokens","window":"minute","limit":0}`, 400},
		{"bad metric", "createCapacity", "POST", "/v1/capacities", "operator", `{"id":"c2","metric":"to|kens","window":"minute","limit":10}`, 400},
		{"unknown field", "createCapacity", "POST", "/v1/capacities", "operator", `{"id":"c2","metric":"tokens","window":"minute","limit":10,"org":"acme"}`, 400},
		{"no token", "createCapacity", "POST", "/v1/capacities", "none", `{"id":"c2","metric":"tokens","window":"minute","limit":10}`, 401},
		{"org key", "createCapacity", "POST", "/v1/capacities", "acme-admin", `{"id":"c2","metric":"tokens","window":"minute","limit":10}`, 403},
		{"list", "listCapacities", "GET", "/v1/capacities?limit=1", "operator", "", 200},
		{"no token", "listCapacities", "GET", "/v1/capacities", "none", "", 401},
		{"org key", "listCapacities", "GET", "/v1/capacities", "acme-admin", "", 403},
		{"get", "getCapacity", "GET", "/v1/capacities/gpu", "operator", "", 200},
		{"missing", "getCapacity", "GET", "/v1/capacities/nope", "operator", "", 404},
		{"no token", "getCapacity", "GET", "/v1/capacities/gpu", "none", "", 401},
		{"org key", "getCapacity", "GET", "/v1/capacities/gpu", "acme-admin", "", 403},
		{"patch", "patchCapacity", "PATCH", "/v1/capacities/gpu", "operator", `{"limit":2000,"saturation":0.9}`, 200},
		{"window is fixed", "patchCapacity", "PATCH", "/v1/capacities/gpu", "operator", `{"window":"hour"}`, 400},
		{"saturation 0", "patchCapacity", "PATCH", "/v1/capacities/gpu", "operator", `{"saturation":0}`, 400},
		{"missing", "patchCapacity", "PATCH", "/v1/capacities/nope", "operator", `{"limit":5}`, 404},
		{"no token", "patchCapacity", "PATCH", "/v1/capacities/gpu", "none", `{"limit":5}`, 401},
		{"org key", "patchCapacity", "PATCH", "/v1/capacities/gpu", "acme-admin", `{"limit":5}`, 403},
		{"no token", "deleteCapacity", "DELETE", "/v1/capacities/gpu", "none", "", 401},
		{"org key", "deleteCapacity", "DELETE", "/v1/capacities/gpu", "acme-admin", "", 403},
		{"delete", "deleteCapacity", "DELETE", "/v1/capacities/gpu", "operator", "", 204},
		{"missing", "deleteCapacity", "DELETE", "/v1/capacities/gpu", "operator", "", 404},

		// Throttles: a plan's (operator), an org's (its admin or the operator).
		{"put", "putPlanThrottle", "PUT", "/v1/plans/free/throttle", "operator", `{"factor":0.5,"ttl_seconds":600,"reason":"database failover"}`, 200},
		{"replace", "putPlanThrottle", "PUT", "/v1/plans/free/throttle", "operator", `{"factor":0.25,"expires_at":"` + soon + `","reason":"still failing over","month":true}`, 200},
		{"factor 0", "putPlanThrottle", "PUT", "/v1/plans/free/throttle", "operator", `{"factor":0,"ttl_seconds":600,"reason":"x"}`, 400},
		{"factor above 1", "putPlanThrottle", "PUT", "/v1/plans/free/throttle", "operator", `{"factor":1.5,"ttl_seconds":600,"reason":"x"}`, 400},
		{"factor too fine", "putPlanThrottle", "PUT", "/v1/plans/free/throttle", "operator", `{"factor":0.0000001,"ttl_seconds":600,"reason":"x"}`, 400},
		{"factor a string", "putPlanThrottle", "PUT", "/v1/plans/free/throttle", "operator", `{"factor":"half","ttl_seconds":600,"reason":"x"}`, 400},
		{"expiry and ttl", "putPlanThrottle", "PUT", "/v1/plans/free/throttle", "operator", `{"factor":0.5,"ttl_seconds":600,"expires_at":"` + soon + `","reason":"x"}`, 400},
		{"expired", "putPlanThrottle", "PUT", "/v1/plans/free/throttle", "operator", `{"factor":0.5,"expires_at":"2001-02-03T04:05:06Z","reason":"x"}`, 400},
		{"beyond 7 days", "putPlanThrottle", "PUT", "/v1/plans/free/throttle", "operator", `{"factor":0.5,"ttl_seconds":604801,"reason":"x"}`, 400},
		{"no reason", "putPlanThrottle", "PUT", "/v1/plans/free/throttle", "operator", `{"factor":0.5,"ttl_seconds":600}`, 400},
		{"empty reason", "putPlanThrottle", "PUT", "/v1/plans/free/throttle", "operator", `{"factor":0.5,"ttl_seconds":600,"reason":""}`, 400},
		{"blank reason", "putPlanThrottle", "PUT", "/v1/plans/free/throttle", "operator", `{"factor":0.5,"ttl_seconds":600,"reason":"  "}`, 400},
		{"unknown field", "putPlanThrottle", "PUT", "/v1/plans/free/throttle", "operator", `{"factor":0.5,"ttl_seconds":600,"reason":"x","scope":"org"}`, 400},
		{"no token", "putPlanThrottle", "PUT", "/v1/plans/free/throttle", "none", `{"factor":0.5,"ttl_seconds":600,"reason":"database failover"}`, 401},
		{"org key", "putPlanThrottle", "PUT", "/v1/plans/free/throttle", "acme-admin", `{"factor":0.5,"ttl_seconds":600,"reason":"database failover"}`, 403},
		{"missing", "putPlanThrottle", "PUT", "/v1/plans/nope/throttle", "operator", `{"factor":0.5,"ttl_seconds":600,"reason":"database failover"}`, 404},
		{"get", "getPlanThrottle", "GET", "/v1/plans/free/throttle", "operator", "", 200},
		{"no token", "getPlanThrottle", "GET", "/v1/plans/free/throttle", "none", "", 401},
		{"org key", "getPlanThrottle", "GET", "/v1/plans/free/throttle", "acme-admin", "", 403},
		{"none", "getPlanThrottle", "GET", "/v1/plans/pro/throttle", "operator", "", 204},
		{"missing plan", "getPlanThrottle", "GET", "/v1/plans/nope/throttle", "operator", "", 404},
		{"no token", "deletePlanThrottle", "DELETE", "/v1/plans/free/throttle", "none", "", 401},
		{"org key", "deletePlanThrottle", "DELETE", "/v1/plans/free/throttle", "acme-admin", "", 403},
		{"delete", "deletePlanThrottle", "DELETE", "/v1/plans/free/throttle", "operator", "", 204},
		{"again", "deletePlanThrottle", "DELETE", "/v1/plans/free/throttle", "operator", "", 404},
		{"gone", "getPlanThrottle", "GET", "/v1/plans/free/throttle", "operator", "", 204},
		{"put", "putOrgThrottle", "PUT", "/v1/orgs/acme/throttle", "acme-admin", `{"factor":0.5,"ttl_seconds":600,"reason":"database failover"}`, 200},
		{"as operator", "putOrgThrottle", "PUT", "/v1/orgs/acme/throttle", "operator", `{"factor":0.5,"ttl_seconds":600,"reason":"database failover"}`, 200},
		{"bad factor", "putOrgThrottle", "PUT", "/v1/orgs/acme/throttle", "acme-admin", `{"factor":-1,"ttl_seconds":600,"reason":"x"}`, 400},
		{"no token", "putOrgThrottle", "PUT", "/v1/orgs/acme/throttle", "none", `{"factor":0.5,"ttl_seconds":600,"reason":"database failover"}`, 401},
		{"check scope", "putOrgThrottle", "PUT", "/v1/orgs/acme/throttle", "acme-check", `{"factor":0.5,"ttl_seconds":600,"reason":"database failover"}`, 403},
		// money: an org's rate card, the operator's
		{"get", "getOrgRates", "GET", "/v1/orgs/acme/rates", "operator", "", 200},
		{"no token", "getOrgRates", "GET", "/v1/orgs/acme/rates", "none", "", 401},
		{"org key", "getOrgRates", "GET", "/v1/orgs/acme/rates", "acme-admin", "", 403},
		{"missing org", "getOrgRates", "GET", "/v1/orgs/nope/rates", "operator", "", 404},
		{"put", "putOrgRates", "PUT", "/v1/orgs/acme/rates", "operator", `{"rates":[]}`, 200},
		{"no token", "putOrgRates", "PUT", "/v1/orgs/acme/rates", "none", `{"rates":[]}`, 401},
		{"org key", "putOrgRates", "PUT", "/v1/orgs/acme/rates", "acme-admin", `{"rates":[]}`, 403},
		{"bad price", "putOrgRates", "PUT", "/v1/orgs/acme/rates", "operator", `{"rates":[{"metric":"t","price":"-1","per":1}]}`, 400},
		{"another org's key", "putOrgThrottle", "PUT", "/v1/orgs/acme/throttle", "other-admin", `{"factor":0.5,"ttl_seconds":600,"reason":"database failover"}`, 404},
		{"get", "getOrgThrottle", "GET", "/v1/orgs/acme/throttle", "acme-admin", "", 200},
		{"no token", "getOrgThrottle", "GET", "/v1/orgs/acme/throttle", "none", "", 401},
		{"another org's key", "getOrgThrottle", "GET", "/v1/orgs/acme/throttle", "other-admin", "", 404},
		{"none", "getOrgThrottle", "GET", "/v1/orgs/other/throttle", "other-admin", "", 204},
		{"missing org", "getOrgThrottle", "GET", "/v1/orgs/nope/throttle", "operator", "", 404},
		{"no token", "deleteOrgThrottle", "DELETE", "/v1/orgs/acme/throttle", "none", "", 401},
		{"another org's key", "deleteOrgThrottle", "DELETE", "/v1/orgs/acme/throttle", "other-admin", "", 404},
		{"delete", "deleteOrgThrottle", "DELETE", "/v1/orgs/acme/throttle", "acme-admin", "", 204},
		{"again", "deleteOrgThrottle", "DELETE", "/v1/orgs/acme/throttle", "acme-admin", "", 404},

		// Entitlements (features_test.go goes further).
		{"resolved", "getEntitlements", "GET", "/v1/entitlements?org=acme", "acme-check", "", 200},
		{"no token", "getEntitlements", "GET", "/v1/entitlements?org=acme", "none", "", 401},
		{"another org's key", "getEntitlements", "GET", "/v1/entitlements?org=acme", "other-admin", "", 404},
		{"admin scope only", "getEntitlements", "GET", "/v1/entitlements?org=acme", "acme-admin", "", 403},
		{"get", "getOrgFeatures", "GET", "/v1/orgs/acme/features", "acme-admin", "", 200},
		{"no token", "getOrgFeatures", "GET", "/v1/orgs/acme/features", "none", "", 401},
		{"another org's key", "getOrgFeatures", "GET", "/v1/orgs/acme/features", "other-admin", "", 404},
		{"as operator", "putOrgFeatures", "PUT", "/v1/orgs/acme/features", "operator", `{"features":{"sso":true}}`, 200},
		{"no token", "putOrgFeatures", "PUT", "/v1/orgs/acme/features", "none", `{"features":{"sso":true}}`, 401},
		{"org admin", "putOrgFeatures", "PUT", "/v1/orgs/acme/features", "acme-admin", `{"features":{"sso":true}}`, 403},
		{"another org's key", "putOrgFeatures", "PUT", "/v1/orgs/acme/features", "other-admin", `{"features":{"sso":true}}`, 404},
		{"missing org", "putOrgFeatures", "PUT", "/v1/orgs/nope/features", "operator", `{"features":{}}`, 404},

		// Orgs.
		{"create", "createOrg", "POST", "/v1/orgs", "operator", `{"id":"globex","name":"Globex","plan":"free"}`, 201},
		{"malformed", "createOrg", "POST", "/v1/orgs", "operator", `[]`, 400},
		{"unknown field", "createOrg", "POST", "/v1/orgs", "operator", `{"id":"o2","name":"x","plan":"free","tier":"gold"}`, 400},
		{"bad id", "createOrg", "POST", "/v1/orgs", "operator", `{"id":"o 2","name":"x","plan":"free"}`, 400},
		{"unknown plan", "createOrg", "POST", "/v1/orgs", "operator", `{"id":"o2","name":"x","plan":"gold"}`, 400},
		{"no token", "createOrg", "POST", "/v1/orgs", "none", `{"id":"o2","name":"x","plan":"free"}`, 401},
		{"org key", "createOrg", "POST", "/v1/orgs", "acme-admin", `{"id":"o2","name":"x","plan":"free"}`, 403},
		{"duplicate", "createOrg", "POST", "/v1/orgs", "operator", `{"id":"acme","name":"x","plan":"free"}`, 409},
		{"list", "listOrgs", "GET", "/v1/orgs", "operator", "", 200},
		{"no token", "listOrgs", "GET", "/v1/orgs", "none", "", 401},
		{"org key", "listOrgs", "GET", "/v1/orgs", "acme-admin", "", 403},
		{"get as operator", "getOrg", "GET", "/v1/orgs/acme", "operator", "", 200},
		{"get as admin", "getOrg", "GET", "/v1/orgs/acme", "acme-admin", "", 200},
		{"bad id", "getOrg", "GET", "/v1/orgs/a%20b", "operator", "", 400},
		{"no token", "getOrg", "GET", "/v1/orgs/acme", "none", "", 401},
		{"check scope", "getOrg", "GET", "/v1/orgs/acme", "acme-check", "", 403},
		{"another org's key", "getOrg", "GET", "/v1/orgs/acme", "other-admin", "", 404},
		{"missing", "getOrg", "GET", "/v1/orgs/nope", "operator", "", 404},
		{"patch mode as admin", "patchOrg", "PATCH", "/v1/orgs/acme", "acme-admin", `{"mode":"shadow"}`, 200},
		{"weight as admin", "patchOrg", "PATCH", "/v1/orgs/acme", "acme-admin", `{"weight":5}`, 403},
		{"weight 0", "patchOrg", "PATCH", "/v1/orgs/acme", "operator", `{"weight":0}`, 400},
		{"weight", "patchOrg", "PATCH", "/v1/orgs/acme", "operator", `{"weight":5}`, 200},
		{"weight null", "patchOrg", "PATCH", "/v1/orgs/acme", "operator", `{"weight":null}`, 200},
		{"fair_share", "patchOrg", "PATCH", "/v1/orgs/acme", "operator", `{"limits":[{"metric":"requests","window":"month","limit":1000},{"metric":"requests","window":"minute","limit":1000,"fair_share":true}]}`, 200},
		{"plan as admin", "patchOrg", "PATCH", "/v1/orgs/acme", "acme-admin", `{"plan":"free"}`, 403},
		{"limits as admin", "patchOrg", "PATCH", "/v1/orgs/acme", "acme-admin", `{"limits":[]}`, 403},
		{"malformed", "patchOrg", "PATCH", "/v1/orgs/acme", "acme-admin", `{`, 400},
		{"unknown field", "patchOrg", "PATCH", "/v1/orgs/acme", "acme-admin", `{"id":"x"}`, 400},
		{"bad mode", "patchOrg", "PATCH", "/v1/orgs/acme", "acme-admin", `{"mode":"loud"}`, 400},
		{"no token", "patchOrg", "PATCH", "/v1/orgs/acme", "none", `{"mode":"warn"}`, 401},
		{"check scope", "patchOrg", "PATCH", "/v1/orgs/acme", "acme-check", `{"mode":"warn"}`, 403},
		{"another org's key", "patchOrg", "PATCH", "/v1/orgs/acme", "other-admin", `{"mode":"warn"}`, 404},
		{"override below teams", "patchOrg", "PATCH", "/v1/orgs/acme", "operator", `{"limits":[{"metric":"requests","window":"month","limit":100}]}`, 422},

		// API keys.
		{"create", "createApiKey", "POST", "/v1/orgs/acme/api-keys", "acme-admin", `{"name":"ci","scopes":["check"]}`, 201},
		{"malformed", "createApiKey", "POST", "/v1/orgs/acme/api-keys", "acme-admin", `{"name"}`, 400},
		{"unknown field", "createApiKey", "POST", "/v1/orgs/acme/api-keys", "acme-admin", `{"name":"ci","scopes":["check"],"secret":"mine"}`, 400},
		{"bad scope", "createApiKey", "POST", "/v1/orgs/acme/api-keys", "acme-admin", `{"name":"ci","scopes":["root"]}`, 400},
		{"bad org id", "createApiKey", "POST", "/v1/orgs/-acme/api-keys", "operator", `{"name":"ci","scopes":["check"]}`, 400},
		{"no token", "createApiKey", "POST", "/v1/orgs/acme/api-keys", "none", `{"name":"ci","scopes":["check"]}`, 401},
		{"check scope", "createApiKey", "POST", "/v1/orgs/acme/api-keys", "acme-check", `{"name":"ci","scopes":["admin"]}`, 403},
		{"another org's key", "createApiKey", "POST", "/v1/orgs/acme/api-keys", "other-admin", `{"name":"ci","scopes":["check"]}`, 404},
		{"list", "listApiKeys", "GET", "/v1/orgs/acme/api-keys", "acme-admin", "", 200},
		{"no token", "listApiKeys", "GET", "/v1/orgs/acme/api-keys", "none", "", 401},
		{"check scope", "listApiKeys", "GET", "/v1/orgs/acme/api-keys", "acme-check", "", 403},
		{"another org's key", "listApiKeys", "GET", "/v1/orgs/acme/api-keys", "other-admin", "", 404},
		{"revoke", "revokeApiKey", "DELETE", "/v1/orgs/acme/api-keys/{old}", "acme-admin", "", 204},
		{"no token", "revokeApiKey", "DELETE", "/v1/orgs/acme/api-keys/{old}", "none", "", 401},
		{"check scope", "revokeApiKey", "DELETE", "/v1/orgs/acme/api-keys/{old}", "acme-check", "", 403},
		{"another org's key", "revokeApiKey", "DELETE", "/v1/orgs/acme/api-keys/{old}", "other-admin", "", 404},
		{"through another org", "revokeApiKey", "DELETE", "/v1/orgs/other/api-keys/{old}", "operator", "", 404},
		{"bad id", "revokeApiKey", "DELETE", "/v1/orgs/acme/api-keys/-k", "acme-admin", "", 400},

		// Console users.
		{"create", "createConsoleUser", "POST", "/v1/orgs/acme/console-users", "acme-admin", `{"email":"bo@acme.test","password":"a long enough secret","role":"viewer"}`, 201},
		{"malformed", "createConsoleUser", "POST", "/v1/orgs/acme/console-users", "acme-admin", `{"email":1}`, 400},
		{"unknown field", "createConsoleUser", "POST", "/v1/orgs/acme/console-users", "acme-admin", `{"email":"c@acme.test","password":"a long enough secret","role":"viewer","org":"other"}`, 400},
		{"short password", "createConsoleUser", "POST", "/v1/orgs/acme/console-users", "acme-admin", `{"email":"c@acme.test","password":"short","role":"viewer"}`, 400},
		{"no token", "createConsoleUser", "POST", "/v1/orgs/acme/console-users", "none", `{"email":"c@acme.test","password":"a long enough secret","role":"viewer"}`, 401},
		{"check scope", "createConsoleUser", "POST", "/v1/orgs/acme/console-users", "acme-check", `{"email":"c@acme.test","password":"a long enough secret","role":"viewer"}`, 403},
		{"another org's key", "createConsoleUser", "POST", "/v1/orgs/acme/console-users", "other-admin", `{"email":"c@acme.test","password":"a long enough secret","role":"viewer"}`, 404},
		{"duplicate email", "createConsoleUser", "POST", "/v1/orgs/acme/console-users", "acme-admin", `{"email":"ADA@acme.test","password":"a long enough secret","role":"viewer"}`, 409},
		// emails are unique per org; another org's answer must not tell that one exists
		{"another org's email", "createConsoleUser", "POST", "/v1/orgs/other/console-users", "other-admin", `{"email":"ada@acme.test","password":"a long enough secret","role":"viewer"}`, 201},
		{"list", "listConsoleUsers", "GET", "/v1/orgs/acme/console-users", "acme-admin", "", 200},
		{"no token", "listConsoleUsers", "GET", "/v1/orgs/acme/console-users", "none", "", 401},
		{"check scope", "listConsoleUsers", "GET", "/v1/orgs/acme/console-users", "acme-check", "", 403},
		{"another org's key", "listConsoleUsers", "GET", "/v1/orgs/acme/console-users", "other-admin", "", 404},
		{"get", "getConsoleUser", "GET", "/v1/orgs/acme/console-users/{cu}", "acme-admin", "", 200},
		{"no token", "getConsoleUser", "GET", "/v1/orgs/acme/console-users/{cu}", "none", "", 401},
		{"check scope", "getConsoleUser", "GET", "/v1/orgs/acme/console-users/{cu}", "acme-check", "", 403},
		{"another org's key", "getConsoleUser", "GET", "/v1/orgs/acme/console-users/{cu}", "other-admin", "", 404},
		{"through another org", "getConsoleUser", "GET", "/v1/orgs/other/console-users/{cu}", "operator", "", 404},
		{"no token", "deleteConsoleUser", "DELETE", "/v1/orgs/acme/console-users/{cu}", "none", "", 401},
		{"check scope", "deleteConsoleUser", "DELETE", "/v1/orgs/acme/console-users/{cu}", "acme-check", "", 403},
		{"another org's key", "deleteConsoleUser", "DELETE", "/v1/orgs/acme/console-users/{cu}", "other-admin", "", 404},
		{"delete", "deleteConsoleUser", "DELETE", "/v1/orgs/acme/console-users/{cu}", "acme-admin", "", 204},
		{"gone", "deleteConsoleUser", "DELETE", "/v1/orgs/acme/console-users/{cu}", "acme-admin", "", 404},

		// Audit.
		{"list", "listAudit", "GET", "/v1/orgs/acme/audit?limit=5", "acme-admin", "", 200},
		{"bad limit", "listAudit", "GET", "/v1/orgs/acme/audit?limit=0", "acme-admin", "", 400},
		{"no token", "listAudit", "GET", "/v1/orgs/acme/audit", "none", "", 401},
		{"check scope", "listAudit", "GET", "/v1/orgs/acme/audit", "acme-check", "", 403},
		{"another org's key", "listAudit", "GET", "/v1/orgs/acme/audit", "other-admin", "", 404},

		// Webhook settings and delivery log (admin).
		{"get", "getWebhook", "GET", "/v1/orgs/acme/webhook", "acme-admin", "", 200},
		{"get as operator", "getWebhook", "GET", "/v1/orgs/acme/webhook", "operator", "", 200},
		{"no token", "getWebhook", "GET", "/v1/orgs/acme/webhook", "none", "", 401},
		{"check scope", "getWebhook", "GET", "/v1/orgs/acme/webhook", "acme-check", "", 403},
		{"another org's key", "getWebhook", "GET", "/v1/orgs/acme/webhook", "other-admin", "", 404},
		{"missing", "getWebhook", "GET", "/v1/orgs/nope/webhook", "operator", "", 404},
		{"no url to test", "sendWebhookTest", "POST", "/v1/orgs/acme/webhook/test", "acme-admin", "", 422},
		{"no token", "sendWebhookTest", "POST", "/v1/orgs/acme/webhook/test", "none", "", 401},
		{"check scope", "sendWebhookTest", "POST", "/v1/orgs/acme/webhook/test", "acme-check", "", 403},
		{"another org's key", "sendWebhookTest", "POST", "/v1/orgs/acme/webhook/test", "other-admin", "", 404},
		{"missing", "sendWebhookTest", "POST", "/v1/orgs/nope/webhook/test", "operator", "", 404},
		{"rotate", "rotateWebhookSecret", "POST", "/v1/orgs/acme/webhook/secret/rotate", "acme-admin", "", 200},
		{"rotate as operator", "rotateWebhookSecret", "POST", "/v1/orgs/acme/webhook/secret/rotate", "operator", "", 200},
		{"no token", "rotateWebhookSecret", "POST", "/v1/orgs/acme/webhook/secret/rotate", "none", "", 401},
		{"check scope", "rotateWebhookSecret", "POST", "/v1/orgs/acme/webhook/secret/rotate", "acme-check", "", 403},
		{"another org's key", "rotateWebhookSecret", "POST", "/v1/orgs/acme/webhook/secret/rotate", "other-admin", "", 404},
		{"missing", "rotateWebhookSecret", "POST", "/v1/orgs/nope/webhook/secret/rotate", "operator", "", 404},
		{"set a url to test", "patchOrg", "PATCH", "/v1/orgs/acme", "acme-admin", `{"webhook_url":"http://127.0.0.1:9/hook"}`, 200},
		{"refused loopback", "sendWebhookTest", "POST", "/v1/orgs/acme/webhook/test", "acme-admin", "", 200},
		{"no url again", "patchOrg", "PATCH", "/v1/orgs/acme", "acme-admin", `{"webhook_url":""}`, 200},
		{"list", "listWebhookDeliveries", "GET", "/v1/orgs/acme/webhook-deliveries?limit=10", "acme-admin", "", 200},
		{"bad limit", "listWebhookDeliveries", "GET", "/v1/orgs/acme/webhook-deliveries?limit=0", "acme-admin", "", 400},
		{"bad cursor", "listWebhookDeliveries", "GET", "/v1/orgs/acme/webhook-deliveries?cursor=!!", "acme-admin", "", 400},
		{"no token", "listWebhookDeliveries", "GET", "/v1/orgs/acme/webhook-deliveries", "none", "", 401},
		{"report", "getWouldBlock", "GET", "/v1/orgs/acme/would-block", "acme-admin", "", 200},
		{"report of a period", "getWouldBlock", "GET", "/v1/orgs/acme/would-block?period=2026-01", "operator", "", 200},
		{"bad period", "getWouldBlock", "GET", "/v1/orgs/acme/would-block?period=2026-1", "acme-admin", "", 400},
		{"no token", "getWouldBlock", "GET", "/v1/orgs/acme/would-block", "none", "", 401},
		{"check scope", "getWouldBlock", "GET", "/v1/orgs/acme/would-block", "acme-check", "", 403},
		{"another org's key", "getWouldBlock", "GET", "/v1/orgs/acme/would-block", "other-admin", "", 404},
		{"missing", "getWouldBlock", "GET", "/v1/orgs/nope/would-block", "operator", "", 404},
		{"check scope", "listWebhookDeliveries", "GET", "/v1/orgs/acme/webhook-deliveries", "acme-check", "", 403},
		{"another org's key", "listWebhookDeliveries", "GET", "/v1/orgs/acme/webhook-deliveries", "other-admin", "", 404},
		{"missing", "listWebhookDeliveries", "GET", "/v1/orgs/nope/webhook-deliveries", "operator", "", 404},

		// Teams.
		{"create", "createTeam", "POST", "/v1/orgs/acme/teams", "acme-admin", `{"id":"ops","name":"Ops","limits":[{"metric":"requests","window":"month","limit":300}],"user_limits":[{"metric":"requests","window":"month","limit":30}]}`, 201},
		{"malformed", "createTeam", "POST", "/v1/orgs/acme/teams", "acme-admin", `{"id":"x",}`, 400},
		{"unknown field", "createTeam", "POST", "/v1/orgs/acme/teams", "acme-admin", `{"id":"x","name":"X","budget":5}`, 400},
		{"bad id", "createTeam", "POST", "/v1/orgs/acme/teams", "acme-admin", `{"id":"x/y","name":"X"}`, 400},
		{"weight 0", "createTeam", "POST", "/v1/orgs/acme/teams", "acme-admin", `{"id":"x","name":"X","weight":0}`, 400},
		{"weight 1001", "createTeam", "POST", "/v1/orgs/acme/teams", "acme-admin", `{"id":"x","name":"X","weight":1001}`, 400},
		{"fair_share on a team", "createTeam", "POST", "/v1/orgs/acme/teams", "acme-admin", `{"id":"x","name":"X","limits":[{"metric":"requests","window":"minute","limit":5,"fair_share":true}]}`, 400},
		{"negative limit", "createTeam", "POST", "/v1/orgs/acme/teams", "acme-admin", `{"id":"x","name":"X","limits":[{"metric":"requests","window":"month","limit":-1}]}`, 400},
		{"no token", "createTeam", "POST", "/v1/orgs/acme/teams", "none", `{"id":"x","name":"X"}`, 401},
		{"check scope", "createTeam", "POST", "/v1/orgs/acme/teams", "acme-check", `{"id":"x","name":"X"}`, 403},
		{"another org's key", "createTeam", "POST", "/v1/orgs/acme/teams", "other-admin", `{"id":"x","name":"X"}`, 404},
		{"duplicate", "createTeam", "POST", "/v1/orgs/acme/teams", "acme-admin", `{"id":"eng","name":"Eng"}`, 409},
		{"over the org", "createTeam", "POST", "/v1/orgs/acme/teams", "acme-admin", `{"id":"x","name":"X","limits":[{"metric":"requests","window":"month","limit":101}]}`, 422},
		{"list", "listTeams", "GET", "/v1/orgs/acme/teams", "acme-admin", "", 200},
		{"no token", "listTeams", "GET", "/v1/orgs/acme/teams", "none", "", 401},
		{"check scope", "listTeams", "GET", "/v1/orgs/acme/teams", "acme-check", "", 403},
		{"another org's key", "listTeams", "GET", "/v1/orgs/acme/teams", "other-admin", "", 404},
		{"get", "getTeam", "GET", "/v1/orgs/acme/teams/eng", "acme-admin", "", 200},
		{"missing", "getTeam", "GET", "/v1/orgs/acme/teams/nope", "acme-admin", "", 404},
		{"no token", "getTeam", "GET", "/v1/orgs/acme/teams/eng", "none", "", 401},
		{"check scope", "getTeam", "GET", "/v1/orgs/acme/teams/eng", "acme-check", "", 403},
		{"another org's key", "getTeam", "GET", "/v1/orgs/acme/teams/eng", "other-admin", "", 404},
		{"patch", "patchTeam", "PATCH", "/v1/orgs/acme/teams/eng", "acme-admin", `{"name":"Engineering"}`, 200},
		{"weight", "patchTeam", "PATCH", "/v1/orgs/acme/teams/eng", "acme-admin", `{"weight":3}`, 200},
		{"weight 1001", "patchTeam", "PATCH", "/v1/orgs/acme/teams/eng", "acme-admin", `{"weight":1001}`, 400},
		{"malformed", "patchTeam", "PATCH", "/v1/orgs/acme/teams/eng", "acme-admin", `nope`, 400},
		{"unknown field", "patchTeam", "PATCH", "/v1/orgs/acme/teams/eng", "acme-admin", `{"org":"other"}`, 400},
		{"no token", "patchTeam", "PATCH", "/v1/orgs/acme/teams/eng", "none", `{"name":"E"}`, 401},
		{"check scope", "patchTeam", "PATCH", "/v1/orgs/acme/teams/eng", "acme-check", `{"name":"E"}`, 403},
		{"another org's key", "patchTeam", "PATCH", "/v1/orgs/acme/teams/eng", "other-admin", `{"name":"E"}`, 404},
		{"missing", "patchTeam", "PATCH", "/v1/orgs/acme/teams/nope", "acme-admin", `{"name":"E"}`, 404},
		{"over the org", "patchTeam", "PATCH", "/v1/orgs/acme/teams/eng", "acme-admin", `{"limits":[{"metric":"requests","window":"month","limit":701}]}`, 422},
		{"below its users", "patchTeam", "PATCH", "/v1/orgs/acme/teams/eng", "acme-admin", `{"limits":[{"metric":"requests","window":"month","limit":150}]}`, 422},
		{"no token", "deleteTeam", "DELETE", "/v1/orgs/acme/teams/tmp", "none", "", 401},
		{"check scope", "deleteTeam", "DELETE", "/v1/orgs/acme/teams/tmp", "acme-check", "", 403},
		{"another org's key", "deleteTeam", "DELETE", "/v1/orgs/acme/teams/tmp", "other-admin", "", 404},
		{"delete", "deleteTeam", "DELETE", "/v1/orgs/acme/teams/tmp", "acme-admin", "", 204},
		{"missing", "deleteTeam", "DELETE", "/v1/orgs/acme/teams/tmp", "acme-admin", "", 404},

		// Users.
		{"create", "createUser", "POST", "/v1/orgs/acme/teams/eng/users", "acme-admin", `{"id":"bob@acme.test"}`, 201},
		{"malformed", "createUser", "POST", "/v1/orgs/acme/teams/eng/users", "acme-admin", `"bob"`, 400},
		{"unknown field", "createUser", "POST", "/v1/orgs/acme/teams/eng/users", "acme-admin", `{"id":"carol","team":"ops"}`, 400},
		{"bad id", "createUser", "POST", "/v1/orgs/acme/teams/eng/users", "acme-admin", `{"id":""}`, 400},
		{"no token", "createUser", "POST", "/v1/orgs/acme/teams/eng/users", "none", `{"id":"carol"}`, 401},
		{"check scope", "createUser", "POST", "/v1/orgs/acme/teams/eng/users", "acme-check", `{"id":"carol"}`, 403},
		{"another org's key", "createUser", "POST", "/v1/orgs/acme/teams/eng/users", "other-admin", `{"id":"carol"}`, 404},
		{"missing team", "createUser", "POST", "/v1/orgs/acme/teams/nope/users", "acme-admin", `{"id":"carol"}`, 404},
		{"duplicate", "createUser", "POST", "/v1/orgs/acme/teams/ops/users", "acme-admin", `{"id":"alice"}`, 409},
		{"over the team", "createUser", "POST", "/v1/orgs/acme/teams/eng/users", "acme-admin", `{"id":"carol","limits":[{"metric":"requests","window":"month","limit":401}]}`, 422},
		{"list", "listUsers", "GET", "/v1/orgs/acme/teams/eng/users", "acme-admin", "", 200},
		{"no token", "listUsers", "GET", "/v1/orgs/acme/teams/eng/users", "none", "", 401},
		{"check scope", "listUsers", "GET", "/v1/orgs/acme/teams/eng/users", "acme-check", "", 403},
		{"another org's key", "listUsers", "GET", "/v1/orgs/acme/teams/eng/users", "other-admin", "", 404},
		{"get", "getUser", "GET", "/v1/orgs/acme/teams/eng/users/alice", "acme-admin", "", 200},
		{"in another team", "getUser", "GET", "/v1/orgs/acme/teams/ops/users/alice", "acme-admin", "", 404},
		{"no token", "getUser", "GET", "/v1/orgs/acme/teams/eng/users/alice", "none", "", 401},
		{"check scope", "getUser", "GET", "/v1/orgs/acme/teams/eng/users/alice", "acme-check", "", 403},
		{"another org's key", "getUser", "GET", "/v1/orgs/acme/teams/eng/users/alice", "other-admin", "", 404},
		{"patch", "patchUser", "PATCH", "/v1/orgs/acme/teams/eng/users/alice", "acme-admin", `{"limits":[{"metric":"requests","window":"month","limit":150}]}`, 200},
		{"malformed", "patchUser", "PATCH", "/v1/orgs/acme/teams/eng/users/alice", "acme-admin", `{"limits":{}}`, 400},
		{"unknown field", "patchUser", "PATCH", "/v1/orgs/acme/teams/eng/users/alice", "acme-admin", `{"id":"alicia"}`, 400},
		{"no token", "patchUser", "PATCH", "/v1/orgs/acme/teams/eng/users/alice", "none", `{"limits":[]}`, 401},
		{"check scope", "patchUser", "PATCH", "/v1/orgs/acme/teams/eng/users/alice", "acme-check", `{"limits":[]}`, 403},
		{"another org's key", "patchUser", "PATCH", "/v1/orgs/acme/teams/eng/users/alice", "other-admin", `{"limits":[]}`, 404},
		{"over the team", "patchUser", "PATCH", "/v1/orgs/acme/teams/eng/users/alice", "acme-admin", `{"limits":` + limit700 + `}`, 422},
		{"no token", "deleteUser", "DELETE", "/v1/orgs/acme/teams/eng/users/dave", "none", "", 401},
		{"check scope", "deleteUser", "DELETE", "/v1/orgs/acme/teams/eng/users/dave", "acme-check", "", 403},
		{"another org's key", "deleteUser", "DELETE", "/v1/orgs/acme/teams/eng/users/dave", "other-admin", "", 404},
		{"delete", "deleteUser", "DELETE", "/v1/orgs/acme/teams/eng/users/dave", "acme-admin", "", 204},
		{"missing", "deleteUser", "DELETE", "/v1/orgs/acme/teams/eng/users/dave", "acme-admin", "", 404},

		// Open reservations: read like usage (operator, admin or billing).
		{"list", "listOpenReservations", "GET", "/v1/orgs/acme/reservations", "acme-admin", "", 200},
		{"list by the operator", "listOpenReservations", "GET", "/v1/orgs/acme/reservations?team=eng&user=alice&limit=100", "operator", "", 200},
		{"no token", "listOpenReservations", "GET", "/v1/orgs/acme/reservations", "none", "", 401},
		{"check key", "listOpenReservations", "GET", "/v1/orgs/acme/reservations", "acme-check", "", 403},
		{"another org's key", "listOpenReservations", "GET", "/v1/orgs/acme/reservations", "other-admin", "", 404},
		{"unknown org", "listOpenReservations", "GET", "/v1/orgs/nope/reservations", "operator", "", 404},
		{"limit 0", "listOpenReservations", "GET", "/v1/orgs/acme/reservations?limit=0", "acme-admin", "", 400},
		{"limit 101", "listOpenReservations", "GET", "/v1/orgs/acme/reservations?limit=101", "acme-admin", "", 400},
		{"bad team", "listOpenReservations", "GET", "/v1/orgs/acme/reservations?team=%20x", "acme-admin", "", 400},

		// Counter adjustments: the operator's alone (their effect: numbers_test.go).
		{"adjust", "adjustUsage", "POST", "/v1/orgs/acme/usage/adjustments", "operator", adjustBody, 200},
		{"no token", "adjustUsage", "POST", "/v1/orgs/acme/usage/adjustments", "none", adjustBody, 401},
		{"org admin key", "adjustUsage", "POST", "/v1/orgs/acme/usage/adjustments", "acme-admin", adjustBody, 403},
		{"another org's key", "adjustUsage", "POST", "/v1/orgs/acme/usage/adjustments", "other-admin", adjustBody, 404},
		{"past the bound", "adjustUsage", "POST", "/v1/orgs/acme/usage/adjustments", "operator", `{"metric":"requests","set":1125899906842625,"reason":"x"}`, 400},

		// Grants: created and revoked by the operator only, read by the org. Last, as
		// they raise acme's month limit.
		{"create", "createGrant", "POST", "/v1/orgs/acme/grants", "operator", grantBody, 201},
		{"until", "createGrant", "POST", "/v1/orgs/acme/grants", "operator", `{"metric":"requests","units":5,"reason":"migration","until":"` + time.Now().Add(48*time.Hour).UTC().Format(time.RFC3339) + `"}`, 201},
		{"no token", "createGrant", "POST", "/v1/orgs/acme/grants", "none", grantBody, 401},
		{"org admin key", "createGrant", "POST", "/v1/orgs/acme/grants", "acme-admin", grantBody, 403},
		{"another org's key", "createGrant", "POST", "/v1/orgs/acme/grants", "other-admin", grantBody, 404},
		{"unknown org", "createGrant", "POST", "/v1/orgs/nope/grants", "operator", grantBody, 404},
		{"unknown metric", "createGrant", "POST", "/v1/orgs/acme/grants", "operator", `{"metric":"tokens","units":5,"reason":"x"}`, 422},
		{"zero units", "createGrant", "POST", "/v1/orgs/acme/grants", "operator", `{"metric":"requests","units":0,"reason":"x"}`, 400},
		{"no reason", "createGrant", "POST", "/v1/orgs/acme/grants", "operator", `{"metric":"requests","units":5}`, 400},
		{"blank reason", "createGrant", "POST", "/v1/orgs/acme/grants", "operator", `{"metric":"requests","units":5,"reason":"  "}`, 400},
		{"past until", "createGrant", "POST", "/v1/orgs/acme/grants", "operator", `{"metric":"requests","units":5,"reason":"x","until":"2001-02-03T04:05:06Z"}`, 400},
		{"bad until", "createGrant", "POST", "/v1/orgs/acme/grants", "operator", `{"metric":"requests","units":5,"reason":"x","until":"tomorrow"}`, 400},
		{"list", "listGrants", "GET", "/v1/orgs/acme/grants", "acme-admin", "", 200},
		{"list by the operator", "listGrants", "GET", "/v1/orgs/acme/grants?limit=1", "operator", "", 200},
		{"no token", "listGrants", "GET", "/v1/orgs/acme/grants", "none", "", 401},
		{"check key", "listGrants", "GET", "/v1/orgs/acme/grants", "acme-check", "", 403},
		{"another org's key", "listGrants", "GET", "/v1/orgs/acme/grants", "other-admin", "", 404},
		{"no token", "revokeGrant", "DELETE", "/v1/orgs/acme/grants/{grant}", "none", "", 401},
		{"org admin key", "revokeGrant", "DELETE", "/v1/orgs/acme/grants/{grant}", "acme-admin", "", 403},
		{"another org's key", "revokeGrant", "DELETE", "/v1/orgs/acme/grants/{grant}", "other-admin", "", 404},
		{"through another org", "revokeGrant", "DELETE", "/v1/orgs/other/grants/{grant}", "operator", "", 404},
		{"revoke", "revokeGrant", "DELETE", "/v1/orgs/acme/grants/{grant}", "operator", "", 204},
		{"missing", "revokeGrant", "DELETE", "/v1/orgs/acme/grants/gr_nope", "operator", "", 404},
	}
}

const grantBody = `{"metric":"requests","units":50,"reason":"launch week"}`

const adjustBody = `{"metric":"requests","set":10,"reason":"ticket 1"}`

func TestRoutes(t *testing.T) {
	f := mustFixture(t)
	for _, tc := range routeCases() {
		t.Run(tc.op+"/"+tc.name, func(t *testing.T) {
			path := strings.NewReplacer("{old}", f.oldKey, "{cu}", f.consoID).Replace(tc.path)
			if strings.Contains(path, "{grant}") {
				path = strings.ReplaceAll(path, "{grant}", f.grant())
			}
			before, auditBefore := f.fingerprint(), f.auditRows()
			rec := f.do(tc.method, path, f.tokens[tc.token], tc.body)
			if rec.Code != tc.want {
				t.Fatalf("%s %s = %d, want %d: %s", tc.method, path, rec.Code, tc.want, rec.Body)
			}
			changed := f.fingerprint() != before
			audited := f.auditRows() - auditBefore
			switch {
			case rec.Code >= 400:
				if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
					t.Errorf("Content-Type = %q, want application/problem+json", ct)
				}
				var p api.Problem
				if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Status != rec.Code || p.Title == "" || p.Detail == nil {
					t.Errorf("problem document = %s (%v)", rec.Body, err)
				}
				if changed {
					t.Errorf("refused request changed the database")
				}
			case tc.method == "GET":
				if changed {
					t.Errorf("GET changed the database")
				}
			default:
				if audited != 1 {
					t.Errorf("change wrote %d audit rows, want 1", audited)
				}
			}
		})
	}
}

// A 422 names the numbers: what the parent has, what is allocated, what was asked.
func TestAllocationProblemNamesTheNumbers(t *testing.T) {
	f := mustFixture(t)
	rec := f.do("POST", "/v1/orgs/acme/teams", f.tokens["acme-admin"],
		`{"id":"ops","name":"Ops","limits":[{"metric":"requests","window":"month","limit":500}]}`)
	var p api.Problem
	_ = json.Unmarshal(rec.Body.Bytes(), &p)
	want := `team "ops": requests/month limit 500 does not fit in org "acme": it has 1000, 600 is already allocated, 400 is available`
	if rec.Code != 422 || p.Detail == nil || *p.Detail != want || len(p.Errors) != 1 || p.Errors[0].Field != "limits[0].limit" {
		t.Fatalf("got %d %s\nwant detail %q at limits[0].limit", rec.Code, rec.Body, want)
	}
}

// Every operation of the admin sections has a success case and a 401 case, so a
// new operation cannot be added without covering it here.
func TestRouteCasesCoverEveryAdminOperation(t *testing.T) {
	spec, err := api.GetSwagger()
	if err != nil {
		t.Fatal(err)
	}
	// The check routes are covered by check_test.go, reservations by
	// reservations_test.go (extend by concurrency_test.go), client leases by
	// clientleases_test.go; usage and billing by their issue.
	later := map[string]bool{"check": true, "checkbatch": true, "getusage": true, "exportorgbilling": true,
		"createreservation": true, "getreservation": true, "releasereservation": true, "commitreservation": true,
		"extendreservation": true, "createlease": true, "settlelease": true,
		"exportbilling": true, "healthz": true, "readyz": true, "metrics": true}
	has := map[string]map[int]bool{}
	for _, c := range routeCases() {
		if has[strings.ToLower(c.op)] == nil {
			has[strings.ToLower(c.op)] = map[int]bool{}
		}
		has[strings.ToLower(c.op)][c.want] = true
	}
	for _, item := range spec.Paths.Map() {
		for _, op := range item.Operations() {
			if later[strings.ToLower(op.OperationID)] {
				continue
			}
			got := has[strings.ToLower(op.OperationID)]
			if !(got[200] || got[201] || got[204]) || !got[401] {
				t.Errorf("operation %s lacks a success or a 401 case", op.OperationID)
			}
		}
	}
}

// No secret in the database or the logs: the key secret and the console password
// appear only in the creating response.
func TestSecretsStayOutOfDatabaseAndLogs(t *testing.T) {
	f := mustFixture(t)
	rec := f.do("POST", "/v1/orgs/acme/api-keys", f.tokens["acme-admin"], `{"name":"ci","scopes":["check","billing"]}`)
	var created api.ApiKeyCreated
	if err := json.Unmarshal(rec.Body.Bytes(), &created); err != nil || rec.Code != 201 {
		t.Fatalf("create key: %d %s", rec.Code, rec.Body)
	}
	const password = "a very secret console password"
	if rec := f.do("POST", "/v1/orgs/acme/console-users", f.tokens["acme-admin"],
		`{"email":"eve@acme.test","password":"`+password+`","role":"admin"}`); rec.Code != 201 || strings.Contains(rec.Body.String(), password) {
		t.Fatalf("create console user: %d %s", rec.Code, rec.Body)
	}
	// qpk_<id>_<secret>: the secret is base64url, so it may contain "_" itself.
	secretPart := strings.SplitN(created.Secret, "_", 3)[2]
	// Use the key so authentication paths log what they log.
	f.do("GET", "/v1/orgs/acme", created.Secret, "")
	f.do("GET", "/v1/orgs/acme", created.Secret+"x", "")
	listed := f.do("GET", "/v1/orgs/acme/api-keys", f.tokens["acme-admin"], "").Body.String()
	audit := f.do("GET", "/v1/orgs/acme/audit", f.tokens["acme-admin"], "").Body.String()

	var dump strings.Builder
	rows, err := f.pool.Query(context.Background(), `SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'`)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var n string
		_ = rows.Scan(&n)
		tables = append(tables, n)
	}
	for _, tbl := range tables {
		var s *string
		if err := f.pool.QueryRow(context.Background(), `SELECT string_agg(t::text, E'\n') FROM `+tbl+` t`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		if s != nil {
			dump.WriteString(*s)
		}
	}
	for where, text := range map[string]string{"database": dump.String(), "logs": f.logs.String(), "key list": listed, "audit": audit} {
		for what, secret := range map[string]string{"key secret": secretPart, "password": password} {
			if strings.Contains(text, secret) {
				t.Errorf("the %s appears in the %s", what, where)
			}
		}
	}
	if len(tables) < 10 || dump.Len() == 0 {
		t.Fatalf("dumped %d tables, %d bytes: the check would prove nothing", len(tables), dump.Len())
	}
}

func TestHealthAndReadiness(t *testing.T) {
	f := mustFixture(t)
	for _, path := range []string{"/healthz", "/readyz"} {
		if rec := f.do("GET", path, "", ""); rec.Code != 200 {
			t.Errorf("%s = %d %s", path, rec.Code, rec.Body)
		}
	}
	if rec := f.do("GET", "/metrics", "", ""); rec.Code != 200 || !strings.Contains(rec.Body.String(), "quotaplane_http_requests_total") {
		t.Errorf("/metrics = %d", rec.Code)
	}
}

// Keys are cached, but a revocation through this replica takes effect at once.
func TestRevokedKeyIsRefusedAtOnce(t *testing.T) {
	f := mustFixture(t)
	rec := f.do("POST", "/v1/orgs/acme/api-keys", f.tokens["acme-admin"], `{"name":"tmp","scopes":["admin"]}`)
	var k api.ApiKeyCreated
	if err := json.Unmarshal(rec.Body.Bytes(), &k); err != nil {
		t.Fatal(err)
	}
	if rec := f.do("GET", "/v1/orgs/acme", k.Secret, ""); rec.Code != 200 {
		t.Fatalf("new key: %d", rec.Code)
	}
	if rec := f.do("DELETE", "/v1/orgs/acme/api-keys/"+k.Id, f.tokens["acme-admin"], ""); rec.Code != 204 {
		t.Fatalf("revoke: %d", rec.Code)
	}
	if rec := f.do("GET", "/v1/orgs/acme", k.Secret, ""); rec.Code != 401 {
		t.Fatalf("revoked key answered %d, want 401", rec.Code)
	}
}
