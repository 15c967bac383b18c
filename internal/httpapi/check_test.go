package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/httpapi"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/cachemetrics"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// testRedisTimeout replaces the 100 ms production default: these tests check
// behaviour, and a machine busy with -race builds can stall Redis past 100 ms. The
// fault tests in internal/quota keep short timeouts on purpose.
const testRedisTimeout = 2 * time.Second

// replica is one api process: its own pool, cache and engine over the shared
// Postgres database and Redis.
type replica struct{ f *fixture }

func newReplica(t *testing.T, dbURL, prefix string) *replica {
	t.Helper()
	return newReplicaTTL(t, dbURL, prefix, time.Hour)
}

func newReplicaTTL(t *testing.T, dbURL, prefix string, ttl time.Duration) *replica {
	t.Helper()
	return newReplicaWith(t, dbURL, prefix, ttl, prometheus.NewRegistry())
}

func newReplicaWith(t *testing.T, dbURL, prefix string, ttl time.Duration, reg *prometheus.Registry) *replica {
	t.Helper()
	return newReplicaEngine(t, dbURL, prefix, ttl, reg, quota.Config{KeyPrefix: prefix})
}

// newReplicaEngine is newReplicaWith with the engines' configuration (a clock).
func newReplicaEngine(t *testing.T, dbURL, prefix string, ttl time.Duration, reg *prometheus.Registry, engine quota.Config) *replica {
	t.Helper()
	return newReplicaOn(t, dbURL, prefix, ttl, reg, engine, testenv.RedisURL(t), testenv.Redis(t))
}

// newReplicaOn is newReplicaEngine whose checks, cache invalidations and readiness use
// the Redis at redisURL (rdb: a client of it).
func newReplicaOn(t *testing.T, dbURL, prefix string, ttl time.Duration, reg *prometheus.Registry, engine quota.Config,
	redisURL string, rdb *redis.Client, opts ...func(*httpapi.Deps)) *replica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	svc := tenants.NewService(pool, tenants.WithPasswordCost(64, 1))
	// Replicas of one test share a channel; other tests' invalidations of the same org
	// ids (every package's tests run at once on one Redis) must not reach them.
	cache := tenants.NewCache(svc, tenants.CacheOptions{TTL: ttl, KeyTTL: ttl, Metrics: cachemetrics.New(reg),
		Channel: tenants.InvalidationChannel + ":" + prefix})
	cache.Listen(ctx, rdb)
	router, err := quota.NewEngines(quota.EnginesConfig{DefaultURL: redisURL, RedisTimeout: testRedisTimeout, Engine: engine,
		Breaker: quota.BreakerConfig{OpenTimeout: 200 * time.Millisecond}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = router.Close() })
	deps := httpapi.Deps{Tenants: svc, Cache: cache, Checker: router, Redis: rdb, Registry: reg,
		AdminToken: operatorToken, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), ServeMetrics: true}
	for _, o := range opts {
		o(&deps)
	}
	h, err := httpapi.NewHandler(deps)
	if err != nil {
		t.Fatal(err)
	}
	return &replica{f: &fixture{t: t, h: h, pool: pool, svc: svc, tokens: map[string]string{"operator": operatorToken}}}
}

type checkOut struct {
	code   int
	header http.Header
	body   api.CheckResult
	raw    string
}

func (r *replica) check(token, body string) checkOut {
	rec := r.f.do("POST", "/v1/check", token, body)
	var res api.CheckResult
	_ = json.Unmarshal(rec.Body.Bytes(), &res)
	return checkOut{rec.Code, rec.Header(), res, rec.Body.String()}
}

func (r *replica) mustDo(method, path, token, body string, want int) string {
	r.f.t.Helper()
	rec := r.f.do(method, path, token, body)
	if rec.Code != want {
		r.f.t.Fatalf("%s %s = %d, want %d: %s", method, path, rec.Code, want, rec.Body)
	}
	return rec.Body.String()
}

