package httpapi_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/quotaplane/quotaplane/internal/httpapi"
	"github.com/quotaplane/quotaplane/internal/platform/pgdb"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// newTracedReplica is newReplica with every span (HTTP, engine, Postgres) recorded
// in the returned exporter, synchronously as each span ends.
func newTracedReplica(t *testing.T) (*replica, *tracetest.InMemoryExporter) {
	t.Helper()
	return newTracedReplicaOn(t, testenv.RedisURL(t))
}

// newTracedReplicaOn is newTracedReplica with its checks decided on the Redis at redisURL.
func newTracedReplicaOn(t *testing.T, redisURL string) (*replica, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cfg, err := pgdb.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	pgdb.Trace(cfg, tp)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	svc := tenants.NewService(pool, tenants.WithPasswordCost(64, 1))
	rdb := testenv.Redis(t)
	cache := tenants.NewCache(svc, tenants.CacheOptions{TTL: time.Hour, KeyTTL: time.Hour})
	router, err := quota.NewEngines(quota.EnginesConfig{DefaultURL: redisURL, RedisTimeout: testRedisTimeout,
		Engine: quota.Config{KeyPrefix: testenv.ID(t, "tr"), TracerProvider: tp}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = router.Close() })
	h, err := httpapi.NewHandler(httpapi.Deps{ServeMetrics: true, Tenants: svc, Cache: cache, Checker: router, Redis: rdb,
		AdminToken: operatorToken, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	return &replica{f: &fixture{t: t, h: h, pool: pool, svc: svc, tokens: map[string]string{"operator": operatorToken}}}, exp
}

// spanNamed returns the one span called name, failing unless there is exactly one.
func spanNamed(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans named %q, want 1; spans: %v", len(found), name, names(spans))
	}
	return found[0]
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

func attrs(kvs []attribute.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}

func wantAttrs(t *testing.T, s tracetest.SpanStub, want map[string]string) {
	t.Helper()
	got := attrs(s.Attributes)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("span %q: %s = %q, want %q (attributes %v)", s.Name, k, got[k], v, got)
		}
	}
}

func linksTo(s tracetest.SpanStub, sc trace.SpanContext) bool {
	return slices.ContainsFunc(s.Links, func(l sdktrace.Link) bool { return l.SpanContext.Equal(sc) })
}

// noSecrets fails if any attribute or event of any span carries one of the secrets.
func noSecrets(t *testing.T, spans tracetest.SpanStubs, secrets ...string) {
	t.Helper()
	for _, s := range spans {
		all := slices.Clone(s.Attributes)
		for _, e := range s.Events {
			all = append(all, e.Attributes...)
		}
		for _, kv := range all {
			for _, secret := range secrets {
				if strings.Contains(kv.Value.Emit(), secret) {
					t.Errorf("span %q: attribute %s carries a secret", s.Name, kv.Key)
				}
			}
		}
	}
}

