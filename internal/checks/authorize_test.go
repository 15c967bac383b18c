package checks_test

import (
	"testing"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// The check scope's one test: the operator checks any org; a key only its own org
// (another is not found) and only with the check scope.
func TestAuthorize(t *testing.T) {
	key := func(org string, scopes ...tenants.Scope) checks.Caller {
		return checks.Caller{Key: tenants.APIKey{OrgID: org, Scopes: scopes}}
	}
	for name, c := range map[string]struct {
		caller checks.Caller
		org    string
		want   derrors.Kind // Internal: allowed
	}{
		"operator":             {checks.Caller{Operator: true}, "acme", derrors.Internal},
		"its org, check scope": {key("acme", tenants.ScopeCheck), "acme", derrors.Internal},
		"another org":          {key("acme", tenants.ScopeCheck), "other", derrors.NotFound},
		"no check scope":       {key("acme", tenants.ScopeAdmin, tenants.ScopeBilling), "acme", derrors.Forbidden},
	} {
		err := c.caller.Authorize(c.org)
		switch {
		case c.want == derrors.Internal && err != nil:
			t.Errorf("%s: %v, want allowed", name, err)
		case c.want != derrors.Internal && derrors.KindOf(err) != c.want:
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}
