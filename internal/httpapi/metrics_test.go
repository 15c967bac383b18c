package httpapi_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// counted returns every counter field that names metric in the org's Redis keys
// (month hashes and window buckets) under the key prefix; prefix "*" matches any, for
// an org id no other test uses.
func counted(t *testing.T, prefix, org, metric string) []string {
	t.Helper()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys, err := rdb.Keys(ctx, prefix+":{"+org+"}|[mw]|*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, k := range keys {
		fields, err := rdb.HKeys(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fields {
			if strings.HasPrefix(f, metric+"|") {
				out = append(out, k+" "+f)
			}
		}
	}
	return out
}

func problemOf(t *testing.T, body string) api.Problem {
	t.Helper()
	var p api.Problem
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatalf("not a problem document: %v: %s", err, body)
	}
	return p
}

// usageMetrics returns the metrics of the org's usage in the current period.
func usageMetrics(t *testing.T, b *billingReplica, org string) map[string]int64 {
	t.Helper()
	var u api.Usage
	if err := json.Unmarshal([]byte(b.mustDo("GET", "/v1/orgs/"+org+"/usage", operatorToken, "", 200)), &u); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, m := range u.Metrics {
		out[m.Metric] = m.Org.Used
	}
	return out
}

// A check of a metric its org does not know (a typo) is refused with 422 naming the
// metric and the org's metrics, and is counted nowhere: not in Redis, not in usage,
// not in the billing export. A metric the plan declares as metered, without any
// limit, is counted and billed.
func TestCheckOfUnknownMetricIsRefusedAndMeteredIsBilled(t *testing.T) {
	b := newBillingReplica(t)
	org := testenv.ID(t, "acme")
	b.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p-`+org+`","name":"P","fail_mode":"closed",
		"limits":[{"metric":"requests","window":"minute","limit":100}],"metered":["tokens"],
		"pricing":{"currency":"EUR","base_price":"10","metrics":[{"metric":"images","included_units":0,"overage_price":"0.5"}]}}`, 201)
	b.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"`+org+`","name":"O","plan":"p-`+org+`",
		"limits":[{"metric":"seconds","window":"day","limit":10}]}`, 201)
	b.mustDo("POST", "/v1/orgs/"+org+"/teams", operatorToken, `{"id":"eng","name":"Eng"}`, 201)
	key := b.key(org, `["check"]`)

	rec := b.f.do("POST", "/v1/check", key, `{"org":"`+org+`","team":"eng","user":"alice","metric":"request","cost":1000000}`)
	if rec.Code != 422 || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("typo: %d %s %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
	p := problemOf(t, rec.Body.String())
	known := "images, requests, seconds, tokens" // pricing, limits, the org's override, metered; sorted
	if p.Status != 422 || p.Detail == nil || !strings.Contains(*p.Detail, `"request"`) || !strings.Contains(*p.Detail, known) {
		t.Fatalf("detail should name the metric and list %q: %s", known, rec.Body)
	}
	if len(p.Errors) != 1 || p.Errors[0].Field != "metric" || !strings.Contains(p.Errors[0].Message, `"request"`) ||
		!strings.Contains(p.Errors[0].Message, known) {
		t.Fatalf("errors should name the field metric, the metric and %q: %s", known, rec.Body)
	}
	// A pure query of an unknown metric is refused alike.
	b.mustDo("POST", "/v1/check", key, `{"org":"`+org+`","team":"eng","metric":"request","cost":0}`, 422)

	// The default metric follows the same rule: this plan limits "requests".
	b.mustDo("POST", "/v1/check", key, `{"org":"`+org+`","team":"eng","user":"alice"}`, 200)
	// A metering-only metric is counted, though no level limits it; so are the
	// metrics of pricing and of the org's overrides.
	var res api.CheckResult
	_ = json.Unmarshal([]byte(b.mustDo("POST", "/v1/check", key, `{"org":"`+org+`","team":"eng","user":"alice","metric":"tokens","cost":700}`, 200)), &res)
	if !res.Allowed || len(res.Levels) != 0 {
		t.Fatalf("metered check: %+v", res)
	}
	b.mustDo("POST", "/v1/check", key, `{"org":"`+org+`","team":"eng","metric":"images","cost":3}`, 200)
	b.mustDo("POST", "/v1/check", key, `{"org":"`+org+`","metric":"seconds","cost":4}`, 200)

	if got := counted(t, "*", org, "request"); len(got) != 0 {
		t.Fatalf("the refused metric was counted in Redis: %v", got)
	}
	if got := counted(t, "*", org, "tokens"); len(got) == 0 {
		t.Fatal("the metered metric was not counted in Redis")
	}
	want := map[string]int64{"requests": 1, "tokens": 700, "images": 3, "seconds": 4}
	if diff := cmp.Diff(want, usageMetrics(t, b, org)); diff != "" {
		t.Fatalf("usage (-want +got):\n%s", diff)
	}

	if _, err := b.flusher.FlushOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	csv := b.mustDo("GET", "/v1/orgs/"+org+"/billing/export?format=csv", operatorToken, "", 200)
	per := vocab.PeriodAt(time.Now(), 1).ID
	if !strings.Contains(csv, per+","+org+",eng,alice,tokens,700,") || !strings.Contains(csv, per+","+org+",,,tokens,700,") {
		t.Fatalf("billing export lacks the metered metric:\n%s", csv)
	}
	if strings.Contains(csv, ",request,") {
		t.Fatalf("billing export bills the refused metric:\n%s", csv)
	}
}

