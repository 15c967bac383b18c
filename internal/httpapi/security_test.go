package httpapi_test

// Security tests generated from api/openapi.yaml: every org-scoped operation is called
// with another org's all-powerful key and with a key that lacks its scope, and every
// request body is sent with each field the server owns. A new operation is covered
// without a line here; one these generators cannot handle (an unknown path parameter,
// a body they cannot fill, no x-required-scopes) fails the test instead of being
// skipped.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// allScopes are the scopes an org key may carry (the spec's Scope enum, checked below).
var allScopes = []tenants.Scope{tenants.ScopeCheck, tenants.ScopeAdmin, tenants.ScopeBilling}

// specOp is one operation of the embedded spec.
type specOp struct {
	id, method, path string
	op               *openapi3.Operation
}

func specOps(t *testing.T) []specOp {
	t.Helper()
	doc, err := api.GetSwagger()
	if err != nil {
		t.Fatal(err)
	}
	var enum []tenants.Scope
	for _, v := range doc.Components.Schemas["Scope"].Value.Enum {
		enum = append(enum, tenants.Scope(v.(string)))
	}
	if !slices.Equal(enum, allScopes) {
		t.Fatalf("the spec's scopes are %v; these tests know %v", enum, allScopes)
	}
	var ops []specOp
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			ops = append(ops, specOp{id: op.OperationID, method: method, path: path, op: op})
		}
	}
	sort.Slice(ops, func(i, j int) bool { return ops[i].path+ops[i].method < ops[j].path+ops[j].method })
	return ops
}

// requiredScopes reads the operation's x-required-scopes: an org key needs one of them.
func (o specOp) requiredScopes() ([]tenants.Scope, error) {
	raw, ok := o.op.Extensions["x-required-scopes"].([]any)
	if !ok || len(raw) == 0 {
		return nil, fmt.Errorf("%s declares no x-required-scopes", o.id)
	}
	var out []tenants.Scope
	for _, v := range raw {
		s, _ := v.(string)
		if !slices.Contains(allScopes, tenants.Scope(s)) {
			return nil, fmt.Errorf("%s: x-required-scopes names unknown scope %v", o.id, v)
		}
		// The prose of the contract must say the same.
		if !strings.Contains(o.op.Description, "`"+s+"`") {
			return nil, fmt.Errorf("%s: the description does not mention the `%s` scope of x-required-scopes", o.id, s)
		}
		out = append(out, tenants.Scope(s))
	}
	return out, nil
}

var pathParam = regexp.MustCompile(`\{([^}]+)\}`)

// url fills the operation's path: org with org, every other parameter with the
// fixture's object of org "acme" that it names.
func (o specOp) url(f *fixture, org string) (string, error) {
	objects := map[string]string{"plan": "pro", "team": "eng", "user": "alice", "key": f.oldKey, "id": f.consoID}
	if strings.Contains(o.path, "{grant}") {
		objects["grant"] = f.grant()
	}
	if strings.HasPrefix(o.path, "/v1/capacities/") {
		objects["id"] = f.capacity()
	}
	var bad error
	u := pathParam.ReplaceAllStringFunc(o.path, func(m string) string {
		name := m[1 : len(m)-1]
		if name == "org" {
			return org
		}
		v, ok := objects[name]
		if !ok {
			bad = fmt.Errorf("%s: no fixture object for path parameter {%s}", o.id, name)
		}
		return v
	})
	for _, p := range o.op.Parameters {
		if p.Value.In == "query" && p.Value.Required {
			bad = fmt.Errorf("%s: required query parameter %q: teach these tests a value", o.id, p.Value.Name)
		}
	}
	return u, bad
}

// hasObjectParam tells whether the path names an object inside the org.
func (o specOp) hasObjectParam() bool { return len(pathParam.FindAllString(o.path, -1)) > 1 }

