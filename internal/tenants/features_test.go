package tenants_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/tenants"
)

func TestResolveFeatures(t *testing.T) {
	plan := tenants.Features{"sso": true, "seats": int64(25), "tier": "gold"}
	over := tenants.Features{"seats": int64(50), "sso": nil, "region": "eu"}
	got := tenants.ResolveFeatures(plan, over)
	want := tenants.Entitlements{
		Features: tenants.Features{"seats": int64(50), "tier": "gold", "region": "eu"},
		Sources:  map[string]tenants.FeatureSource{"seats": tenants.SourceOrg, "tier": tenants.SourcePlan, "region": tenants.SourceOrg},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("ResolveFeatures (-want +got):\n%s", d)
	}
	if plan["sso"] != true || len(over) != 3 {
		t.Error("ResolveFeatures changed its arguments")
	}
}

// The service's own validation, behind the API's schema: every value kind a Go
// caller or a JSON decoder may hand it, normalized to bool, int64 or string.
func TestValidateFeatures(t *testing.T) {
	ok := tenants.Features{"a": true, "b": 3, "c": float64(4), "d": json.Number("5"), "e": "x", "f": int64(-tenants.MaxFeatureInt)}
	if err := tenants.ValidateFeatures(ok, false); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(tenants.Features{"a": true, "b": int64(3), "c": int64(4), "d": int64(5), "e": "x", "f": int64(-tenants.MaxFeatureInt)}, ok); d != "" {
		t.Errorf("normalized (-want +got):\n%s", d)
	}
	many := tenants.Features{}
	for i := range tenants.MaxFeatures + 1 {
		many[strings.Repeat("f", i+1)] = true
	}
	for _, c := range []struct {
		name  string
		fs    tenants.Features
		nilOK bool
		field string
	}{
		{"fraction", tenants.Features{"seats": 2.5}, false, "features.seats"},
		{"json fraction", tenants.Features{"seats": json.Number("2.5")}, false, "features.seats"},
		{"too large", tenants.Features{"seats": int64(tenants.MaxFeatureInt + 1)}, false, "features.seats"},
		{"float too large", tenants.Features{"seats": float64(1 << 60)}, false, "features.seats"},
		{"null on a plan", tenants.Features{"sso": nil}, false, "features.sso"},
		{"object", tenants.Features{"tier": map[string]any{}}, true, "features.tier"},
		{"long string", tenants.Features{"tier": strings.Repeat("g", tenants.MaxFeatureStringLen+1)}, false, "features.tier"},
		{"bad name", tenants.Features{"1sso": true}, false, "features"},
		{"too many", many, false, "features"},
	} {
		err := tenants.ValidateFeatures(c.fs, c.nilOK)
		var ve *tenants.ValidationError
		if !errors.As(err, &ve) || len(ve.Fields) != 1 || ve.Fields[0].Field != c.field {
			t.Errorf("%s: %v, want one problem of %s", c.name, err, c.field)
		}
	}
	if err := tenants.ValidateFeatures(tenants.Features{"sso": nil}, true); err != nil {
		t.Errorf("null override: %v", err)
	}
}