// A plan that does not name "requests" refuses a check without a metric: the default
// is not exempt.
func TestDefaultMetricMustBeKnown(t *testing.T) {
	prefix := testenv.ID(t, "h")
	r := newReplica(t, testenv.PostgresURL(t), prefix)
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"tok","name":"T","fail_mode":"closed","limits":[],"metered":["tokens"]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"O","plan":"tok"}`, 201)
	out := r.check(operatorToken, `{"org":"acme"}`)
	p := problemOf(t, out.raw)
	if out.code != 422 || p.Detail == nil || !strings.Contains(*p.Detail, `"requests"`) || !strings.HasSuffix(*p.Detail, "metrics are tokens") {
		t.Fatalf("default metric: %d %s", out.code, out.raw)
	}
	if got := counted(t, prefix, "acme", "requests"); len(got) != 0 {
		t.Fatalf("counted: %v", got)
	}

	// A plan that names no metric at all says so.
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"none","name":"N","fail_mode":"closed","limits":[]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"bare","name":"B","plan":"none"}`, 201)
	out = r.check(operatorToken, `{"org":"bare","metric":"tokens"}`)
	if p := problemOf(t, out.raw); out.code != 422 || len(p.Errors) != 1 || !strings.Contains(p.Errors[0].Message, "names no metric") {
		t.Fatalf("plan without metrics: %d %s", out.code, out.raw)
	}
}

