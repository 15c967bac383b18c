package tenants_test

import (
	"errors"
	"testing"

	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// TestSlidingWindowsValidation: a plan takes estimate or precise, an org also plan;
// anything else is refused naming sliding_windows.
func TestSlidingWindowsValidation(t *testing.T) {
	w := func(s string) *tenants.SlidingWindows { v := tenants.SlidingWindows(s); return &v }
	plan := tenants.PlanInput{ID: "p", Name: "P", FailMode: vocab.FailOpen}
	org := tenants.OrgInput{ID: "o", Name: "O", PlanID: "p"}
	for _, tc := range []struct {
		name string
		in   interface{ Validate() error }
		ok   bool
	}{
		{"plan default", plan, true},
		{"plan precise", func() tenants.PlanInput { p := plan; p.SlidingWindows = "precise"; return p }(), true},
		{"plan estimate", func() tenants.PlanInput { p := plan; p.SlidingWindows = "estimate"; return p }(), true},
		{"plan plan", func() tenants.PlanInput { p := plan; p.SlidingWindows = "plan"; return p }(), false},
		{"plan exact", func() tenants.PlanInput { p := plan; p.SlidingWindows = "exact"; return p }(), false},
		{"plan patch precise", tenants.PlanPatch{SlidingWindows: w("precise")}, true},
		{"plan patch plan", tenants.PlanPatch{SlidingWindows: w("plan")}, false},
		{"org plan", func() tenants.OrgInput { o := org; o.SlidingWindows = "plan"; return o }(), true},
		{"org precise", func() tenants.OrgInput { o := org; o.SlidingWindows = "precise"; return o }(), true},
		{"org PRECISE", func() tenants.OrgInput { o := org; o.SlidingWindows = "PRECISE"; return o }(), false},
		{"org patch estimate", tenants.OrgPatch{SlidingWindows: w("estimate")}, true},
		{"org patch empty", tenants.OrgPatch{SlidingWindows: w("")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.in.Validate()
			if tc.ok {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			var ve *tenants.ValidationError
			if !errors.As(err, &ve) || len(ve.Fields) != 1 || ve.Fields[0].Field != "sliding_windows" {
				t.Fatalf("Validate = %v, want one problem naming sliding_windows", err)
			}
		})
	}
	if f := (tenants.OrgPatch{SlidingWindows: w("precise")}).OperatorOnly(); len(f) != 1 || f[0] != "sliding_windows" {
		t.Errorf("OperatorOnly = %v, want [sliding_windows]", f)
	}
}
