package httpapi_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
)

// The check and reservation routes refuse, as the admin routes do, a field whose name
// is not exactly one of the request's (encoding/json matched names in any case:
// {"ORG":"acme"} was checked as acme's, {"cost":1,"Cost":500} counted 500), say of an
// integer field that does not hold one which field and from what to what (1e400 was
// "request body must be a JSON object, not a number"), and word a leading zero or a
// byte order mark in the API's terms, not encoding/json's ("invalid character 'ï'
// looking for beginning of value"). Nothing is counted, nothing held or settled.
func TestCheckAndReservationBodiesAreStrict(t *testing.T) {
	f := mustFixture(t)
	key, admin := f.tokens["acme-check"], f.tokens["acme-admin"]
	rec := f.do("POST", "/v1/reservations", key, `{"org":"acme","metric":"requests","amount":2,"ttl_seconds":600}`)
	var held api.Reservation
	if err := json.Unmarshal(rec.Body.Bytes(), &held); rec.Code != 201 || err != nil {
		t.Fatalf("reserve = %d %s", rec.Code, rec.Body)
	}
	res := "/v1/reservations/" + held.Id
	const units = "must be an integer from 0 to 1125899906842624"
	const bom = "\xef\xbb\xbf"
	cases := []struct {
		name, path, token, body string
		field, detail           string // errors[0].field, and a part of the detail
	}{
		// D5: a field name in another case is an unknown field.
		{"check: ORG", "/v1/check", key, `{"ORG":"acme","metric":"requests","cost":1}`, "ORG", `unknown field "ORG"`},
		{"check: Cost", "/v1/check", key, `{"org":"acme","metric":"requests","Cost":7}`, "Cost", `unknown field "Cost"`},
		{"check: cost and Cost", "/v1/check", key, `{"org":"acme","metric":"requests","cost":1,"Cost":500}`, "Cost", `unknown field "Cost"`},
		{"check: IDEMPOTENCY_KEY", "/v1/check", key, `{"org":"acme","metric":"requests","cost":1,"IDEMPOTENCY_KEY":"order-12345"}`, "IDEMPOTENCY_KEY", `unknown field "IDEMPOTENCY_KEY"`},
		{"check: Costs", "/v1/check", key, `{"org":"acme","Costs":{"requests":1}}`, "Costs", `unknown field "Costs"`},
		{"check: an escaped ORG", "/v1/check", key, `{"\u004fRG":"acme","cost":1}`, "ORG", `unknown field "ORG"`},
		{"batch: Checks", "/v1/check/batch", key, `{"Checks":[{"org":"acme","cost":1}]}`, "Checks", `unknown field "Checks"`},
		{"batch: a check's Cost", "/v1/check/batch", key, `{"checks":[{"org":"acme","metric":"requests","cost":1},{"org":"acme","metric":"requests","cost":1,"Cost":500}]}`,
			"checks[1].Cost", `unknown field "checks[1].Cost"`},
		{"reserve: ORG", "/v1/reservations", key, `{"ORG":"acme","metric":"requests","amount":1}`, "ORG", `unknown field "ORG"`},
		{"reserve: Amount", "/v1/reservations", key, `{"org":"acme","metric":"requests","amount":1,"Amount":50}`, "Amount", `unknown field "Amount"`},
		{"reserve: TTL_SECONDS", "/v1/reservations", key, `{"org":"acme","metric":"requests","amount":1,"TTL_SECONDS":30}`, "TTL_SECONDS", `unknown field "TTL_SECONDS"`},
		{"commit: Used", res + "/commit", key, `{"Used":1}`, "Used", `unknown field "Used"`},
		{"commit: used and USED", res + "/commit", key, `{"used":1,"USED":2}`, "USED", `unknown field "USED"`},
		{"extend: TTL_SECONDS", res + "/extend", key, `{"TTL_SECONDS":30}`, "TTL_SECONDS", `unknown field "TTL_SECONDS"`},

		// D6: a number no integer field can hold names the field and its bounds.
		{"check: cost 1e400", "/v1/check", key, `{"org":"acme","metric":"requests","cost":1e400}`, "cost", "cost: " + units},
		{"check: cost 2^63", "/v1/check", key, `{"org":"acme","metric":"requests","cost":9223372036854775808}`, "cost", "cost: " + units},
		{"check: costs 1e400", "/v1/check", key, `{"org":"acme","costs":{"requests":1e400}}`, "costs.requests", "costs.requests: " + units},
		{"batch: cost 1e400", "/v1/check/batch", key, `{"checks":[{"org":"acme","metric":"requests","cost":1},{"org":"acme","cost":1e400}]}`,
			"checks[1].cost", "checks[1].cost: " + units},
		{"reserve: amount 1e400", "/v1/reservations", key, `{"org":"acme","metric":"requests","amount":1e400}`, "amount", "amount: must be an integer from 1 to 1125899906842624"},
		{"reserve: amounts 1e400", "/v1/reservations", key, `{"org":"acme","amounts":{"requests":1e400}}`, "amounts.requests", "amounts.requests: " + units},
		{"reserve: ttl 1e400", "/v1/reservations", key, `{"org":"acme","metric":"requests","amount":1,"ttl_seconds":1e400}`, "ttl_seconds", "ttl_seconds: must be an integer from 1 to 3600"},
		{"commit: used 1e400", res + "/commit", key, `{"used":1e400}`, "used", "used: " + units},
		{"commit: used of a metric 1e400", res + "/commit", key, `{"used":{"requests":1e400}}`, "used.requests", "used.requests: " + units},
		{"commit: used a string", res + "/commit", key, `{"used":"1"}`, "used", "used: " + units + ", or an object"},
		{"extend: ttl 1e400", res + "/extend", key, `{"ttl_seconds":1e400}`, "ttl_seconds", "ttl_seconds: must be an integer from 1 to 3600"},

		// D6: a leading zero, a byte order mark, in the API's words with the position.
		{"check: cost 01", "/v1/check", key, `{"org":"acme","metric":"requests","cost":01}`, "body", "the number 01 starts with a zero, at line 1, column 42"},
		{"batch: cost -01", "/v1/check/batch", key, `{"checks":[{"org":"acme","cost":-01}]}`, "body", "the number -01 starts with a zero, at line 1, column 33"},
		{"reserve: amount 01", "/v1/reservations", key, `{"org":"acme","metric":"requests","amount":01}`, "body", "the number 01 starts with a zero, at line 1, column 44"},
		{"commit: used 01", res + "/commit", key, `{"used":01}`, "body", "the number 01 starts with a zero, at line 1, column 9"},
		{"extend: ttl 01", res + "/extend", key, `{"ttl_seconds":01}`, "body", "the number 01 starts with a zero"},
		{"admin: limit 01", "/v1/orgs/acme/teams", admin, `{"id":"t9","name":"T","limits":[{"metric":"requests","window":"month","limit":01}]}`, "body", "the number 01 starts with a zero"},
		{"check: BOM", "/v1/check", key, bom + `{"org":"acme","metric":"requests","cost":1}`, "body", "request body starts with a byte order mark"},
		{"batch: BOM", "/v1/check/batch", key, bom + `{"checks":[{"org":"acme","cost":1}]}`, "body", "request body starts with a byte order mark"},
		{"reserve: BOM", "/v1/reservations", key, bom + `{"org":"acme","metric":"requests","amount":1}`, "body", "request body starts with a byte order mark"},
		{"commit: BOM", res + "/commit", key, bom + `{"used":1}`, "body", "request body starts with a byte order mark"},
		{"extend: BOM", res + "/extend", key, bom + `{"ttl_seconds":30}`, "body", "request body starts with a byte order mark"},
		{"admin: BOM", "/v1/orgs/acme/teams", admin, bom + `{"id":"t9","name":"T"}`, "body", "request body starts with a byte order mark"},
	}
	before, rows := f.acmeRequests(key), f.fingerprint()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := f.do("POST", tc.path, tc.token, tc.body)
			p := wantBadRequest(t, rec, tc.field, tc.detail, "ReservationRequest", "CommitRequest",
				"invalid character", "ï", "key:value", "a JSON object, not")
			if strings.Contains(tc.detail, "unknown field") && p.Errors[0].Message != "is not a field of this request" {
				t.Errorf("errors[0].message = %q, want the admin routes' %q", p.Errors[0].Message, "is not a field of this request")
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
		t.Errorf("the reservation after refused commits and extends: %s, want it held as it was (expires %s)", rec.Body, held.ExpiresAt)
	}
	// The exact names still work, in both paths (fast: plain; decodeStrict: escaped).
	for _, body := range []string{`{"org":"acme","metric":"requests","cost":1}`, `{"\u006frg":"acme","metric":"requests","cost":1}`} {
		if rec := f.do("POST", "/v1/check", key, body); rec.Code != 200 {
			t.Errorf("check %s = %d %s", body, rec.Code, rec.Body)
		}
	}
}