// setup creates, through the API, a plan with 20 requests/minute, an org on it, a
// team "eng" and a key with the check scope; it returns the key.
func (r *replica) setup(org string) (checkKey, adminKey string) {
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p-`+org+`","name":"P","fail_mode":"closed","limits":[{"metric":"requests","window":"minute","limit":20},{"metric":"requests","window":"month","limit":1000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"`+org+`","name":"O","plan":"p-`+org+`"}`, 201)
	r.mustDo("POST", "/v1/orgs/"+org+"/teams", operatorToken, `{"id":"eng","name":"Eng","user_limits":[{"metric":"requests","window":"month","limit":500}]}`, 201)
	var k api.ApiKeyCreated
	_ = json.Unmarshal([]byte(r.mustDo("POST", "/v1/orgs/"+org+"/api-keys", operatorToken, `{"name":"c","scopes":["check"]}`, 201)), &k)
	var a api.ApiKeyCreated
	_ = json.Unmarshal([]byte(r.mustDo("POST", "/v1/orgs/"+org+"/api-keys", operatorToken, `{"name":"a","scopes":["admin"]}`, 201)), &a)
	return k.Secret, a.Secret
}

func TestCheckOverHTTP(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	key, admin := r.setup("acme")
	body := `{"org":"acme","team":"eng","user":"alice"}`

	allowed, denied := 0, 0
	var last checkOut
	for range 30 {
		last = r.check(key, body)
		switch last.code {
		case 200:
			allowed++
		case 429:
			denied++
		default:
			t.Fatalf("check = %d %s", last.code, last.raw)
		}
	}
	if allowed < 20 || allowed > 21 || allowed+denied != 30 {
		t.Fatalf("30 checks at 20/minute: %d allowed, %d denied", allowed, denied)
	}
	b := last.body
	if b.Allowed || b.BlockedAt == nil || b.BlockedAt.Level != "org" || b.BlockedAt.Window != "minute" || b.RetryAfterSeconds == nil {
		t.Errorf("denied body = %s", last.raw)
	}
	if _, ok := last.header["RateLimit-Remaining"]; !ok {
		t.Errorf("RateLimit-Remaining not sent with its documented spelling: %v", last.header)
	}
	// The minute bucket holds all 20 units, so a unit fits again once that bucket has
	// become the previous one and its weight has fallen to 19/20: up to 60 + 3 seconds
	// when the checks ran in the first 3 seconds of a minute (a bound of 60 failed then).
	ra, err := strconv.Atoi(last.header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 63 || rawHeader(last.header, "RateLimit-Remaining") != "0" || rawHeader(last.header, "RateLimit-Limit") != "20" {
		t.Errorf("429 headers: Retry-After %q RateLimit %q/%q/%q", last.header.Get("Retry-After"),
			rawHeader(last.header, "RateLimit-Limit"), rawHeader(last.header, "RateLimit-Remaining"), rawHeader(last.header, "RateLimit-Reset"))
	}

	cases := []struct {
		name, token, body string
		want              int
	}{
		{"cost 0 queries a full window", key, `{"org":"acme","team":"eng","user":"alice","cost":0}`, 200},
		{"cost 1 after the query is still refused", key, `{"org":"acme","team":"eng","user":"alice"}`, 429},
		{"unregistered user needs a team", key, `{"org":"acme","user":"bob"}`, 400},
		{"unknown team", key, `{"org":"acme","team":"ops"}`, 404},
		{"another org", key, `{"org":"other","team":"eng"}`, 404},
		{"admin key lacks check", admin, body, 403},
		{"no token", "", body, 401},
		{"unknown field", key, `{"org":"acme","team":"eng","units":1}`, 400},
		{"negative cost", key, `{"org":"acme","team":"eng","cost":-1}`, 400},
		{"short idempotency key", key, `{"org":"acme","team":"eng","idempotency_key":"abc"}`, 400},
		{"bad id", key, `{"org":"ac me"}`, 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := r.check(tc.token, tc.body); got.code != tc.want {
				t.Errorf("= %d, want %d: %s", got.code, tc.want, got.raw)
			}
		})
	}

	// Shadow mode never denies but says what it would have done; warn adds a header.
	r.mustDo("PATCH", "/v1/orgs/acme", operatorToken, `{"mode":"shadow"}`, 200)
	if got := r.check(key, body); got.code != 200 || got.body.WouldBlock == nil || got.body.Mode != "shadow" {
		t.Errorf("shadow: %d %s", got.code, got.raw)
	}
	r.mustDo("PATCH", "/v1/orgs/acme", operatorToken, `{"mode":"warn"}`, 200)
	if got := r.check(key, body); got.code != 200 || got.header.Get("Quotaplane-Warning") == "" {
		t.Errorf("warn: %d %v %s", got.code, got.header, got.raw)
	}
}

