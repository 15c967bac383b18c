package httpapi_test

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// One Content-Type rule for admin routes and checks, through the real router: what
// `curl -d` sends (application/x-www-form-urlencoded) is read as JSON everywhere, and
// a media type that is not JSON is 415 everywhere, writing nothing.
func TestContentTypeOneRuleForEveryRoute(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "ct"))
	key, admin := r.setup("acme")
	send := func(method, path, token, ct, body string) *httptest.ResponseRecorder {
		t.Helper()
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		if ct != "-" {
			req.Header.Set("Content-Type", ct)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		r.f.h.ServeHTTP(rec, req)
		return rec
	}
	const form = "application/x-www-form-urlencoded"
	check := `{"org":"acme","team":"eng","user":"u1","cost":1}`

	accepted := []struct {
		name, method, path, token, ct, body string
		want                                int
	}{
		{"admin POST as curl -d sends it", "POST", "/v1/plans", operatorToken, form,
			`{"id":"curl","name":"Curl","fail_mode":"open","limits":[{"metric":"requests","window":"month","limit":10}]}`, 201},
		{"admin PATCH with a +json type", "PATCH", "/v1/plans/curl", operatorToken, "application/merge-patch+json", `{"name":"Curl 2"}`, 200},
		{"admin POST without a Content-Type", "POST", "/v1/orgs/acme/teams", admin, "-", `{"id":"ops","name":"Ops"}`, 201},
		{"admin POST with a charset", "POST", "/v1/orgs/acme/teams", admin, "Application/JSON; charset=utf-8", `{"id":"ml","name":"ML"}`, 201},
		{"check as curl -d sends it", "POST", "/v1/check", key, form, check, 200},
		{"check without a Content-Type", "POST", "/v1/check", key, "-", check, 200},
		{"batch as curl -d sends it", "POST", "/v1/check/batch", key, form, `{"checks":[` + check + `]}`, 200},
		{"a read with a stray Content-Type", "GET", "/v1/plans/curl", operatorToken, "text/plain", "", 200},
	}
	for _, tc := range accepted {
		if rec := send(tc.method, tc.path, tc.token, tc.ct, tc.body); rec.Code != tc.want {
			t.Errorf("%s: %d, want %d: %s", tc.name, rec.Code, tc.want, rec.Body)
		}
	}

	before := r.f.fingerprint()
	refused := []struct{ name, method, path, token, ct, body string }{
		{"admin POST as text/plain", "POST", "/v1/orgs/acme/teams", admin, "text/plain", `{"id":"qa","name":"QA"}`},
		{"admin POST as multipart", "POST", "/v1/plans", operatorToken, "multipart/form-data; boundary=xyz",
			`{"id":"mp","name":"MP","fail_mode":"open"}`},
		{"admin PATCH as XML", "PATCH", "/v1/plans/curl", operatorToken, "application/xml", `{"name":"x"}`},
		{"check as text/plain", "POST", "/v1/check", key, "text/plain", check},
		{"check as multipart", "POST", "/v1/check", key, "multipart/form-data; boundary=xyz", check},
		{"batch as text/plain", "POST", "/v1/check/batch", key, "text/plain", `{"checks":[` + check + `]}`},
		{"a malformed media type", "POST", "/v1/check", key, "json", check},
	}
	for _, tc := range refused {
		rec := send(tc.method, tc.path, tc.token, tc.ct, tc.body)
		var p struct {
			Status int    `json:"status"`
			Detail string `json:"detail"`
		}
		_ = json.Unmarshal(rec.Body.Bytes(), &p)
		want := "Content-Type must be application/json, not \"" + tc.ct + "\""
		if rec.Code != 415 || rec.Header().Get("Content-Type") != "application/problem+json" || p.Status != 415 || p.Detail != want {
			t.Errorf("%s: %d %s %s, want a 415 problem saying %s", tc.name, rec.Code, rec.Header().Get("Content-Type"), rec.Body, want)
		}
	}
	if after := r.f.fingerprint(); after != before {
		t.Error("a refused request wrote to the database")
	}
	// The refused checks counted nothing: the next check is the fourth of u1 (one
	// accepted check, one without a Content-Type, one in the batch).
	var out struct {
		Levels []struct {
			Level string `json:"level"`
			Used  int64  `json:"used"`
		} `json:"levels"`
	}
	rec := send("POST", "/v1/check", key, "application/json", check)
	_ = json.Unmarshal(rec.Body.Bytes(), &out)
	for _, l := range out.Levels {
		if l.Level == "user" && l.Used != 4 {
			t.Errorf("user used = %d after 4 accepted checks: %s", l.Used, rec.Body)
		}
	}
}
