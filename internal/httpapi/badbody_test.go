package httpapi_test

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
)

// Every malformed body, on the check routes and the admin API alike, is a 400 in the
// API's terms: the field at fault in errors[] and what it must be, or where the JSON
// breaks; never encoding/json's Go words ("cannot unmarshal string into Go struct
// field CheckRequest.cost of type int64", "EOF"). Nothing is written.
func TestMalformedBodiesSpeakTheAPIsTerms(t *testing.T) {
	f := mustFixture(t)
	cases := []struct {
		name, path, token, body string
		field, detail           string // the field of errors[0], and a part of the detail
	}{
		{"check: cost of the wrong type", "/v1/check", "acme-check", `{"org":"acme","cost":"1"}`, "cost", "cost: must be an integer"},
		{"check: org of the wrong type", "/v1/check", "acme-check", `{"org":7}`, "org", "org: must be a string"},
		{"check: fractional cost", "/v1/check", "acme-check", `{"org":"acme","cost":1.5}`, "cost", "must be an integer"},
		{"check: empty body", "/v1/check", "acme-check", ``, "body", "request body is empty"},
		{"check: white space only", "/v1/check", "acme-check", " \n", "body", "request body is empty"},
		{"check: not an object", "/v1/check", "acme-check", `["acme"]`, "body", "must be a JSON object, not an array"},
		{"check: a string", "/v1/check", "acme-check", `"acme"`, "body", "must be a JSON object, not a string"},
		{"check: syntax error", "/v1/check", "acme-check", "{\"org\":\"acme\",\n\"cost\": x}", "body", "at line 2, column 9"},
		{"check: cut short", "/v1/check", "acme-check", `{"org":"acme"`, "body", "before the JSON is complete"},
		{"check: unknown field", "/v1/check", "acme-check", `{"org":"acme","tenant":"x"}`, "tenant", `unknown field "tenant"`},
		{"check: trailing data", "/v1/check", "acme-check", `{"org":"acme"} {"org":"acme"}`, "body", "has more after the JSON object, at line 1, column 16"},
		{"check: stray bracket", "/v1/check", "acme-check", `{"org":"acme"}]`, "body", "has more after the JSON object"},
		{"batch: cost of the wrong type", "/v1/check/batch", "acme-check",
			`{"checks":[{"org":"acme"},{"org":"acme"},{"org":"acme"},{"org":"acme","cost":"2"}]}`, "checks[3].cost", "checks[3].cost: must be an integer"},
		{"batch: unknown field in a check", "/v1/check/batch", "acme-check",
			`{"checks":[{"org":"acme"},{"org":"acme","extra":1}]}`, "checks[1].extra", `unknown field "checks[1].extra"`},
		{"batch: checks not an array", "/v1/check/batch", "acme-check", `{"checks":"acme"}`, "checks", "checks: must be an array"},
		{"batch: empty body", "/v1/check/batch", "acme-check", ``, "body", "request body is empty"},
		{"batch: syntax error", "/v1/check/batch", "acme-check", `{"checks":[{"org":"acme"},]}`, "body", "at line 1, column 27"},
		{"admin: syntax error", "/v1/orgs/acme/teams", "acme-admin", `{"id":"t1",}`, "body", "request body is not valid JSON"},
		{"admin: not an object", "/v1/orgs/acme/teams", "acme-admin", `[1]`, "body", ""},
		{"admin: unknown field", "/v1/orgs/acme/teams", "acme-admin", `{"id":"t1","name":"T","owner":"me"}`, "owner", "owner"},
		{"admin: wrong type", "/v1/orgs/acme/teams", "acme-admin", `{"id":"t1","name":7}`, "name", "name: must be a string"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := f.fingerprint()
			rec := f.do("POST", tc.path, f.tokens[tc.token], tc.body)
			wantBadRequest(t, rec, tc.field, tc.detail)
			if f.fingerprint() != before {
				t.Errorf("a refused request changed the database")
			}
		})
	}
}

// wantBadRequest checks that rec is a 400 problem document whose first error names
// field and whose detail says detail, in none of Go's words (nor of also), and
// returns it.
func wantBadRequest(t *testing.T, rec *httptest.ResponseRecorder, field, detail string, also ...string) api.Problem {
	t.Helper()
	if rec.Code != 400 || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("%d %s, want a 400 problem", rec.Code, rec.Body)
	}
	var p api.Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Detail == nil {
		t.Fatalf("not a problem document: %s (%v)", rec.Body, err)
	}
	if len(p.Errors) == 0 || p.Errors[0].Field != field {
		t.Fatalf("errors = %+v, want the first to name %q", p.Errors, field)
	}
	if !strings.Contains(*p.Detail, detail) {
		t.Errorf("detail = %q, want it to say %q", *p.Detail, detail)
	}
	for _, w := range append([]string{"json:", "Go struct", "Go value", "int64", "api.", "CheckRequest", "EOF", "unmarshal"}, also...) {
		if strings.Contains(rec.Body.String(), w) {
			t.Errorf("the answer speaks Go (%q): %s", w, rec.Body)
		}
	}
	return p
}
