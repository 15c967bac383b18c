package clienttest

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/client"
)

// The client's Entitlements, Feature and Entitled against the real api: the plan's
// features with the org's overrides, integers as int64, errors as *client.Error.
func TestEntitlements(t *testing.T) {
	e := newEnv(t, "")
	e.op("PATCH", "/v1/plans/p-"+e.org, `{"features":{"sso":true,"seats":25,"tier":"gold","beta":true,"audit":false}}`, 200)
	e.op("PUT", "/v1/orgs/"+e.org+"/features", `{"features":{"seats":50,"beta":null,"trial":0}}`, 200)
	c := e.client()
	ctx := context.Background()

	got, err := c.Entitlements(ctx, e.org, "eng", "alice")
	if err != nil {
		t.Fatal(err)
	}
	want := &client.Entitlements{Org: e.org, Team: "eng", User: "alice",
		Features: map[string]any{"sso": true, "seats": int64(50), "tier": "gold", "audit": false, "trial": int64(0)},
		Sources:  map[string]string{"sso": "plan", "seats": "org", "tier": "plan", "audit": "plan", "trial": "org"}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Entitlements (-want +got):\n%s", d)
	}
	for feature, want := range map[string]bool{"sso": true, "seats": true, "tier": true, "audit": false, "trial": false, "beta": false, "nope": false} {
		if ok, err := c.Entitled(ctx, e.org, "", "", feature); err != nil || ok != want {
			t.Errorf("Entitled(%s) = %v, %v; want %v", feature, ok, err, want)
		}
	}
	if v, err := c.Feature(ctx, e.org, "eng", "", "seats"); err != nil || v != int64(50) {
		t.Errorf("Feature(seats) = %#v, %v; want int64(50)", v, err)
	}
	if v, err := c.Feature(ctx, e.org, "", "", "beta"); err != nil || v != nil {
		t.Errorf("Feature(beta), removed by the override = %#v, %v; want nil", v, err)
	}
	var pe *client.Error
	if _, err := c.Entitled(ctx, e.org, "nope", "", "sso"); !errors.As(err, &pe) || pe.StatusCode != 404 {
		t.Errorf("unknown team: %v, want a 404 *client.Error", err)
	}
	if _, err := c.Feature(ctx, "another-org", "", "", "sso"); !errors.As(err, &pe) || pe.StatusCode != 404 {
		t.Errorf("another org: %v, want a 404 *client.Error", err)
	}
}
