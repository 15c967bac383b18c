package httpapi_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// TestClientLeasesSettingOverHTTP: client_leases round-trips on plans (auto by
// default, or off) and orgs (plan by default, auto or off) through create, read and
// patch, apart from leases; only the operator changes an org's; a bad value is a 400
// naming client_leases, and a refused request writes nothing.
func TestClientLeasesSettingOverHTTP(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	plan := func(method, path, body string, code int) api.Plan {
		t.Helper()
		var p api.Plan
		if err := json.Unmarshal([]byte(r.mustDo(method, path, operatorToken, body, code)), &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	org := func(method, path, token, body string, code int) api.Org {
		t.Helper()
		var o api.Org
		if err := json.Unmarshal([]byte(r.mustDo(method, path, token, body, code)), &o); err != nil {
			t.Fatal(err)
		}
		return o
	}
	planIs := func(p api.Plan, want api.PlanClientLeases) {
		t.Helper()
		settingIs(t, "plan "+p.Id, p.ClientLeases, want, p.Leases, api.PlanLeasesAuto)
	}
	orgIs := func(o api.Org, want api.OrgClientLeases) {
		t.Helper()
		settingIs(t, "org "+o.Id, o.ClientLeases, want, o.Leases, api.OrgLeasesPlan)
	}

	planIs(plan("POST", "/v1/plans", `{"id":"p","name":"P","fail_mode":"closed","limits":[]}`, 201), api.PlanClientLeasesAuto)
	planIs(plan("POST", "/v1/plans", `{"id":"q","name":"Q","fail_mode":"closed","client_leases":"off","limits":[]}`, 201), api.PlanClientLeasesOff)
	planIs(plan("GET", "/v1/plans/q", "", 200), api.PlanClientLeasesOff)
	planIs(plan("PATCH", "/v1/plans/q", `{"client_leases":"auto"}`, 200), api.PlanClientLeasesAuto)
	planIs(plan("PATCH", "/v1/plans/p", `{"client_leases":"off"}`, 200), api.PlanClientLeasesOff)
	planIs(plan("GET", "/v1/plans/p", "", 200), api.PlanClientLeasesOff)

	orgIs(org("POST", "/v1/orgs", operatorToken, `{"id":"a","name":"A","plan":"p"}`, 201), api.OrgClientLeasesPlan)
	orgIs(org("POST", "/v1/orgs", operatorToken, `{"id":"b","name":"B","plan":"p","client_leases":"auto"}`, 201), api.OrgClientLeasesAuto)
	orgIs(org("GET", "/v1/orgs/b", operatorToken, "", 200), api.OrgClientLeasesAuto)
	orgIs(org("PATCH", "/v1/orgs/a", operatorToken, `{"client_leases":"off"}`, 200), api.OrgClientLeasesOff)
	orgIs(org("GET", "/v1/orgs/a", operatorToken, "", 200), api.OrgClientLeasesOff)
	orgIs(org("PATCH", "/v1/orgs/a", operatorToken, `{"client_leases":"plan"}`, 200), api.OrgClientLeasesPlan)

	audits := func() (n int) {
		t.Helper()
		if err := r.f.pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_log`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := audits()
	// An org admin may not change it.
	admin := keyOf(r, "b", `["admin"]`)
	before++ // the key's own audit row
	if body := r.mustDo("PATCH", "/v1/orgs/b", admin, `{"client_leases":"off","name":"Renamed"}`, 403); !strings.Contains(body, "client_leases") {
		t.Errorf("403 does not name client_leases: %s", body)
	}
	for _, bad := range []struct{ method, path, body, msg string }{
		{"POST", "/v1/plans", `{"id":"x","name":"X","fail_mode":"closed","client_leases":"plan","limits":[]}`, "auto, off"},
		{"PATCH", "/v1/plans/p", `{"client_leases":"on","name":"Renamed"}`, "auto, off"},
		{"POST", "/v1/orgs", `{"id":"c","name":"C","plan":"p","client_leases":"sometimes"}`, "plan, auto, off"},
		{"PATCH", "/v1/orgs/a", `{"client_leases":"OFF","name":"Renamed"}`, "plan, auto, off"},
	} {
		body := r.mustDo(bad.method, bad.path, operatorToken, bad.body, 400)
		if !strings.Contains(body, `"client_leases"`) || !strings.Contains(body, "must be one of "+bad.msg) {
			t.Errorf("%s %s %s: 400 does not name client_leases and its values: %s", bad.method, bad.path, bad.body, body)
		}
	}
	if n := audits(); n != before {
		t.Errorf("audit rows %d, want %d: a refused request wrote", n, before)
	}
	planIs(plan("GET", "/v1/plans/p", "", 200), api.PlanClientLeasesOff)
	if o := org("GET", "/v1/orgs/b", operatorToken, "", 200); o.Name != "B" {
		t.Errorf("org b renamed %q by a refused request", o.Name)
	}
	if o := org("GET", "/v1/orgs/a", operatorToken, "", 200); o.Name != "A" || *o.ClientLeases != api.OrgClientLeasesPlan {
		t.Errorf("org a after refusals: %q, %v", o.Name, *o.ClientLeases)
	}
	r.mustDo("GET", "/v1/plans/x", operatorToken, "", 404)
	r.mustDo("GET", "/v1/orgs/c", operatorToken, "", 404)
}

// settingIs fails t unless what (a plan or an org) says client_leases want and
// leases its default: client_leases never moves leases.
func settingIs[C, L comparable](t *testing.T, what string, got *C, want C, leases *L, leasesDefault L) {
	t.Helper()
	if got == nil || *got != want {
		t.Fatalf("%s client_leases = %v, want %v", what, got, want)
	}
	if leases == nil || *leases != leasesDefault {
		t.Fatalf("%s leases = %v, want %v: client_leases moved it", what, leases, leasesDefault)
	}
}
