package httpapi_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// No refusal shows a regular expression: every pattern of the spec says in words what
// it admits (x-invalid-message), the Id schema in the words the services use
// (vocab.IDRule), and a bad price, currency, period, id or webhook URL is answered in
// them (a price was "must match ^[0-9]{1,16}(\.[0-9]{1,6})?$").
func TestNoPatternReachesAnError(t *testing.T) {
	doc, err := api.GetSwagger()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[*openapi3.Schema]bool{}
	var walk func(where string, ref *openapi3.SchemaRef)
	walk = func(where string, ref *openapi3.SchemaRef) {
		if ref == nil || ref.Value == nil || seen[ref.Value] {
			return
		}
		s := ref.Value
		seen[s] = true
		if s.Pattern != "" {
			msg, ok := s.Extensions["x-invalid-message"].(string)
			if !ok || !strings.HasPrefix(msg, "must be ") || strings.ContainsAny(msg, "^$[]{}\\") {
				t.Errorf("%s: pattern %s has no x-invalid-message in words (%q)", where, s.Pattern, msg)
			}
			if s.Pattern == vocab.IDPattern && msg != vocab.IDRule {
				t.Errorf("%s: an id's words %q, the services say %q", where, msg, vocab.IDRule)
			}
		}
		for name, p := range s.Properties {
			walk(where+"."+name, p)
		}
		walk(where+"[]", s.Items)
		if s.AdditionalProperties.Schema != nil {
			walk(where+"{}", s.AdditionalProperties.Schema)
		}
		for i, sub := range append(append(append(openapi3.SchemaRefs{}, s.AllOf...), s.AnyOf...), s.OneOf...) {
			walk(fmt.Sprintf("%s/%d", where, i), sub)
		}
	}
	for name, s := range doc.Components.Schemas {
		walk(name, s)
	}
	for name, p := range doc.Components.Parameters {
		walk("parameter "+name, p.Value.Schema)
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			for _, p := range append(item.Parameters, op.Parameters...) {
				walk(method+" "+path+" "+p.Value.Name, p.Value.Schema)
			}
		}
	}

	f := mustFixture(t)
	op, admin, key := f.tokens["operator"], f.tokens["acme-admin"], f.tokens["acme-check"]
	for _, tc := range []struct {
		method, path, token, body, field, words string
	}{
		{"PUT", "/v1/orgs/acme/rates", op, `{"rates":[{"metric":"tokens","price":"2,50","per":1}]}`, "rates[0].price",
			"must be a decimal amount such as 2.50: at most 16 digits before the point and 6 after"},
		{"POST", "/v1/plans", op, `{"id":"p9","name":"P","fail_mode":"open","limits":[],"pricing":{"currency":"usd","base_price":"1"}}`, "pricing.currency",
			"must be a three-letter ISO 4217 currency code in capitals, such as USD"},
		{"POST", "/v1/orgs/acme/teams", admin, `{"id":"bad team","name":"T"}`, "id", vocab.IDRule},
		{"PATCH", "/v1/orgs/acme", admin, `{"webhook_url":"ftp://x"}`, "webhook_url", "must be an http:// or https:// URL without white space, or empty"},
		{"GET", "/v1/orgs/acme/usage?period=2026-13", admin, "", "period", "must be a month as YYYY-MM, such as 2026-11"},
		{"POST", "/v1/check", key, `{"org":"-acme"}`, "org", vocab.IDRule},
		{"POST", "/v1/check", key, `{"org":"acme","cost":1,"idempotency_key":"short"}`, "idempotency_key", ""},
	} {
		rec := f.do(tc.method, tc.path, tc.token, tc.body)
		p := wantBadRequest(t, rec, tc.field, tc.field+": "+tc.words, "must match", "^[")
		if tc.words != "" && p.Errors[0].Message != tc.words {
			t.Errorf("%s %s: %s %q, want %q", tc.method, tc.path, tc.field, p.Errors[0].Message, tc.words)
		}
	}
}