// TestCheckTrace: a check through the real router and the real Redis gives a server
// span named after its route, a quota.check child with what was asked and answered,
// and a redis.pipeline span, linked both ways, for the coalesced EVALSHA. A denial
// is an answer, not an error. No span carries the API key. The span tree is written
// to test-output/tracing/check.txt, and docs/TRACING.md must show it.
func TestCheckTrace(t *testing.T) {
	r, exp := newTracedReplica(t)
	key, _ := r.setup("acme")
	if got := r.check(key, `{"org":"acme","team":"eng","cost":1}`); got.code != 200 { // the org now cached
		t.Fatalf("warm-up check: %d %s", got.code, got.raw)
	}
	exp.Reset()

	if got := r.check(key, `{"org":"acme","team":"eng","metric":"requests","cost":3}`); got.code != 200 {
		t.Fatalf("check: %d %s", got.code, got.raw)
	}
	spans := exp.GetSpans()
	http := spanNamed(t, spans, "POST /v1/check")
	check := spanNamed(t, spans, "quota.check")
	pipe := spanNamed(t, spans, "redis.pipeline")
	if http.SpanKind != trace.SpanKindServer || http.Parent.IsValid() {
		t.Errorf("http span: kind %v, parent %v; want a server root span", http.SpanKind, http.Parent)
	}
	wantAttrs(t, http, map[string]string{"http.route": "/v1/check", "http.response.status_code": "200"})
	if check.Parent.SpanID() != http.SpanContext.SpanID() {
		t.Errorf("quota.check's parent is %v, want the http span", check.Parent.SpanID())
	}
	wantAttrs(t, check, map[string]string{"quotaplane.org": "acme", "quotaplane.team": "eng", "quotaplane.metric": "requests",
		"quotaplane.cost": "3", "quotaplane.allowed": "true", "quotaplane.pool": "default", "quotaplane.degraded": "false"})
	if pipe.Parent.IsValid() || pipe.SpanKind != trace.SpanKindClient {
		t.Errorf("redis.pipeline: parent %v, kind %v; want a client root span (it carries many requests' checks)", pipe.Parent, pipe.SpanKind)
	}
	wantAttrs(t, pipe, map[string]string{"db.system.name": "redis", "db.operation.batch.size": "1", "quotaplane.pipeline.failed": "0"})
	if !linksTo(pipe, check.SpanContext) || !linksTo(check, pipe.SpanContext) {
		t.Errorf("redis.pipeline and quota.check are not linked both ways: pipeline links %v, check links %v", pipe.Links, check.Links)
	}
	if n := len(spans); n != 3 {
		t.Errorf("%d spans for a check of a cached org, want 3: %v", n, names(spans))
	}
	tree := renderTrace(spans, http)
	noSecrets(t, spans, key, operatorToken, "Bearer")

	exp.Reset()
	if got := r.check(key, `{"org":"acme","team":"eng","cost":100}`); got.code != 429 {
		t.Fatalf("over the minute limit: %d %s", got.code, got.raw)
	}
	spans = exp.GetSpans()
	denied := spanNamed(t, spans, "quota.check")
	wantAttrs(t, denied, map[string]string{"quotaplane.allowed": "false", "quotaplane.blocked.level": "org",
		"quotaplane.blocked.window": "minute", "quotaplane.cost": "100"})
	if denied.Status.Code.String() == "Error" {
		t.Errorf("a denial is marked as an error: %v", denied.Status)
	}
	tree += "\n" + renderTrace(spans, spanNamed(t, spans, "POST /v1/check"))
	noSecrets(t, spans, key, operatorToken, "Bearer")

	exp.Reset()
	r.mustDo("POST", "/v1/check/batch", key, `{"checks":[{"org":"acme","team":"eng"},{"org":"acme","cost":2}]}`, 200)
	spans = exp.GetSpans()
	batch := spanNamed(t, spans, "quota.check_batch")
	wantAttrs(t, batch, map[string]string{"quotaplane.batch.size": "2", "quotaplane.batch.allowed": "2", "quotaplane.org": "acme"})
	if pipe := spanNamed(t, spans, "redis.pipeline"); pipe.Parent.SpanID() != batch.SpanContext.SpanID() {
		t.Errorf("a batch's pipeline is not the batch span's child")
	}
	tree += "\n" + renderTrace(spans, spanNamed(t, spans, "POST /v1/check/batch"))

	writeOutput(t, "check.txt", tree)
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "TRACING.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), tree) {
		t.Errorf("docs/TRACING.md does not show the span trees of this test; paste test-output/tracing/check.txt:\n%s", tree)
	}
}