func (o specOp) requestSchema() (*openapi3.Schema, error) {
	if o.op.RequestBody == nil {
		return nil, nil
	}
	mt := o.op.RequestBody.Value.Content.Get("application/json")
	if mt == nil || mt.Schema == nil {
		return nil, fmt.Errorf("%s: request body is not application/json", o.id)
	}
	return mt.Schema.Value, nil
}

// responseSchema is the JSON schema of the operation's success answer, nil if none.
func (o specOp) responseSchema() *openapi3.Schema {
	for _, code := range []string{"200", "201"} {
		if r := o.op.Responses.Value(code); r != nil && r.Value != nil {
			if mt := r.Value.Content.Get("application/json"); mt != nil && mt.Schema != nil {
				return mt.Schema.Value
			}
		}
	}
	return nil
}

// body is a minimal valid request body of the operation, as JSON, or "" when it
// takes none.
func (o specOp) body() (map[string]any, error) {
	s, err := o.requestSchema()
	if s == nil || err != nil {
		return nil, err
	}
	v, err := sample(s, "")
	if err != nil {
		return nil, fmt.Errorf("%s: cannot build a request body: %w", o.id, err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: request body is not an object", o.id)
	}
	if strings.EqualFold(o.id, "adjustUsage") {
		m["set"] = 0 // exactly one of set and add, which the schema does not say
	}
	if err := s.VisitJSON(roundTrip(m)); err != nil {
		return nil, fmt.Errorf("%s: the generated body %s is not valid: %w", o.id, mustJSON(m), err)
	}
	return m, nil
}

// fixtureValues name the fixture's objects where a body refers to one.
var fixtureValues = map[string]string{"org": "acme", "team": "eng", "user": "alice", "plan": "pro", "metric": "requests"}

const idPattern = `^[a-zA-Z0-9][a-zA-Z0-9._:@-]{0,127}$`

// sample returns a minimal value valid against s: required properties only, the first
// enum value, the minimum. name is the property s describes, for fixture references.
func sample(s *openapi3.Schema, name string) (any, error) {
	if len(s.AllOf) == 1 && s.Type.IsEmpty() {
		return sample(s.AllOf[0].Value, name)
	}
	if len(s.OneOf) > 0 {
		return sample(s.OneOf[0].Value, name)
	}
	if len(s.Enum) > 0 {
		return s.Enum[0], nil
	}
	switch {
	case s.Type.Is("string"):
		switch {
		case fixtureValues[name] != "":
			return fixtureValues[name], nil
		case s.Format == "date-time":
			return "2001-02-03T04:05:06Z", nil
		case s.Format == "email":
			return "sec@acme.test", nil
		case s.Pattern == idPattern:
			return "sec-test", nil
		case s.Pattern != "":
			if ex, ok := s.Example.(string); ok {
				return ex, nil
			}
			return nil, fmt.Errorf("string %q with pattern %s and no example", name, s.Pattern)
		}
		return strings.Repeat("x", max(int(s.MinLength), 1)), nil
	case s.Type.Is("integer"), s.Type.Is("number"):
		if s.Min != nil {
			return int64(*s.Min), nil
		}
		return 1, nil
	case s.Type.Is("boolean"):
		return false, nil
	case s.Type.Is("array"):
		out := []any{}
		for range s.MinItems {
			v, err := sample(s.Items.Value, name)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case s.Type.Is("object"):
		out := map[string]any{}
		required := s.Required
		if alt, ok := s.Extensions["x-required-one-of"].([]any); ok && len(alt) > 0 { // one of them: the first
			required = append(slices.Clone(required), fmt.Sprint(alt[0]))
		}
		for _, p := range required {
			ps, ok := s.Properties[p]
			if !ok {
				return nil, fmt.Errorf("required property %q has no schema", p)
			}
			v, err := sample(ps.Value, p)
			if err != nil {
				return nil, err
			}
			out[p] = v
		}
		return out, nil
	}
	return nil, fmt.Errorf("%q: cannot sample a schema of type %v", name, s.Type)
}

func roundTrip(v any) any {
	var out any
	_ = json.Unmarshal(mustJSON(v), &out)
	return out
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// refused asserts a problem+json answer with status want that wrote nothing.
func (f *fixture) refused(t *testing.T, rec *httptest.ResponseRecorder, want int, before, what string) {
	t.Helper()
	var p api.Problem
	if rec.Code != want || rec.Header().Get("Content-Type") != "application/problem+json" ||
		json.Unmarshal(rec.Body.Bytes(), &p) != nil || p.Status != want {
		t.Errorf("%s: %d %s %s, want a %d problem", what, rec.Code, rec.Header().Get("Content-Type"), rec.Body, want)
	}
	if f.fingerprint() != before {
		t.Errorf("%s: the refused request changed the database", what)
	}
}

func succeeded(code int) bool {
	return code == http.StatusOK || code == http.StatusCreated || code == http.StatusNoContent
}

// needsObject sets up, by operation id, an object of org "acme" that the fixture
// does not hold and the operation needs to succeed.
var needsObject = map[string]func(t *testing.T, f *fixture){
	"DeleteOrgThrottle": throttleAcme,
	"SendWebhookTest":   webhookAcme,
}

// webhookAcme gives acme a webhook URL to test: a loopback one, which the fixture's
// public-only client refuses at once (a 200 with the refusal) without any traffic.
func webhookAcme(t *testing.T, f *fixture) {
	t.Helper()
	u := "http://127.0.0.1:9/hook"
	if _, err := f.svc.UpdateOrg(context.Background(), tenants.Actor{Name: "seed"}, "acme", tenants.OrgPatch{WebhookURL: &u}); err != nil {
		t.Fatal(err)
	}
}

func throttleAcme(t *testing.T, f *fixture) {
	t.Helper()
	ttl := int64(600)
	if _, err := f.svc.SetThrottle(context.Background(), tenants.Actor{Name: "seed"}, tenants.ThrottleOrg, "acme",
		tenants.ThrottleInput{Factor: 0.5, TTLSeconds: &ttl, Reason: "security test"}); err != nil {
		t.Fatal(err)
	}
}

// Every org-scoped operation: another org's key with every scope gets 404 for org
// "acme"'s objects, and so does asking for acme's objects through its own org; an
// acme key without the operation's scope gets 403; nothing is written. A key with just
// one of the scopes succeeds, so the refusals are the ones under test.
func TestSecurityOrgScopedOperations(t *testing.T) {
	covered := 0
	for _, o := range specOps(t) {
		if !strings.Contains(o.path, "{org}") {
			continue
		}
		covered++
		t.Run(o.id, func(t *testing.T) {
			t.Parallel()
			if o.operatorOnly() {
				testOperatorOnly(t, o)
				return
			}
			scopes, err := o.requiredScopes()
			if err != nil {
				t.Fatal(err)
			}
			var lacking []tenants.Scope
			for _, s := range allScopes {
				if !slices.Contains(scopes, s) {
					lacking = append(lacking, s)
				}
			}
			if len(lacking) == 0 {
				t.Fatalf("%s admits every scope: no key lacks it, so the 403 case cannot be tested", o.id)
			}
			body, err := o.body()
			if err != nil {
				t.Fatal(err)
			}
			var raw string
			if body != nil {
				raw = string(mustJSON(body))
			}
			f := mustFixture(t)
			acme, err := o.url(f, "acme")
			if err != nil {
				t.Fatal(err)
			}
			intruder := f.mintKey("other", allScopes...)
			without := f.mintKey("acme", lacking...)
			if needs := needsObject[o.id]; needs != nil {
				needs(t, f)
			}

			before := f.fingerprint()
			f.refused(t, f.do(o.method, acme, intruder, raw), http.StatusNotFound, before, "another org's key")
			if o.hasObjectParam() {
				through, _ := o.url(f, "other")
				f.refused(t, f.do(o.method, through, intruder, raw), http.StatusNotFound, before, "acme's object through another org")
			}
			f.refused(t, f.do(o.method, acme, without, raw), http.StatusForbidden, before, fmt.Sprintf("a key with %v", lacking))

			for i, s := range scopes {
				if i > 0 && o.method != http.MethodGet {
					f = mustFixture(t) // the first success changed what the next would find
				}
				rec := f.do(o.method, acme, f.mintKey("acme", s), raw)
				if !succeeded(rec.Code) {
					t.Errorf("a key with just %q: %d %s, want success", s, rec.Code, rec.Body)
				}
			}
		})
	}
	if covered < 20 {
		t.Fatalf("only %d org-scoped operations found in the spec", covered)
	}
	t.Logf("%d org-scoped operations covered", covered)
}

// operatorOnly reads the operation's x-operator-only: no org key may call it.
func (o specOp) operatorOnly() bool {
	b, _ := o.op.Extensions["x-operator-only"].(bool)
	return b
}

// testOperatorOnly: another org's key with every scope gets 404, as on every org
// route; acme's own key with every scope gets 403; the operator succeeds. Nothing
// refused writes anything.
func testOperatorOnly(t *testing.T, o specOp) {
	if _, ok := o.op.Extensions["x-required-scopes"]; ok {
		t.Fatalf("%s is operator-only and names x-required-scopes", o.id)
	}
	if !strings.Contains(o.op.Description, "operator token") {
		t.Fatalf("%s: the description does not say it needs the operator token", o.id)
	}
	body, err := o.body()
	if err != nil {
		t.Fatal(err)
	}
	var raw string
	if body != nil {
		raw = string(mustJSON(body))
	}
	f := mustFixture(t)
	acme, err := o.url(f, "acme")
	if err != nil {
		t.Fatal(err)
	}
	intruder, own := f.mintKey("other", allScopes...), f.mintKey("acme", allScopes...)
	before := f.fingerprint()
	f.refused(t, f.do(o.method, acme, intruder, raw), http.StatusNotFound, before, "another org's key")
	f.refused(t, f.do(o.method, acme, own, raw), http.StatusForbidden, before, "acme's key with every scope")
	if rec := f.do(o.method, acme, operatorToken, raw); !succeeded(rec.Code) {
		t.Errorf("the operator: %d %s, want success", rec.Code, rec.Body)
	}
}

// serverOwned lists the fields a client may never set in o's body: what the answer
// has and the request does not, and the server's bookkeeping wherever the request
// lacks it. Values are of the answer's types, so only their presence is wrong.
func serverOwned(o specOp, req *openapi3.Schema) map[string]any {
	out := map[string]any{}
	for _, name := range []string{"id", "org", "created_at", "updated_at", "last_used_at", "revoked_at",
		"secret", "prefix", "digest", "usage", "used", "effective_limits"} {
		out[name] = "2001-02-03T04:05:06Z"
	}
	out["org"], out["id"], out["secret"] = "other", "sec-evil", "qpk_0123456789abcdef_"+strings.Repeat("A", 43)
	if res := o.responseSchema(); res != nil {
		for name, ps := range res.Properties {
			if v, err := sample(ps.Value, name); err == nil {
				out[name] = v
			} else {
				out[name] = "x"
			}
		}
	}
	for name := range req.Properties {
		delete(out, name)
	}
	return out
}

// No request body can set a field the server owns: each is refused with 400 and
// nothing is written, by the operator and by an org key with every scope.
func TestSecurityServerOwnedFields(t *testing.T) {
	ops := specOps(t)
	// Nested request objects (a batch's checks) get the fields of the operation whose
	// whole body they are.
	owned := map[*openapi3.Schema]map[string]any{}
	for _, o := range ops {
		if s, _ := o.requestSchema(); s != nil {
			owned[s] = serverOwned(o, s)
		}
	}
	covered, fields := 0, 0
	for _, o := range ops {
		req, err := o.requestSchema()
		if err != nil {
			t.Fatal(err)
		}
		if req == nil {
			continue
		}
		covered++
		fields += len(owned[req])
		t.Run(o.id, func(t *testing.T) {
			t.Parallel()
			base, err := o.body()
			if err != nil {
				t.Fatal(err)
			}
			f := mustFixture(t)
			u, err := o.url(f, "acme")
			if err != nil {
				t.Fatal(err)
			}
			callers := map[string]string{"operator": operatorToken}
			if strings.Contains(o.path, "{org}") || o.id == "check" || o.id == "checkBatch" {
				callers["org key"] = f.mintKey("acme", allScopes...)
			}
			type injection struct {
				field string
				body  map[string]any
			}
			var cases []injection
			for name, v := range owned[req] {
				b := clone(base)
				b[name] = v
				cases = append(cases, injection{name, b})
			}
			// Into the first element of an array of objects that are a body elsewhere.
			for pname, ps := range req.Properties {
				items := ps.Value.Items
				if !ps.Value.Type.Is("array") || items == nil || owned[items.Value] == nil {
					continue
				}
				elems, _ := base[pname].([]any)
				if len(elems) == 0 {
					t.Fatalf("%s.%s: the base body has no element to add fields to", o.id, pname)
				}
				for name, v := range owned[items.Value] {
					b := clone(base)
					elem := clone(elems[0].(map[string]any))
					elem[name] = v
					b[pname] = append([]any{elem}, elems[1:]...)
					cases = append(cases, injection{pname + "[0]." + name, b})
				}
			}
			if len(cases) == 0 {
				t.Fatalf("%s: found no server-owned field to try", o.id)
			}
			sort.Slice(cases, func(i, j int) bool { return cases[i].field < cases[j].field })
			names := make([]string, len(cases))
			for i, c := range cases {
				names[i] = c.field
			}
			t.Logf("server-owned: %s", strings.Join(names, " "))
			for who, tok := range callers {
				for _, c := range cases {
					before := f.fingerprint()
					rec := f.do(o.method, u, tok, string(mustJSON(c.body)))
					what := fmt.Sprintf("%s sets %s", who, c.field)
					if who == "org key" && rec.Code == http.StatusForbidden && strings.Contains(rec.Body.String(), "needs the operator token") {
						// An operator-only route: access is decided before the body
						// is read, so the key learns nothing of it.
						f.refused(t, rec, http.StatusForbidden, before, what)
						continue
					}
					f.refused(t, rec, http.StatusBadRequest, before, what)
					field := c.field[strings.LastIndex(c.field, ".")+1:]
					if !strings.Contains(rec.Body.String(), field) {
						t.Errorf("%s: the problem does not name the field: %s", what, rec.Body)
					}
				}
			}
			// The same body without them is accepted, so the 400s were theirs. Without a
			// quota engine a check that passes decoding answers 503; a reservation or a
			// lease named by id is an org key's alone, so the operator's, decoded, is
			// refused with 403.
			rec := f.do(o.method, u, operatorToken, string(mustJSON(base)))
			if !succeeded(rec.Code) && !(rec.Code == http.StatusServiceUnavailable && strings.Contains(rec.Body.String(), "no quota engine")) &&
				!(rec.Code == http.StatusForbidden && (strings.HasPrefix(o.path, "/v1/reservations/") || strings.HasPrefix(o.path, "/v1/leases/")) &&
					strings.Contains(rec.Body.String(), "org API key (scope check)")) {
				t.Errorf("the base body %s: %d %s, want success", mustJSON(base), rec.Code, rec.Body)
			}
		})
	}
	if covered < 10 {
		t.Fatalf("only %d operations with a request body found in the spec", covered)
	}
	t.Logf("%d operations with a request body, %d server-owned fields tried", covered, fields)
}

func clone(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