// In a batch, the check of an unknown metric gets its own 422 problem and the
// others are decided as usual.
func TestBatchRefusesUnknownMetricPerItem(t *testing.T) {
	prefix := testenv.ID(t, "h")
	r := newReplica(t, testenv.PostgresURL(t), prefix)
	key, _ := r.setup("acme")
	r.mustDo("PATCH", "/v1/plans/p-acme", operatorToken, `{"metered":["tokens"]}`, 200)
	body := r.mustDo("POST", "/v1/check/batch", key, `{"checks":[
		{"org":"acme","team":"eng","user":"alice"},
		{"org":"acme","team":"eng","user":"alice","metric":"request","cost":5},
		{"org":"acme","team":"eng","user":"alice","metric":"tokens","cost":5}]}`, 200)
	var out struct {
		Results []json.RawMessage `json:"results"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil || len(out.Results) != 3 {
		t.Fatalf("batch: %v %s", err, body)
	}
	for _, i := range []int{0, 2} {
		var res api.CheckResult
		if err := json.Unmarshal(out.Results[i], &res); err != nil || !res.Allowed {
			t.Fatalf("result %d: %s", i, out.Results[i])
		}
	}
	p := problemOf(t, string(out.Results[1]))
	if p.Status != 422 || p.Detail == nil || !strings.Contains(*p.Detail, `"request"`) || !strings.Contains(*p.Detail, "requests, tokens") ||
		len(p.Errors) != 1 || p.Errors[0].Field != "metric" {
		t.Fatalf("result 1: %s", out.Results[1])
	}
	if got := counted(t, prefix, "acme", "request"); len(got) != 0 {
		t.Fatalf("counted: %v", got)
	}
}

// Declaring a metric on a plan takes effect at once for the plan's orgs: the
// resolved org is invalidated like any other change of its plan.
func TestDeclaringAMeteredMetricTakesEffect(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	key, _ := r.setup("acme")
	check := `{"org":"acme","team":"eng","metric":"gpu_seconds","cost":2}`
	r.mustDo("POST", "/v1/check", key, check, 422)
	r.mustDo("PATCH", "/v1/plans/p-acme", operatorToken, `{"metered":["gpu_seconds"]}`, 200)
	r.mustDo("POST", "/v1/check", key, check, 200)
	r.mustDo("PATCH", "/v1/plans/p-acme", operatorToken, `{"metered":[]}`, 200)
	r.mustDo("POST", "/v1/check", key, check, 422)
}

// The metered list round-trips through create, get, patch and list, sorted; a patch
// without it keeps it; the audit log records it before and after.
func TestPlanMeteredRoundTrip(t *testing.T) {
	f := mustFixture(t)
	plan := func(body string) api.Plan {
		t.Helper()
		var p api.Plan
		if err := json.Unmarshal([]byte(body), &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	do := func(method, path, body string, want int) string {
		t.Helper()
		rec := f.do(method, path, operatorToken, body)
		if rec.Code != want {
			t.Fatalf("%s %s = %d, want %d: %s", method, path, rec.Code, want, rec.Body)
		}
		return rec.Body.String()
	}
	if got := plan(do("POST", "/v1/plans", `{"id":"m","name":"M","limits":[],"fail_mode":"open","metered":["tokens","gpu_seconds"]}`, 201)).Metered; !cmp.Equal(got, []string{"gpu_seconds", "tokens"}) {
		t.Fatalf("created: %v", got)
	}
	if got := plan(do("GET", "/v1/plans/m", "", 200)).Metered; !cmp.Equal(got, []string{"gpu_seconds", "tokens"}) {
		t.Fatalf("got: %v", got)
	}
	if got := plan(do("PATCH", "/v1/plans/m", `{"name":"M2"}`, 200)).Metered; !cmp.Equal(got, []string{"gpu_seconds", "tokens"}) {
		t.Fatalf("patch without metered: %v", got)
	}
	if got := plan(do("PATCH", "/v1/plans/m", `{"metered":["images"]}`, 200)).Metered; !cmp.Equal(got, []string{"images"}) {
		t.Fatalf("patched: %v", got)
	}
	// A plan without the field has an empty list, not null.
	if body := do("GET", "/v1/plans/pro", "", 200); !strings.Contains(body, `"metered":[]`) {
		t.Fatalf("plan without metered: %s", body)
	}
	var list api.PlanList
	_ = json.Unmarshal([]byte(do("GET", "/v1/plans", "", 200)), &list)
	for _, p := range list.Items {
		if p.Id == "m" && !cmp.Equal(p.Metered, []string{"images"}) {
			t.Fatalf("listed: %v", p.Metered)
		}
	}
	var before, after []byte
	if err := f.pool.QueryRow(context.Background(), `SELECT before, after FROM audit_log WHERE action = 'plan.update' AND object = 'plan:m'
		ORDER BY id DESC LIMIT 1`).Scan(&before, &after); err != nil {
		t.Fatal(err)
	}
	var b, a api.Plan
	if json.Unmarshal(before, &b) != nil || json.Unmarshal(after, &a) != nil ||
		!cmp.Equal(b.Metered, []string{"gpu_seconds", "tokens"}) || !cmp.Equal(a.Metered, []string{"images"}) {
		t.Fatalf("audit: before %s after %s", before, after)
	}
}

// Bad metered lists are refused with 400 in the API's terms, naming the field, and
// write nothing.
func TestPlanMeteredBadValues(t *testing.T) {
	f := mustFixture(t)
	for _, tc := range []struct {
		name, method, path, body, field string
	}{
		{"bad id", "POST", "/v1/plans", `{"id":"m","name":"M","limits":[],"fail_mode":"open","metered":["to kens"]}`, "metered[0]"},
		{"repeated", "POST", "/v1/plans", `{"id":"m","name":"M","limits":[],"fail_mode":"open","metered":["tokens","tokens"]}`, "metered"},
		{"not a list", "POST", "/v1/plans", `{"id":"m","name":"M","limits":[],"fail_mode":"open","metered":"tokens"}`, "metered"},
		{"null item", "POST", "/v1/plans", `{"id":"m","name":"M","limits":[],"fail_mode":"open","metered":[null]}`, "metered[0]"},
		{"patch: bad id", "PATCH", "/v1/plans/pro", `{"metered":["-x"]}`, "metered[0]"},
		{"patch: repeated", "PATCH", "/v1/plans/pro", `{"metered":["a","b","a"]}`, "metered"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := f.fingerprint()
			rec := f.do(tc.method, tc.path, operatorToken, tc.body)
			if rec.Code != 400 || rec.Header().Get("Content-Type") != "application/problem+json" {
				t.Fatalf("%d %s", rec.Code, rec.Body)
			}
			p := problemOf(t, rec.Body.String())
			var fields []string
			for _, e := range p.Errors {
				fields = append(fields, e.Field)
			}
			if len(p.Errors) == 0 || !strings.HasPrefix(p.Errors[0].Field, tc.field) {
				t.Fatalf("errors %v should name %s: %s", fields, tc.field, rec.Body)
			}
			if strings.Contains(rec.Body.String(), "[]string") || strings.Contains(rec.Body.String(), "Go ") {
				t.Fatalf("problem speaks Go: %s", rec.Body)
			}
			if f.fingerprint() != before {
				t.Fatal("a refused request changed the database")
			}
		})
	}
}

// Team and user allocations may only name metrics the org knows: any other could
// never apply, since its checks are refused. They answer 422 at the field and write
// nothing; a change of one list is not refused for the other.
func TestAllocationOfUnknownMetricIsRefused(t *testing.T) {
	f := mustFixture(t)
	admin := f.tokens["acme-admin"]
	for _, tc := range []struct {
		name, method, path, body, field string
	}{
		{"team limits", "POST", "/v1/orgs/acme/teams", `{"id":"ops","name":"Ops","limits":[{"metric":"requests","window":"day","limit":1},{"metric":"request","window":"day","limit":1}]}`, "limits[1].metric"},
		{"team user_limits", "POST", "/v1/orgs/acme/teams", `{"id":"ops","name":"Ops","user_limits":[{"metric":"tokens","window":"day","limit":1}]}`, "user_limits[0].metric"},
		{"team patch", "PATCH", "/v1/orgs/acme/teams/eng", `{"user_limits":[{"metric":"tokens","window":"day","limit":1}]}`, "user_limits[0].metric"},
		{"user", "POST", "/v1/orgs/acme/teams/eng/users", `{"id":"zoe","limits":[{"metric":"tokens","window":"day","limit":1}]}`, "limits[0].metric"},
		{"user patch", "PATCH", "/v1/orgs/acme/teams/eng/users/alice", `{"limits":[{"metric":"tokens","window":"day","limit":1}]}`, "limits[0].metric"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := f.fingerprint()
			rec := f.do(tc.method, tc.path, admin, tc.body)
			if rec.Code != 422 {
				t.Fatalf("%d %s", rec.Code, rec.Body)
			}
			p := problemOf(t, rec.Body.String())
			if len(p.Errors) != 1 || p.Errors[0].Field != tc.field || !strings.Contains(p.Errors[0].Message, "metrics are requests") {
				t.Fatalf("want one error at %s listing the org's metrics: %s", tc.field, rec.Body)
			}
			if f.fingerprint() != before {
				t.Fatal("a refused request changed the database")
			}
		})
	}
	// Once the plan declares the metric, the same allocation is taken.
	if rec := f.do("PATCH", "/v1/plans/pro", operatorToken, `{"metered":["tokens"]}`); rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if rec := f.do("PATCH", "/v1/orgs/acme/teams/eng/users/alice", admin, `{"limits":[{"metric":"tokens","window":"day","limit":1}]}`); rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
}

// The other way round: a change of the plan or of the org's overrides that would
// make the org forget a metric its teams or users allocate is refused with 422 at the
// field that caused it, and writes nothing, as lowering a parent below its children is.
func TestForgettingAnAllocatedMetricIsRefused(t *testing.T) {
	f := mustFixture(t)
	must := func(method, path, token, body string, want int) api.Problem {
		t.Helper()
		before := f.fingerprint()
		rec := f.do(method, path, token, body)
		if rec.Code != want {
			t.Fatalf("%s %s = %d, want %d: %s", method, path, rec.Code, want, rec.Body)
		}
		var p api.Problem
		if want >= 400 {
			p = problemOf(t, rec.Body.String())
			if f.fingerprint() != before {
				t.Fatalf("%s %s: a refused request changed the database", method, path)
			}
		}
		return p
	}
	forgot := func(p api.Problem, field string) {
		t.Helper()
		named := false
		for _, e := range p.Errors {
			if e.Field != field {
				t.Fatalf("error at %s, want %s: %+v", e.Field, field, p.Errors)
			}
			named = named || strings.Contains(e.Message, `user "alice" allocates metric "tokens"`)
		}
		if !named {
			t.Fatalf("no error at %s names alice's tokens: %+v", field, p.Errors)
		}
	}
	must("PATCH", "/v1/plans/pro", operatorToken, `{"metered":["tokens"]}`, 200)
	must("PATCH", "/v1/orgs/acme/teams/eng/users/alice", f.tokens["acme-admin"], `{"limits":[{"metric":"tokens","window":"day","limit":1}]}`, 200)

	forgot(must("PATCH", "/v1/plans/pro", operatorToken, `{"metered":[]}`, 422), "metered")
	forgot(must("PATCH", "/v1/orgs/acme", operatorToken, `{"plan":"free"}`, 422), "plan")
	// An override of the org names the metric too; then the plan may drop it, and the
	// override may not go.
	must("PATCH", "/v1/orgs/acme", operatorToken, `{"limits":[{"metric":"tokens","window":"month","limit":100}]}`, 200)
	must("PATCH", "/v1/plans/pro", operatorToken, `{"metered":[]}`, 200)
	forgot(must("PATCH", "/v1/orgs/acme", operatorToken, `{"limits":[]}`, 422), "limits")
	// Once the allocation is gone, so is the constraint.
	must("PATCH", "/v1/orgs/acme/teams/eng/users/alice", f.tokens["acme-admin"], `{"limits":[]}`, 200)
	must("PATCH", "/v1/orgs/acme", operatorToken, `{"limits":[]}`, 200)
}

// "pricing": null in a plan PATCH removes the pricing, as the spec says; leaving the
// field out keeps it. (The generated type reads null as absent: the pricing stayed.)
func TestPlanPatchNullRemovesPricing(t *testing.T) {
	f := mustFixture(t)
	do := func(method, path, body string, want int) api.Plan {
		t.Helper()
		rec := f.do(method, path, operatorToken, body)
		if rec.Code != want {
			t.Fatalf("%s %s = %d, want %d: %s", method, path, rec.Code, want, rec.Body)
		}
		var p api.Plan
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	do("POST", "/v1/plans", `{"id":"priced","name":"P","fail_mode":"open","limits":[{"metric":"requests","window":"month","limit":100}],
		"pricing":{"currency":"USD","base_price":"10","metrics":[{"metric":"requests","included_units":50,"overage_price":"0.01"}]}}`, 201)
	if p := do("PATCH", "/v1/plans/priced", `{"name":"P2"}`, 200); p.Pricing == nil {
		t.Fatal("a patch without pricing removed it")
	}
	if p := do("PATCH", "/v1/plans/priced", `{"pricing": null}`, 200); p.Pricing != nil {
		t.Fatalf("pricing after null = %+v, want none", *p.Pricing)
	}
	if p := do("GET", "/v1/plans/priced", "", 200); p.Pricing != nil || p.Name != "P2" {
		t.Fatalf("stored plan = %+v", p)
	}
}

// The counters the alerts read are at 0 on a fresh replica, so rate() sees their first
// event (a series that appears at 1 is a step it never sees): checks by decision,
// level, mode and degraded; plan "none" and org "_other" by decision; the 5xx of every
// route. A plan's and an org's series start, every decision at 0, with their first
// check.
func TestMetricsStartAtZero(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	text := r.f.do("GET", "/metrics", "", "").Body.String()
	for _, want := range []string{
		`quotaplane_checks_total{blocked_level="",decision="allowed",degraded="false",mode="enforce"} 0`,
		`quotaplane_checks_total{blocked_level="",decision="error",degraded="false",mode="enforce"} 0`,
		`quotaplane_checks_total{blocked_level="org",decision="denied",degraded="false",mode="enforce"} 0`,
		`quotaplane_checks_total{blocked_level="user",decision="denied",degraded="true",mode="shadow"} 0`,
		`quotaplane_plan_checks_total{decision="denied",degraded="true",plan="none"} 0`,
		`quotaplane_org_checks_total{decision="denied",org="_other"} 0`,
		`quotaplane_http_requests_total{method="POST",route="/v1/check",status="500"} 0`,
		`quotaplane_http_requests_total{method="POST",route="/v1/check",status="503"} 0`,
		`quotaplane_http_requests_total{method="GET",route="/v1/orgs/{org}",status="500"} 0`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("a fresh replica's /metrics has no %s", want)
		}
	}
	key, _ := r.setup("acme")
	if got := r.check(key, `{"org":"acme","team":"eng","user":"u"}`); got.code != 200 {
		t.Fatalf("check = %d %s", got.code, got.raw)
	}
	text = r.f.do("GET", "/metrics", "", "").Body.String()
	for _, want := range []string{
		`quotaplane_plan_checks_total{decision="denied",degraded="false",plan="p-acme"} 0`,
		`quotaplane_plan_checks_total{decision="allowed",degraded="true",plan="p-acme"} 0`,
		`quotaplane_org_checks_total{decision="denied",org="acme"} 0`,
		`quotaplane_org_checks_total{decision="allowed",org="acme"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("after acme's first check /metrics has no %s", want)
		}
	}
}