// TestAdminTrace: an admin call gives a server span with the Postgres queries it ran
// as children (otelpgx), their SQL but not their arguments. Probes make no span.
func TestAdminTrace(t *testing.T) {
	r, exp := newTracedReplica(t)
	r.setup("acme")
	exp.Reset()
	r.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"ops","name":"Ops de l'équipe secrète"}`, 201)
	spans := exp.GetSpans()
	http := spanNamed(t, spans, "POST /v1/orgs/{org}/teams")
	wantAttrs(t, http, map[string]string{"http.route": "/v1/orgs/{org}/teams", "http.response.status_code": "201"})
	var queries int
	for _, s := range spans {
		if attrs(s.Attributes)["db.system.name"] != "postgresql" {
			continue
		}
		if s.SpanContext.TraceID() != http.SpanContext.TraceID() {
			t.Errorf("postgres span %q is not in the request's trace", s.Name)
		}
		if strings.Contains(attrs(s.Attributes)["db.query.text"], "INSERT") {
			queries++
		}
	}
	if queries == 0 {
		t.Errorf("no Postgres INSERT span under the admin call: %v", names(spans))
	}
	noSecrets(t, spans, operatorToken, "secrète")
	writeOutput(t, "admin.txt", renderTrace(spans, http))

	exp.Reset() // probes and scrapers, every few seconds, are not traced, nor their queries
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		r.f.do("GET", path, "", "")
	}
	if spans := exp.GetSpans(); len(spans) != 0 {
		t.Errorf("probes made spans: %v", names(spans))
	}
}

// renderTrace draws the tree of root's trace, each span with its kind and its
// attributes (those that vary from run to run left out), and under a span the spans
// of other traces it links to.
func renderTrace(spans tracetest.SpanStubs, root tracetest.SpanStub) string {
	byID := map[trace.SpanID]tracetest.SpanStub{}
	children := map[trace.SpanID][]tracetest.SpanStub{}
	for _, s := range spans {
		byID[s.SpanContext.SpanID()] = s
		if s.Parent.IsValid() {
			children[s.Parent.SpanID()] = append(children[s.Parent.SpanID()], s)
		}
	}
	var b strings.Builder
	var draw func(s tracetest.SpanStub, prefix, branch string, linked bool)
	draw = func(s tracetest.SpanStub, prefix, branch string, linked bool) {
		label := s.Name
		if linked {
			label = "(link) " + label
		}
		fmt.Fprintf(&b, "%s%s%s [%s]%s\n", prefix, branch, label, s.SpanKind, stableAttrs(s.Attributes))
		for _, e := range s.Events {
			fmt.Fprintf(&b, "%s%s  event %s\n", prefix, strings.Repeat(" ", len([]rune(branch))), e.Name)
		}
		next := prefix
		switch branch {
		case "├─ ":
			next += "│  "
		case "└─ ", "└┄ ":
			next += "   "
		}
		kids := slices.Clone(children[s.SpanContext.SpanID()])
		slices.SortStableFunc(kids, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
		var links []tracetest.SpanStub
		if !linked {
			for _, l := range s.Links {
				if ls, ok := byID[l.SpanContext.SpanID()]; ok && l.SpanContext.TraceID() != s.SpanContext.TraceID() {
					links = append(links, ls)
				}
			}
		}
		for i, k := range kids {
			br := "├─ "
			if i == len(kids)-1 && len(links) == 0 {
				br = "└─ "
			}
			draw(k, next, br, false)
		}
		for i, l := range links {
			br := "├┄ "
			if i == len(links)-1 {
				br = "└┄ "
			}
			draw(l, next, br, true)
		}
	}
	draw(root, "", "", false)
	return b.String()
}

// variable are the attributes that differ between runs (ports, addresses, ids, sizes).
var variable = map[string]bool{"server.port": true, "network.peer.port": true, "client.address": true,
	"network.peer.address": true, "server.address": true, "user_agent.original": true, "quotaplane.request_id": true,
	"http.response.body.size": true, "http.request.body.size": true, "network.protocol.version": true,
	"db.namespace": true, "db.query.text": true, "pgx.conn_id": true}

func stableAttrs(kvs []attribute.KeyValue) string {
	var parts []string
	for _, kv := range kvs {
		if !variable[string(kv.Key)] {
			parts = append(parts, string(kv.Key)+"="+kv.Value.Emit())
		}
	}
	slices.Sort(parts)
	if len(parts) == 0 {
		return ""
	}
	return " " + strings.Join(parts, " ")
}

func writeOutput(t *testing.T, name, text string) {
	t.Helper()
	dir := filepath.Join("..", "..", "test-output", "tracing")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCoalescedChecksLinkTheirPipeline: concurrent checks share pipelines; every
// check's span links to exactly one redis.pipeline span, and every pipeline span
// links to as many checks as it carried.
func TestCoalescedChecksLinkTheirPipeline(t *testing.T) {
	r, exp := newTracedReplica(t)
	key, _ := r.setup("acme")
	r.mustDo("PATCH", "/v1/plans/p-acme", operatorToken, `{"limits":[{"metric":"requests","window":"minute","limit":100000}]}`, 200)
	r.check(key, `{"org":"acme"}`)
	exp.Reset()
	const n = 40
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if got := r.check(key, `{"org":"acme","team":"eng"}`); got.code != 200 {
				t.Errorf("check: %d %s", got.code, got.raw)
			}
		})
	}
	wg.Wait()
	spans := exp.GetSpans()
	pipes := map[trace.SpanID]tracetest.SpanStub{}
	carried := 0
	for _, s := range spans {
		if s.Name == "redis.pipeline" {
			pipes[s.SpanContext.SpanID()] = s
			size := attrs(s.Attributes)["db.operation.batch.size"]
			if fmt.Sprint(len(s.Links)) != size {
				t.Errorf("a pipeline of %s checks links to %d", size, len(s.Links))
			}
			carried += len(s.Links)
		}
	}
	checks := 0
	for _, s := range spans {
		if s.Name != "quota.check" {
			continue
		}
		checks++
		if len(s.Links) != 1 {
			t.Errorf("a check links to %d spans, want its pipeline", len(s.Links))
			continue
		}
		p, ok := pipes[s.Links[0].SpanContext.SpanID()]
		if !ok || !linksTo(p, s.SpanContext) {
			t.Errorf("a check's link is not to a pipeline that links back")
		}
	}
	if checks != n || carried != n {
		t.Errorf("%d check spans and %d checks carried by %d pipelines, want %d", checks, carried, len(pipes), n)
	}
	t.Logf("%d checks in %d pipelines", n, len(pipes))
}

// BenchmarkCheckHTTPTraced is BenchmarkCheckHTTP with tracing on and every check
// sampled, its spans batched to an exporter that drops them: what tracing costs
// when it is on (off, BenchmarkCheckHTTP is unchanged: docs/TRACING.md).
func BenchmarkCheckHTTPTraced(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	url, key := benchServerTraced(b, tp)
	drive(b, "POST", url+"/v1/check", key, func(i int64) []byte {
		return fmt.Appendf(nil, `{"org":"acme","team":"eng","user":"u%d"}`, i%1000)
	}, 1)
}

// TestUndecidedCheckTrace: with the check's Redis down (and the plan failing closed),
// the quota.check span says degraded and records the error, and the pipeline's span
// counts the command that failed.
func TestUndecidedCheckTrace(t *testing.T) {
	r, exp := newTracedReplicaOn(t, "redis://127.0.0.1:1/0") // nothing listens there
	key, _ := r.setup("acme")
	exp.Reset()
	if got := r.check(key, `{"org":"acme","team":"eng"}`); got.code != 503 {
		t.Fatalf("check with Redis down: %d %s", got.code, got.raw)
	}
	spans := exp.GetSpans()
	check := spanNamed(t, spans, "quota.check")
	wantAttrs(t, check, map[string]string{"quotaplane.degraded": "true", "quotaplane.pool": "default"})
	if _, ok := attrs(check.Attributes)["quotaplane.allowed"]; ok {
		t.Errorf("an undecided check says whether it was allowed")
	}
	if check.Status.Code.String() != "Error" || len(check.Events) == 0 || check.Events[0].Name != "exception" {
		t.Errorf("undecided check: status %v, events %v; want an error recorded", check.Status, check.Events)
	}
	pipe := spanNamed(t, spans, "redis.pipeline")
	wantAttrs(t, pipe, map[string]string{"quotaplane.pipeline.failed": "1"})
	if pipe.Status.Code.String() != "Error" {
		t.Errorf("pipeline status %v, want Error", pipe.Status)
	}
	wantAttrs(t, spanNamed(t, spans, "POST /v1/check"), map[string]string{"http.response.status_code": "503"})
}