func TestCheckIdempotentReplayAndBatch(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	key, _ := r.setup("acme")
	first := r.check(key, `{"org":"acme","team":"eng","cost":5,"idempotency_key":"order-12345"}`)
	again := r.check(key, `{"org":"acme","team":"eng","cost":5,"idempotency_key":"order-12345"}`)
	if first.code != 200 || again.code != 200 || again.body.Replayed == nil || !*again.body.Replayed {
		t.Fatalf("replay: %s / %s", first.raw, again.raw)
	}
	var checks []string
	for i := range 20 {
		checks = append(checks, fmt.Sprintf(`{"org":"acme","team":"eng","user":"u%d"}`, i))
	}
	checks = append(checks, `{"org":"acme","user":"nobody"}`)
	rec := r.f.do("POST", "/v1/check/batch", key, `{"checks":[`+join(checks)+`]}`)
	var out struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || rec.Code != 200 || len(out.Results) != 21 {
		t.Fatalf("batch = %d %s", rec.Code, rec.Body)
	}
	allowed := 0
	for _, res := range out.Results[:20] {
		if res["allowed"] == true {
			allowed++
		}
	}
	// 5 units were used by the first check: 15 of the 20-per-minute remain.
	if allowed != 15 || out.Results[20]["status"] != float64(400) {
		t.Errorf("batch: %d allowed (want 15); last item %v", allowed, out.Results[20])
	}
	if rec := r.f.do("POST", "/v1/check/batch", key, `{"checks":[]}`); rec.Code != 400 {
		t.Errorf("empty batch = %d", rec.Code)
	}
}

