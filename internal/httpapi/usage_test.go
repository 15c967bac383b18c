package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jackc/pgx/v5/pgxpool"
	openapi_types "github.com/oapi-codegen/runtime/types"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/httpapi"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/platform/cachemetrics"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
	"github.com/quotaplane/quotaplane/internal/webhooks"
)

// billingReplica is an api with the usage and billing service, plus the worker's
// flusher and closer over the same database and Redis prefix.
type billingReplica struct {
	*replica
	reg     *prometheus.Registry // the replica's metrics, its engines' among them
	store   *billing.Store
	engines ledger.CounterSource
	flusher *ledger.Flusher
	svc     *tenants.Service
}

func newBillingReplica(t *testing.T) *billingReplica {
	t.Helper()
	return newBillingReplicaWith(t, "u", nil)
}

// newBillingReplicaWith is newBillingReplica with its key prefix starting with tag
// and, when clock is set, the tenancy service on that clock and a resolved-limits
// cache of an hour's TTL on an invalidation channel of its own.
func newBillingReplicaWith(t *testing.T, tag string, clock *testenv.Clock) *billingReplica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pool, err := pgxpool.New(ctx, testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	prefix := testenv.ID(t, tag)
	opts := []tenants.Option{tenants.WithPasswordCost(64, 1)}
	if clock != nil {
		opts = append(opts, tenants.WithClock(clock.Now))
	}
	svc := tenants.NewService(pool, opts...)
	rdb := testenv.Redis(t)
	reg := prometheus.NewRegistry()
	var cache *tenants.Cache // nil: the handler's own
	if clock != nil {
		cache = tenants.NewCache(svc, tenants.CacheOptions{TTL: time.Hour, KeyTTL: time.Hour, Metrics: cachemetrics.New(reg),
			Channel: tenants.InvalidationChannel + ":" + prefix})
		cache.Listen(ctx, rdb)
	}
	store := billing.NewStore(pool)
	router, err := quota.NewEngines(quota.EnginesConfig{DefaultURL: testenv.RedisURL(t), RedisTimeout: testRedisTimeout,
		Registerer: reg, Engine: quota.Config{KeyPrefix: prefix, Hydrator: store.Ledger()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = router.Close() })
	engines := ledger.EngineCounters(router)
	quiet := slog.New(slog.NewJSONHandler(io.Discard, nil))
	h, err := httpapi.NewHandler(httpapi.Deps{Tenants: svc, Cache: cache, Checker: router, Redis: rdb, Registry: reg,
		AdminToken: operatorToken, Logger: quiet,
		Billing:  &billing.Service{Store: store, Tenants: svc, Counters: engines, Logger: quiet},
		Webhooks: &webhooks.Service{Store: webhooks.NewStore(pool), Tenants: svc, Secret: webhookMaster}})
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{f: &fixture{t: t, h: h, pool: pool, svc: svc, tokens: map[string]string{"operator": operatorToken}}}
	return &billingReplica{replica: r, reg: reg, store: store, engines: engines, svc: svc,
		flusher: ledger.NewFlusher(ledger.FlusherConfig{Store: store.Ledger(), Tenants: svc, Counters: engines, Logger: quiet})}
}

func (b *billingReplica) key(org string, scopes string) string {
	var k api.ApiKeyCreated
	_ = json.Unmarshal([]byte(b.mustDo("POST", "/v1/orgs/"+org+"/api-keys", operatorToken, `{"name":"k","scopes":`+scopes+`}`, 201)), &k)
	return k.Secret
}

// The usage API answers live usage (before any flush) per org, team and user with
// month limits; exports stream CSV and JSON of the same rows; both authorize like
// the rest of the org API, and bad input is a 400 problem.
func TestUsageAndBillingExportOverHTTP(t *testing.T) {
	b := newBillingReplica(t)
	org := testenv.ID(t, "acme")
	b.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p-`+org+`","name":"P","fail_mode":"closed",
		"limits":[{"metric":"requests","window":"month","limit":1000},{"metric":"requests","window":"minute","limit":100}],
		"pricing":{"currency":"EUR","base_price":"10","metrics":[{"metric":"requests","included_units":10,"overage_price":"0.5"}]}}`, 201)
	b.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"`+org+`","name":"O","plan":"p-`+org+`"}`, 201)
	b.mustDo("POST", "/v1/orgs/"+org+"/teams", operatorToken, `{"id":"eng","name":"Eng",
		"limits":[{"metric":"requests","window":"month","limit":500}],
		"user_limits":[{"metric":"requests","window":"month","limit":50}]}`, 201)
	b.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"other-`+org+`","name":"O2","plan":"p-`+org+`"}`, 201)
	checkKey, billingKey, adminKey := b.key(org, `["check"]`), b.key(org, `["billing"]`), b.key(org, `["admin"]`)
	otherKey := b.key("other-"+org, `["admin","billing"]`)

	for _, c := range []string{`"user":"alice","cost":2`, `"user":"alice","cost":2`, `"user":"alice","cost":2`,
		`"user":"bob","cost":5`, `"cost":1`} {
		b.mustDo("POST", "/v1/check", checkKey, `{"org":"`+org+`","team":"eng",`+c+`}`, 200)
	}

	// Live: nothing has been flushed yet.
	var u api.Usage
	if err := json.Unmarshal([]byte(b.mustDo("GET", "/v1/orgs/"+org+"/usage", billingKey, "", 200)), &u); err != nil {
		t.Fatal(err)
	}
	month := func(limit, used int64) []api.WindowUsage {
		return []api.WindowUsage{{Window: "month", Limit: limit, Used: used, Remaining: limit - used}}
	}
	eng := "eng"
	want := []api.MetricUsage{{Metric: "requests",
		Org:   api.UsageLevel{Id: org, Used: 12, Limits: month(1000, 12)},
		Teams: []api.UsageLevel{{Id: "eng", Used: 12, Limits: month(500, 12)}},
		Users: []api.UsageLevel{{Id: "alice", Team: &eng, Used: 6, Limits: month(50, 6)}, {Id: "bob", Team: &eng, Used: 5, Limits: month(50, 5)}},
	}}
	// The org's minute window is live too (read with a cost-0 check); the checks above
	// may straddle a minute boundary, where the sliding estimate decays.
	if len(u.Metrics) == 1 && len(u.Metrics[0].Org.Limits) == 2 {
		m := u.Metrics[0].Org.Limits[0]
		if m.Window != "minute" || m.Limit != 100 || m.Used < 0 || m.Used > 12 || m.Remaining != 100-m.Used {
			t.Fatalf("org minute window: %+v", m)
		}
		u.Metrics[0].Org.Limits = u.Metrics[0].Org.Limits[1:]
	}
	// The daily series has its own test (TestUsageDailySeriesOverHTTP).
	noDaily := cmpopts.IgnoreFields(api.MetricUsage{}, "Daily")
	if diff := cmp.Diff(want, u.Metrics, noDaily); diff != "" {
		t.Fatalf("usage (-want +got):\n%s", diff)
	}
	per := vocab.PeriodAt(time.Now(), 1)
	if u.Org != org || u.Period != per.ID || !u.PeriodStart.Equal(per.Start) || !u.PeriodEnd.Equal(per.End) {
		t.Fatalf("usage header: %+v", u)
	}

	// Exports read the ledger: flush first, as the worker does every interval.
	if _, err := b.flusher.FlushOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec := b.f.do("GET", "/v1/orgs/"+org+"/billing/export?format=csv", billingKey, "")
	if rec.Code != 200 || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/csv") {
		t.Fatalf("csv export: %d %s %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
	wantCSV := "period,org,team,user,metric,units,included_units,overage_units,amount,currency,granted_units,spend_amount,spend_currency,rate_price,rate_per\n" +
		per.ID + "," + org + ",eng,,requests,1,0,0,0,EUR,0,,,,0\n" +
		per.ID + "," + org + ",eng,alice,requests,6,0,0,0,EUR,0,,,,0\n" +
		per.ID + "," + org + ",eng,bob,requests,5,0,0,0,EUR,0,,,,0\n" +
		per.ID + "," + org + ",,,requests,12,10,2,1,EUR,0,,,,0\n"
	if diff := cmp.Diff(wantCSV, rec.Body.String()); diff != "" {
		t.Fatalf("csv (-want +got):\n%s", diff)
	}
	var rows []api.BillingRow
	body := b.mustDo("GET", "/v1/orgs/"+org+"/billing/export?period="+per.ID, adminKey, "", 200)
	if err := json.Unmarshal([]byte(body), &rows); err != nil || len(rows) != 4 || rows[3].Amount != "1" || rows[3].OverageUnits != 2 {
		t.Fatalf("json export: %v %s", err, body)
	}
	// All orgs: operator only.
	if !strings.Contains(b.mustDo("GET", "/v1/billing/export?format=csv&period="+per.ID, operatorToken, "", 200), ","+org+",,,requests,12,") {
		t.Fatal("all-orgs export lacks the org's total")
	}

	// After the close the usage of the period comes from the closed rows.
	closer := billing.NewCloser(billing.CloserConfig{Store: b.store, Tenants: b.svc, Counters: b.engines,
		Clock: func() time.Time { return per.End.Add(time.Hour) }, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if _, err := closer.Close(context.Background(), org, per.ID); err != nil {
		t.Fatal(err)
	}
	var closed api.Usage
	_ = json.Unmarshal([]byte(b.mustDo("GET", "/v1/orgs/"+org+"/usage?period="+per.ID, operatorToken, "", 200)), &closed)
	if diff := cmp.Diff(want, closed.Metrics, noDaily); diff != "" {
		t.Fatalf("closed usage (-want +got):\n%s", diff)
	}

	for _, tc := range []struct {
		name, path, token string
		want              int
	}{
		{"no token", "/v1/orgs/" + org + "/usage", "", 401},
		{"check scope only", "/v1/orgs/" + org + "/usage", checkKey, 403},
		{"other org's key", "/v1/orgs/" + org + "/usage", otherKey, 404},
		{"unknown org", "/v1/orgs/nope-" + org + "/usage", operatorToken, 404},
		{"bad period", "/v1/orgs/" + org + "/usage?period=2026-13", billingKey, 400},
		{"bad period shape", "/v1/orgs/" + org + "/usage?period=26-1", billingKey, 400},
		{"period not begun", "/v1/orgs/" + org + "/usage?period=9999-12", billingKey, 400},
		{"would-block: period not begun", "/v1/orgs/" + org + "/would-block?period=9999-12", billingKey, 400},
		{"export: check scope only", "/v1/orgs/" + org + "/billing/export", checkKey, 403},
		{"export: other org's key", "/v1/orgs/" + org + "/billing/export", otherKey, 404},
		{"export: unknown org", "/v1/orgs/nope-" + org + "/billing/export", operatorToken, 404},
		{"export: bad format", "/v1/orgs/" + org + "/billing/export?format=xml", billingKey, 400},
		{"export: bad period", "/v1/orgs/" + org + "/billing/export?period=2026-00", billingKey, 400},
		{"all orgs: org key", "/v1/billing/export", adminKey, 403},
		{"all orgs: bad format", "/v1/billing/export?format=pdf", operatorToken, 400},
		{"all orgs: no token", "/v1/billing/export", "", 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := b.f.do("GET", tc.path, tc.token, "")
			if rec.Code != tc.want {
				t.Fatalf("%s = %d, want %d: %s", tc.path, rec.Code, tc.want, rec.Body)
			}
			if tc.want >= 400 && rec.Header().Get("Content-Type") != "application/problem+json" {
				t.Fatalf("content type %q", rec.Header().Get("Content-Type"))
			}
			if strings.Contains(tc.name, "not begun") && !strings.Contains(rec.Body.String(), "9999-12 has not begun (the current period is ") {
				t.Errorf("%s: %s, want it to say the period has not begun and which is current", tc.path, rec.Body)
			}
		})
	}
}

// The worker's flusher records the org's cumulative usage per UTC day in the flush
// transaction; the usage API returns it as each metric's daily series, with today's
// live total as the last point of the current period, and the closed period's series
// ends with its final usage on its last day.
func TestUsageDailySeriesOverHTTP(t *testing.T) {
	b := newBillingReplica(t)
	ctx := context.Background()
	org := testenv.ID(t, "daily")
	b.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p-`+org+`","name":"P","fail_mode":"closed",
		"limits":[{"metric":"requests","window":"month","limit":1000}]}`, 201)
	b.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"`+org+`","name":"O","plan":"p-`+org+`"}`, 201)
	b.mustDo("POST", "/v1/orgs/"+org+"/teams", operatorToken, `{"id":"eng","name":"Eng"}`, 201)
	checkKey, billingKey := b.key(org, `["check"]`), b.key(org, `["billing"]`)
	spend := func(n int) {
		b.mustDo("POST", "/v1/check", checkKey, `{"org":"`+org+`","team":"eng","user":"alice","cost":`+fmt.Sprint(n)+`}`, 200)
	}
	quiet := slog.New(slog.NewJSONHandler(io.Discard, nil))
	per := vocab.PeriodAt(time.Now(), 1)
	flushAt := func(at time.Time) {
		t.Helper()
		f := ledger.NewFlusher(ledger.FlusherConfig{Store: b.store.Ledger(), Tenants: b.svc, Counters: b.engines, Logger: quiet,
			Clock: func() time.Time { return at }})
		if _, err := f.FlushOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	series := func(path string) []api.DailyUsage {
		t.Helper()
		var u api.Usage
		if err := json.Unmarshal([]byte(b.mustDo("GET", path, billingKey, "", 200)), &u); err != nil {
			t.Fatal(err)
		}
		if len(u.Metrics) != 1 || u.Metrics[0].Daily == nil {
			t.Fatalf("usage without a daily series: %+v", u)
		}
		return *u.Metrics[0].Daily
	}
	day := func(d time.Time, used int64) api.DailyUsage {
		return api.DailyUsage{Day: openapi_types.Date{Time: time.Date(d.Year(), d.Month(), d.Day(), 0, 0, 0, 0, time.UTC)}, Used: used}
	}

	// Before anything is used there is no history: an empty series, not a made-up one.
	var empty api.Usage
	_ = json.Unmarshal([]byte(b.mustDo("GET", "/v1/orgs/"+org+"/usage", billingKey, "", 200)), &empty)
	if len(empty.Metrics) != 1 || empty.Metrics[0].Daily == nil || len(*empty.Metrics[0].Daily) != 0 {
		t.Fatalf("unused metric: %+v", empty.Metrics)
	}

	dayA, dayB := per.Start.Add(36*time.Hour), per.Start.Add(60*time.Hour) // the 2nd and 3rd of the period, noon
	spend(5)
	flushAt(dayA)
	spend(7)
	flushAt(dayB)
	flushAt(dayB.Add(time.Hour)) // nothing changed: nothing new
	spend(3)                     // not flushed: only the live total knows it

	// The live point is today's, merged with a stored point of the same day.
	want := map[time.Time]int64{day(dayA, 0).Day.Time: 5, day(dayB, 0).Day.Time: 12}
	today := day(time.Now().UTC(), 0).Day.Time
	want[today] = max(want[today], 15)
	var wantSeries []api.DailyUsage
	for d, v := range want {
		wantSeries = append(wantSeries, day(d, v))
	}
	sort.Slice(wantSeries, func(i, j int) bool { return wantSeries[i].Day.Before(wantSeries[j].Day.Time) })
	if diff := cmp.Diff(wantSeries, series("/v1/orgs/"+org+"/usage")); diff != "" {
		t.Fatalf("open period's daily series (-want +got):\n%s", diff)
	}
	var rows int
	if err := b.f.pool.QueryRow(ctx, `SELECT count(*) FROM usage_daily WHERE org_id = $1`, org).Scan(&rows); err != nil || rows != 2 {
		t.Fatalf("usage_daily rows: %d (%v), want 2: one per flushed day", rows, err)
	}

	// Closed: the recorded days, and the final usage at the end of the last day.
	closer := billing.NewCloser(billing.CloserConfig{Store: b.store, Tenants: b.svc, Counters: b.engines,
		Clock: func() time.Time { return per.End.Add(time.Hour) }, Logger: quiet})
	if _, err := closer.Close(ctx, org, per.ID); err != nil {
		t.Fatal(err)
	}
	wantClosed := []api.DailyUsage{day(dayA, 5), day(dayB, 12), day(per.End.Add(-time.Hour), 15)}
	if diff := cmp.Diff(wantClosed, series("/v1/orgs/"+org+"/usage?period="+per.ID)); diff != "" {
		t.Fatalf("closed period's daily series (-want +got):\n%s", diff)
	}
}
