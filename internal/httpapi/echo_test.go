package httpapi_test

import (
	"strings"
	"testing"
)

// No error repeats more than 64 characters of a value the client sent: a 1 MB id,
// metric, field name, feature name or path is answered in a short problem, its value
// cut to 64 characters and "...". (A metric of 1 MB was quoted whole, as were an
// unknown field's name and the path of a route that does not exist.)
func TestErrorsEchoAtMost64CharactersOfAValue(t *testing.T) {
	f := mustFixture(t)
	key, admin, op := f.tokens["acme-check"], f.tokens["acme-admin"], f.tokens["operator"]
	v := strings.Repeat("v", 1_000_000)
	for _, tc := range []struct{ name, method, path, token, body string }{
		{"check: org", "POST", "/v1/check", key, `{"org":"` + v + `","cost":1}`},
		{"check: metric of costs", "POST", "/v1/check", key, `{"org":"acme","costs":{"` + v + `":1}}`},
		{"check: unknown field", "POST", "/v1/check", key, `{"org":"acme","` + v + `":1}`},
		{"check: field named twice", "POST", "/v1/check", key, `{"org":"acme","costs":{"` + v + `":1,"` + v[1:] + `v":2}}`},
		{"batch: metric", "POST", "/v1/check/batch", key, `{"checks":[{"org":"acme","metric":"` + v + `","cost":1}]}`},
		{"reservation by id", "GET", "/v1/reservations/r_" + v, key, ""},
		{"commit: metric", "POST", "/v1/reservations/r_" + v + "/commit", key, `{"used":{"` + v + `":1}}`},
		{"no such route", "GET", "/v1/" + v, key, ""},
		{"admin: unknown field", "POST", "/v1/orgs/acme/teams", admin, `{"id":"t1","name":"T","` + v + `":1}`},
		{"admin: team id", "POST", "/v1/orgs/acme/teams", admin, `{"id":"` + v + `","name":"T"}`},
		{"admin: team of the path", "GET", "/v1/orgs/acme/teams/" + v, admin, ""},
		{"admin: feature name", "PUT", "/v1/orgs/acme/features", op, `{"features":{"` + v + `":true}}`},
		{"admin: rate's metric", "PUT", "/v1/orgs/acme/rates", op, `{"rates":[{"metric":"` + v + `","price":"1","per":1}]}`},
	} {
		rec := f.do(tc.method, tc.path, tc.token, tc.body)
		body := rec.Body.String()
		if !strings.Contains(body, `"status":4`) || len(body) > 2048 || strings.Contains(body, strings.Repeat("v", 65)) {
			t.Errorf("%s: %d, %d bytes: %.300s", tc.name, rec.Code, len(body), body)
		}
	}
}
