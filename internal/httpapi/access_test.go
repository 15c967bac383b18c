package httpapi

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Every operation of the spec has exactly one row in the route table, every row is
// an operation of the spec, and the access a row declares is the one the spec states:
// security: [] is public; x-operator-only on an org route is orgOperator (with the
// org's admin and billing scopes, which decide 404 or 403 before the operator
// check); x-required-scopes [check] is the check service's own; other
// x-required-scopes are orgKey with the same scopes; an operation with neither is the
// operator's. A route without an access fails here and makes NewHandler fail.
func TestRouteTable(t *testing.T) {
	doc, err := api.GetSwagger()
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]access{}
	for _, rt := range table() {
		key := rt.method + " " + rt.pattern
		rows[key] = append(rows[key], rt.access)
		if err := rt.access.valid(rt.pattern); err != nil {
			t.Errorf("%s: %v", key, err)
		}
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			key := method + " " + path
			got, ok := rows[key]
			delete(rows, key)
			switch {
			case !ok:
				t.Errorf("%s (%s) is in the spec but has no row in the route table", key, op.OperationID)
				continue
			case len(got) != 1:
				t.Errorf("%s (%s) has %d rows in the route table, want exactly one", key, op.OperationID, len(got))
				continue
			}
			var scopes []tenants.Scope
			raw, _ := op.Extensions["x-required-scopes"].([]any)
			for _, v := range raw {
				scopes = append(scopes, tenants.Scope(fmt.Sprint(v)))
			}
			operatorOnly, _ := op.Extensions["x-operator-only"].(bool)
			var want access
			switch {
			case op.Security != nil && len(*op.Security) == 0:
				want = public
			case slices.Equal(scopes, []tenants.Scope{tenants.ScopeCheck}):
				want = checkScoped
			case len(scopes) > 0:
				want = orgKey(scopes...)
			case operatorOnly && strings.Contains(path, "{org}"):
				want = orgOperator(tenants.ScopeAdmin, tenants.ScopeBilling)
			case !strings.Contains(path, "{org}"):
				want = operator
			default:
				t.Errorf("%s (%s): the spec states no access these rules know", key, op.OperationID)
				continue
			}
			if got[0].kind != want.kind || !slices.Equal(got[0].scopes, want.scopes) {
				t.Errorf("%s (%s) declares %+v, the spec says %+v", key, op.OperationID, got[0], want)
			}
		}
	}
	for key := range rows {
		t.Errorf("%s is in the route table but not in the spec", key)
	}
}

// A row that declares no access, or an org access that cannot apply, stops the
// server from starting.
func TestUndeclaredAccessIsRefused(t *testing.T) {
	cases := []struct {
		name    string
		a       access
		pattern string
	}{
		{"zero", access{}, "/v1/plans"},
		{"org access without {org}", orgKey(tenants.ScopeAdmin), "/v1/plans"},
		{"org access without scopes", orgKey(), "/v1/orgs/{org}"},
		{"orgOperator without scopes", orgOperator(), "/v1/orgs/{org}/grants"},
	}
	for _, tc := range cases {
		if tc.a.valid(tc.pattern) == nil {
			t.Errorf("%s: valid", tc.name)
		}
	}
}
