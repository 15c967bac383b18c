package httpapi_test

import (
	"encoding/json"
	"sort"
	"testing"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
)

// An object that names a member twice is refused on every route with a body, naming
// the member by its path: encoding/json kept the last ({"cost":1,"cost":30} counted
// 30), where a gateway reading the first would disagree about what was charged.
// Nothing is written, counted, held or settled. Every operation of the spec with a
// request body has a row here (the test fails when one is added without one).
func TestFieldNamedTwiceIsRefusedOnEveryBody(t *testing.T) {
	f := mustFixture(t)
	key, admin, op := f.tokens["acme-check"], f.tokens["acme-admin"], f.tokens["operator"]
	rec := f.do("POST", "/v1/reservations", key, `{"org":"acme","metric":"requests","amount":2,"ttl_seconds":600}`)
	var held api.Reservation
	if err := json.Unmarshal(rec.Body.Bytes(), &held); rec.Code != 201 || err != nil {
		t.Fatalf("reserve = %d %s", rec.Code, rec.Body)
	}
	res := "/v1/reservations/" + held.Id
	cases := []struct {
		opID, method, path, token, body, field string
	}{
		{"Check", "POST", "/v1/check", key, `{"org":"acme","metric":"requests","cost":3,"cost":30}`, "cost"},
		{"Check", "POST", "/v1/check", key, `{"org":"other","org":"acme","metric":"requests","cost":1}`, "org"},
		{"Check", "POST", "/v1/check", key, `{"org":"acme","costs":{"requests":3,"requests":30}}`, "costs.requests"},
		{"Check", "POST", "/v1/check", key, `{"org":"acme","metric":"requests","cost":1,"idempotency_key":"order-0001","idempotency_key":"order-0002"}`, "idempotency_key"},
		{"CheckBatch", "POST", "/v1/check/batch", key, `{"checks":[{"org":"acme","cost":1}],"checks":[{"org":"acme","cost":30}]}`, "checks"},
		{"CheckBatch", "POST", "/v1/check/batch", key, `{"checks":[{"org":"acme","cost":1},{"org":"acme","cost":3,"cost":30}]}`, "checks[1].cost"},
		{"CheckBatch", "POST", "/v1/check/batch", key, `{"checks":[{"org":"acme","costs":{"requests":1,"requests":9}}]}`, "checks[0].costs.requests"},
		{"CreateReservation", "POST", "/v1/reservations", key, `{"org":"acme","metric":"requests","amount":1,"amount":50}`, "amount"},
		{"CreateReservation", "POST", "/v1/reservations", key, `{"org":"acme","amounts":{"requests":1,"requests":50}}`, "amounts.requests"},
		{"CommitReservation", "POST", res + "/commit", key, `{"used":1,"used":2}`, "used"},
		{"CommitReservation", "POST", res + "/commit", key, `{"used":{"requests":1,"requests":2}}`, "used.requests"},
		{"ExtendReservation", "POST", res + "/extend", key, `{"ttl_seconds":30,"ttl_seconds":900}`, "ttl_seconds"},
		{"CreateLease", "POST", "/v1/leases", key, `{"org":"acme","rate":1,"rate":1e9}`, "rate"},
		{"CreateLease", "POST", "/v1/leases", key, `{"org":"other","org":"acme","rate":5}`, "org"},
		{"SettleLease", "POST", "/v1/leases/" + held.Id + "/settle", key, `{"used":0,"used":2}`, "used"},
		{"SettleLease", "POST", "/v1/leases/" + held.Id + "/settle", key, `{"used":0,"renew":false,"renew":true}`, "renew"},
		{"CreatePlan", "POST", "/v1/plans", op, `{"id":"p9","name":"P","name":"Q","fail_mode":"open","limits":[]}`, "name"},
		{"CreatePlan", "POST", "/v1/plans", op, `{"id":"p9","name":"P","fail_mode":"open","limits":[{"metric":"requests","window":"day","limit":1,"limit":9}]}`, "limits[0].limit"},
		{"PatchPlan", "PATCH", "/v1/plans/pro", op, `{"name":"A","name":"B"}`, "name"},
		{"CreateCapacity", "POST", "/v1/capacities", op, `{"id":"c9","metric":"tokens","window":"minute","limit":1,"limit":9}`, "limit"},
		{"PatchCapacity", "PATCH", "/v1/capacities/c9", op, `{"saturation":0.5,"saturation":0.9}`, "saturation"},
		{"PutPlanThrottle", "PUT", "/v1/plans/pro/throttle", op, `{"factor":0.5,"factor":0.1,"reason":"x"}`, "factor"},
		{"CreateOrg", "POST", "/v1/orgs", op, `{"id":"o9","name":"O","plan":"free","plan":"pro"}`, "plan"},
		{"PatchOrg", "PATCH", "/v1/orgs/acme", admin, `{"mode":"enforce","mode":"shadow"}`, "mode"},
		{"PatchOrg", "PATCH", "/v1/orgs/acme", admin, `{"webhook_url":"https://a.example/h","webhook_url":"https://b.example/h"}`, "webhook_url"},
		{"CreateApiKey", "POST", "/v1/orgs/acme/api-keys", admin, `{"name":"k","scopes":["check"],"scopes":["admin"]}`, "scopes"},
		{"CreateGrant", "POST", "/v1/orgs/acme/grants", op, `{"metric":"requests","units":5,"units":5000,"reason":"x"}`, "units"},
		{"CreateConsoleUser", "POST", "/v1/orgs/acme/console-users", admin, `{"email":"b@acme.test","password":"correct horse battery","role":"viewer","role":"admin"}`, "role"},
		{"CreateTeam", "POST", "/v1/orgs/acme/teams", admin, `{"id":"t9","id":"t8","name":"T"}`, "id"},
		{"PatchTeam", "PATCH", "/v1/orgs/acme/teams/eng", admin, `{"limits":[{"metric":"requests","window":"month","window":"day","limit":5}]}`, "limits[0].window"},
		{"CreateUser", "POST", "/v1/orgs/acme/teams/eng/users", admin, `{"id":"u9","limits":[],"limits":[{"metric":"requests","window":"month","limit":5}]}`, "limits"},
		{"PatchUser", "PATCH", "/v1/orgs/acme/teams/eng/users/alice", admin, `{"limits":[{"metric":"requests","metric":"tokens","window":"month","limit":5}]}`, "limits[0].metric"},
		{"AdjustUsage", "POST", "/v1/orgs/acme/usage/adjustments", op, `{"metric":"requests","add":1,"add":900,"reason":"x"}`, "add"},
		{"PutOrgRates", "PUT", "/v1/orgs/acme/rates", op, `{"rates":[{"metric":"tokens","price":"1","price":"100","per":1}]}`, "rates[0].price"},
		{"PutOrgThrottle", "PUT", "/v1/orgs/acme/throttle", admin, `{"factor":0.5,"reason":"x","reason":"y"}`, "reason"},
		{"PutOrgFeatures", "PUT", "/v1/orgs/acme/features", op, `{"features":{"seats":5,"seats":50}}`, "features.seats"},
		// Escapes are resolved before names are compared: "\u0063ost" is cost.
		{"Check", "POST", "/v1/check", key, `{"org":"acme","metric":"requests","cost":3,"\u0063ost":30}`, "cost"},
	}
	// Every operation with a body has a row.
	doc, err := api.GetSwagger()
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string]bool{}
	for _, tc := range cases {
		covered[tc.opID] = true
	}
	var missing []string
	for _, item := range doc.Paths.Map() {
		for _, o := range item.Operations() {
			if o.RequestBody != nil && !covered[o.OperationID] {
				missing = append(missing, o.OperationID)
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("operations with a body and no row here: %v", missing)
	}

	before, rows := f.acmeRequests(key), f.fingerprint()
	for _, tc := range cases {
		t.Run(tc.opID+" "+tc.field, func(t *testing.T) {
			rec := f.do(tc.method, tc.path, tc.token, tc.body)
			p := wantBadRequest(t, rec, tc.field, tc.field+": field named twice")
			if p.Errors[0].Message != "field named twice (send each field once)" {
				t.Errorf("errors[0].message = %q", p.Errors[0].Message)
			}
		})
	}
	if after := f.acmeRequests(key); after != before {
		t.Errorf("refused bodies were counted or held: %s, was %s", after, before)
	}
	if f.fingerprint() != rows {
		t.Errorf("a refused request changed the database")
	}
	rec = f.do("GET", res, key, "")
	var now api.Reservation
	if err := json.Unmarshal(rec.Body.Bytes(), &now); err != nil || now.State != "held" || !now.ExpiresAt.Equal(held.ExpiresAt) {
		t.Errorf("the reservation after refused commits and extends: %s, want it held as it was", rec.Body)
	}
}
