package httpapi_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// A required field left out of a check, of a batch's check or of a reservation says
// "is required", as the admin API's validator says it, never the pattern an absent
// value cannot match ("org: must match ^[a-zA-Z0-9]..."). Nothing is written.
func TestMissingRequiredFieldsSayIsRequired(t *testing.T) {
	f := mustFixture(t)
	cases := []struct {
		name, path, body string
		field, message   string
	}{
		{"check without org", "/v1/check", `{"team":"eng","user":"alice"}`, "org", "is required"},
		{"check with org empty", "/v1/check", `{"org":""}`, "org", "is required"},
		{"reservation without org", "/v1/reservations", `{"team":"eng","amount":5}`, "org", "is required"},
		{"reservation without amount", "/v1/reservations", `{"org":"acme","metric":"requests"}`, "amount", "is required (1 to 1125899906842624), or amounts of several metrics"},
		// What was given but wrong still says what it must be.
		{"check with a bad org", "/v1/check", `{"org":"-x"}`, "org", vocab.IDRule},
		{"reservation with amount 0", "/v1/reservations", `{"org":"acme","amount":0}`, "amount", "must be 1 to 1125899906842624"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := f.fingerprint()
			rec := f.do("POST", tc.path, f.tokens["acme-check"], tc.body)
			if rec.Code != 400 {
				t.Fatalf("POST %s %s = %d, want 400: %s", tc.path, tc.body, rec.Code, rec.Body)
			}
			var p api.Problem
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Detail == nil {
				t.Fatalf("not a problem document: %s (%v)", rec.Body, err)
			}
			if len(p.Errors) != 1 || p.Errors[0].Field != tc.field || p.Errors[0].Message != tc.message {
				t.Errorf("errors = %+v, want one: %s %q", p.Errors, tc.field, tc.message)
			}
			if !strings.Contains(*p.Detail, tc.field+": "+tc.message) {
				t.Errorf("detail = %q, want it to say %q", *p.Detail, tc.field+": "+tc.message)
			}
			if after := f.fingerprint(); after != before {
				t.Error("a refused request wrote something")
			}
		})
	}

	// A batch answers each check on its own: the one without org is refused as such.
	rec := f.do("POST", "/v1/check/batch", f.tokens["acme-check"], `{"checks":[{"org":"acme","cost":0},{"user":"alice"}]}`)
	if rec.Code != 200 {
		t.Fatalf("batch = %d: %s", rec.Code, rec.Body)
	}
	var out struct {
		Results []struct {
			Status int              `json:"status"`
			Errors []api.FieldError `json:"errors"`
		} `json:"results"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || len(out.Results) != 2 {
		t.Fatalf("batch answer %s (%v)", rec.Body, err)
	}
	if r := out.Results[1]; r.Status != 400 || len(r.Errors) != 1 || r.Errors[0] != (api.FieldError{Field: "org", Message: "is required"}) {
		t.Errorf("the batch's check without org = %+v, want 400 with org: is required", r)
	}
}