// checkWith posts body to path with extra headers.
func (r *replica) checkWith(path, token, body string, header map[string]string) (int, string) {
	req := httptest.NewRequest("POST", path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	r.f.h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// An idempotency key reused with a different request (team, user, metric, cost) is
// refused with 422 and counts nothing, on /v1/check and on each item of a batch; the
// key may come in the Idempotency-Key header (quoted as the IETF draft writes it, or
// bare) and is the same key as the body field's.
func TestCheckIdempotencyKeyConflict(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	key, _ := r.setup("acme")
	r.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"ops","name":"Ops"}`, 201)
	r.mustDo("PATCH", "/v1/plans/p-acme", operatorToken, `{"metered":["tokens"]}`, 200) // a metric the org knows: the key, not the metric, is refused
	used := func() int64 {                                                              // the org's month usage, read by a check of cost 0
		t.Helper()
		got := r.check(key, `{"org":"acme","cost":0}`)
		for _, l := range got.body.Levels {
			if l.Level == "org" && l.Window == "month" {
				return l.Used
			}
		}
		t.Fatalf("no org month level: %s", got.raw)
		return 0
	}
	if got := r.check(key, `{"org":"acme","team":"eng","user":"alice","cost":5,"idempotency_key":"order-12345"}`); got.code != 200 {
		t.Fatalf("first = %d %s", got.code, got.raw)
	}
	before := used()
	for name, body := range map[string]string{
		"cost":   `{"org":"acme","team":"eng","user":"alice","cost":6,"idempotency_key":"order-12345"}`,
		"metric": `{"org":"acme","team":"eng","user":"alice","cost":5,"metric":"tokens","idempotency_key":"order-12345"}`,
		"user":   `{"org":"acme","team":"eng","user":"bob","cost":5,"idempotency_key":"order-12345"}`,
		"team":   `{"org":"acme","team":"ops","user":"alice","cost":5,"idempotency_key":"order-12345"}`,
	} {
		got := r.check(key, body)
		var p api.Problem
		_ = json.Unmarshal([]byte(got.raw), &p)
		if got.code != 422 || p.Detail == nil || !strings.Contains(*p.Detail, "different request") ||
			len(p.Errors) != 1 || p.Errors[0].Field != "idempotency_key" {
			t.Errorf("%s changed = %d %s, want 422 naming idempotency_key", name, got.code, got.raw)
		}
	}
	// The header form, quoted or bare, is the same key: a different cost conflicts, the
	// same request replays.
	for _, h := range []string{`"order-12345"`, `order-12345`} {
		hdr := map[string]string{"Idempotency-Key": h}
		if code, body := r.checkWith("/v1/check", key, `{"org":"acme","team":"eng","user":"alice","cost":7}`, hdr); code != 422 {
			t.Errorf("header %s, other cost = %d %s, want 422", h, code, body)
		}
		code, body := r.checkWith("/v1/check", key, `{"org":"acme","team":"eng","user":"alice","cost":5}`, hdr)
		if code != 200 || !strings.Contains(body, `"replayed":true`) {
			t.Errorf("header %s, same request = %d %s, want a replay", h, code, body)
		}
	}
	// A new key in the header counts once, then replays from the body field.
	hdr := map[string]string{"Idempotency-Key": `"order-67890"`}
	if code, body := r.checkWith("/v1/check", key, `{"org":"acme","team":"eng","user":"alice","cost":3}`, hdr); code != 200 || strings.Contains(body, "replayed") {
		t.Errorf("new key in the header = %d %s", code, body)
	}
	if got := r.check(key, `{"org":"acme","team":"eng","user":"alice","cost":3,"idempotency_key":"order-67890"}`); got.body.Replayed == nil {
		t.Errorf("the header's key in the body = %d %s, want a replay", got.code, got.raw)
	}
	// Header and field both given: the same key is fine, different keys are refused.
	code, body := r.checkWith("/v1/check", key, `{"org":"acme","team":"eng","user":"alice","cost":3,"idempotency_key":"order-67890"}`, hdr)
	if code != 200 {
		t.Errorf("same key in header and body = %d %s", code, body)
	}
	code, body = r.checkWith("/v1/check", key, `{"org":"acme","team":"eng","user":"alice","cost":3,"idempotency_key":"order-11111"}`, hdr)
	if code != 400 || !strings.Contains(body, "Idempotency-Key") || !strings.Contains(body, "idempotency_key") {
		t.Errorf("different keys in header and body = %d %s, want 400 naming both", code, body)
	}
	if code, body := r.checkWith("/v1/check", key, `{"org":"acme","team":"eng"}`, map[string]string{"Idempotency-Key": "short"}); code != 400 || !strings.Contains(body, "Idempotency-Key") {
		t.Errorf("bad header = %d %s, want 400 naming Idempotency-Key", code, body)
	}

	// In a batch each item is held to its own key.
	rec := r.f.do("POST", "/v1/check/batch", key, `{"checks":[`+
		`{"org":"acme","team":"eng","user":"alice","cost":5,"idempotency_key":"order-12345"},`+
		`{"org":"acme","team":"eng","user":"alice","cost":9,"idempotency_key":"order-12345"},`+
		`{"org":"acme","team":"eng","user":"alice","cost":1,"idempotency_key":"order-55555"}]}`)
	var out struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || rec.Code != 200 || len(out.Results) != 3 {
		t.Fatalf("batch = %d %s", rec.Code, rec.Body)
	}
	if out.Results[0]["replayed"] != true || out.Results[1]["status"] != float64(422) || out.Results[2]["allowed"] != true {
		t.Errorf("batch results: %v", out.Results)
	}
	if code, body := r.checkWith("/v1/check/batch", key, `{"checks":[{"org":"acme","team":"eng"}]}`, hdr); code != 400 {
		t.Errorf("batch with the header = %d %s, want 400", code, body)
	}
	if got := used(); got != before+3+1 {
		t.Errorf("org month usage %d, want %d: only the two new keys counted", got, before+3+1)
	}
}

func join(items []string) string {
	s := ""
	for i, it := range items {
		if i > 0 {
			s += ","
		}
		s += it
	}
	return s
}

// An allocation change made through one replica's API is enforced by another
// replica within a second.
func TestAllocationChangeReachesSecondReplica(t *testing.T) {
	dbURL := testenv.PostgresURL(t)
	prefix := testenv.ID(t, "h")
	a, b := newReplica(t, dbURL, prefix), newReplica(t, dbURL, prefix)
	key, _ := a.setup("acme")
	a.mustDo("PATCH", "/v1/orgs/acme/teams/eng", operatorToken, `{"limits":[{"metric":"requests","window":"month","limit":500}]}`, 200)
	body := `{"org":"acme","team":"eng","cost":0}`
	if got := b.check(key, body); got.code != 200 || teamLimit(got.body) != 500 {
		t.Fatalf("replica b before: %d %s", got.code, got.raw)
	}
	start := time.Now()
	a.mustDo("PATCH", "/v1/orgs/acme/teams/eng", operatorToken, `{"limits":[{"metric":"requests","window":"month","limit":3}],"user_limits":[]}`, 200)
	for {
		got := b.check(key, body)
		if teamLimit(got.body) == 3 {
			break
		}
		if time.Since(start) > time.Second {
			t.Fatalf("replica b still enforces %d after 1s", teamLimit(got.body))
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("replica b enforced the new limit after %v", time.Since(start))
	for i := range 4 {
		got := b.check(key, `{"org":"acme","team":"eng"}`)
		if want := map[bool]int{true: 200, false: 429}[i < 3]; got.code != want {
			t.Errorf("check %d on replica b = %d, want %d", i, got.code, want)
		}
	}
}

func teamLimit(r api.CheckResult) int64 {
	for _, l := range r.Levels {
		if l.Level == "team" && l.Window == "month" {
			return l.Limit
		}
	}
	return -1
}

// With Postgres gone, checks go on from the cache: every cache entry has expired, each
// refresh fails, and the stale entries answer.
func TestChecksGoOnWithPostgresDown(t *testing.T) {
	r := newReplicaTTL(t, testenv.PostgresURL(t), testenv.ID(t, "h"), time.Millisecond)
	key, _ := r.setup("acme")
	body := `{"org":"acme","team":"eng","user":"alice"}`
	if got := r.check(key, body); got.code != 200 {
		t.Fatalf("warm-up check = %d %s", got.code, got.raw)
	}
	r.f.pool.Close()
	time.Sleep(5 * time.Millisecond)
	for i := range 5 {
		if got := r.check(key, body); got.code != 200 || got.body.Levels[0].Used != int64(i+2) {
			t.Fatalf("check %d with Postgres down = %d %s", i, got.code, got.raw)
		}
	}
}

// An org whose Redis is down gets its plan's fail mode: closed answers 503 (never
// 429), open allows and says degraded.
func TestFailModesOverHTTP(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	key, _ := r.setup("acme")
	// A dedicated Redis nobody listens on.
	r.mustDo("PATCH", "/v1/orgs/acme", operatorToken, `{"redis_url":"redis://127.0.0.1:1/0","redis_url_check":false}`, 200)
	body := `{"org":"acme","team":"eng"}`
	for i := range 10 {
		got := r.check(key, body)
		if got.code != 503 || got.header.Get("Retry-After") == "" {
			t.Fatalf("closed plan, Redis down, check %d = %d %s", i, got.code, got.raw)
		}
	}
	r.mustDo("PATCH", "/v1/plans/p-acme", operatorToken, `{"fail_mode":"open"}`, 200)
	got := r.check(key, body)
	if got.code != 200 || !got.body.Allowed || got.body.Degraded == nil || !*got.body.Degraded {
		t.Fatalf("open plan, Redis down = %d %s", got.code, got.raw)
	}
	// Back on the shared Redis, answers are exact and not degraded.
	r.mustDo("PATCH", "/v1/orgs/acme", operatorToken, `{"redis_url":""}`, 200)
	if got := r.check(key, body); got.code != 200 || got.body.Degraded != nil {
		t.Fatalf("Redis back = %d %s", got.code, got.raw)
	}
}

// /metrics shows checks by decision, blocking level, mode and degraded, by plan and
// by org, latency, pipelines, breaker state, in-flight checks and cache lookups;
// never a user id.
func TestCheckMetrics(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	key, _ := r.setup("acme")
	for range 22 {
		r.check(key, `{"org":"acme","team":"eng","user":"alice-the-user"}`)
	}
	text := r.f.do("GET", "/metrics", "", "").Body.String()
	for _, want := range []string{
		`quotaplane_checks_total{blocked_level="",decision="allowed",degraded="false",mode="enforce"} 20`,
		`quotaplane_checks_total{blocked_level="org",decision="denied",degraded="false",mode="enforce"} 2`,
		`quotaplane_plan_checks_total{decision="allowed",degraded="false",plan="p-acme"} 20`,
		`quotaplane_org_checks_total{decision="denied",org="acme"} 2`,
		"quotaplane_check_duration_seconds_bucket", "quotaplane_redis_pipeline_size_bucket",
		"quotaplane_redis_roundtrip_seconds_bucket", "quotaplane_breaker_state", "quotaplane_inflight",
		`quotaplane_cache_lookups_total{cache="orgs",result="hit"}`, `quotaplane_cache_lookups_total{cache="keys",result="hit"}`, "quotaplane_http_requests_total",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(text, "alice-the-user") {
		t.Errorf("/metrics carries a user id")
	}
}

// rawHeader reads a header set verbatim (not canonicalized), as the recorder keeps it.
func rawHeader(h http.Header, name string) string {
	if v := h[name]; len(v) > 0 {
		return v[0]
	}
	return ""
}
