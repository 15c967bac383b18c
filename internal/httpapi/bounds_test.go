package httpapi_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
)

// refusals reads quotaplane_org_bound_refusals_total{org, bound} from reg.
func refusals(t *testing.T, reg *prometheus.Registry, org, bound string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "quotaplane_org_bound_refusals_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label(m, "org") == org && label(m, "bound") == bound {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Past an org's bounds on the shared Redis, checks (single and batch) get a 422
// problem naming the bound and the field, and the refusal is counted in
// quotaplane_org_bound_refusals_total; 2,000 denied checks with unique keys leave no
// idempotency record.
func TestOrgBoundsOverHTTP(t *testing.T) {
	prefix := testenv.ID(t, "h")
	reg := prometheus.NewRegistry()
	r := newReplicaEngine(t, testenv.PostgresURL(t), prefix, time.Hour, reg,
		quota.Config{KeyPrefix: prefix, IdempotencyRecords: 30, UnregisteredUsers: 3})
	key, _ := r.setup("acme")

	// 20 requests a minute: the rest of 2,000 checks with unique keys are denied
	var checks []string
	allowed := 0
	for batch := range 20 {
		checks = checks[:0]
		for i := range 100 {
			checks = append(checks, fmt.Sprintf(`{"org":"acme","team":"eng","idempotency_key":"k-%04d-%03d"}`, batch, i))
		}
		allowed += strings.Count(r.mustDo("POST", "/v1/check/batch", key, `{"checks":[`+join(checks)+`]}`, 200), `"allowed":true`)
	}
	if allowed < 20 || allowed > 25 { // 20 a minute (a little more if the minute turned)
		t.Fatalf("%d of 2,000 checks allowed", allowed)
	}
	rdb := testenv.Redis(t)
	recs, err := rdb.Keys(t.Context(), prefix+":{acme}|i|*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != allowed {
		t.Errorf("%d idempotency records after 2,000 checks of which %d counted; want %d", len(recs), allowed, allowed)
	}

	problem := func(code int, raw, field, bound string) {
		t.Helper()
		var p api.Problem
		_ = json.Unmarshal([]byte(raw), &p)
		if code != 422 || p.Detail == nil || !strings.Contains(*p.Detail, bound) || len(p.Errors) != 1 || p.Errors[0].Field != field {
			t.Errorf("past %s = %d %s; want 422 naming %s and field %s", bound, code, raw, bound, field)
		}
	}
	// unregistered users: 3 pass, the fourth is refused
	r.mustDo("PATCH", "/v1/plans/p-acme", operatorToken, `{"limits":[{"metric":"requests","window":"month","limit":1000}]}`, 200)
	for _, u := range []string{"u1", "u2", "u3"} {
		if got := r.check(key, `{"org":"acme","team":"eng","user":"`+u+`"}`); got.code != 200 {
			t.Fatalf("user %s = %d %s", u, got.code, got.raw)
		}
	}
	got := r.check(key, `{"org":"acme","team":"eng","user":"u4"}`)
	problem(got.code, got.raw, "user", "unregistered_users")
	rec := r.f.do("POST", "/v1/check/batch", key, `{"checks":[{"org":"acme","team":"eng","user":"u5"},{"org":"acme","team":"eng","user":"u1"}]}`)
	var out struct {
		Results []json.RawMessage `json:"results"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || len(out.Results) != 2 {
		t.Fatalf("batch = %d %s", rec.Code, rec.Body)
	}
	problem(422, string(out.Results[0]), "user", "unregistered_users")
	if !strings.Contains(string(out.Results[1]), `"allowed":true`) {
		t.Errorf("a counted user in the batch: %s", out.Results[1])
	}
	if n := refusals(t, reg, "acme", "unregistered_users"); n != 2 {
		t.Errorf("quotaplane_org_bound_refusals_total{bound=unregistered_users} = %v, want 2", n)
	}

	// idempotency records: up to 30 stored, then refused
	for i := range 30 - allowed {
		if got := r.check(key, fmt.Sprintf(`{"org":"acme","team":"eng","idempotency_key":"more-%04d"}`, i)); got.code != 200 {
			t.Fatalf("record %d = %d %s", allowed+i, got.code, got.raw)
		}
	}
	got = r.check(key, `{"org":"acme","team":"eng","idempotency_key":"one-too-many"}`)
	problem(got.code, got.raw, "idempotency_key", "idempotency_records")
	if n := refusals(t, reg, "acme", "idempotency_records"); n != 1 {
		t.Errorf("quotaplane_org_bound_refusals_total{bound=idempotency_records} = %v, want 1", n)
	}
}
