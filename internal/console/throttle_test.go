package console_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Through the console, an admin sets and lifts the org's throttle; a viewer reads it
// but can neither set nor lift it, even with the CSRF token.
func TestConsoleThrottle(t *testing.T) {
	e := mustEnv(t)
	admin, adminCSRF := e.mustSignIn(t, adminEmail)
	viewer, viewerCSRF := e.mustSignIn(t, viewerEmail)
	set := `{"factor":0.5,"ttl_seconds":600,"reason":"error rate above 5%"}`
	for _, tc := range []struct {
		name string
		r    req
		want int
	}{
		{"viewer sets", req{method: "PUT", path: "/v1/orgs/acme/throttle", body: set, cookie: viewer, csrf: viewerCSRF}, http.StatusForbidden},
		{"admin sets", req{method: "PUT", path: "/v1/orgs/acme/throttle", body: set, cookie: admin, csrf: adminCSRF}, http.StatusOK},
		{"viewer reads", req{method: "GET", path: "/v1/orgs/acme/throttle", cookie: viewer}, http.StatusOK},
		{"viewer lifts", req{method: "DELETE", path: "/v1/orgs/acme/throttle", cookie: viewer, csrf: viewerCSRF}, http.StatusForbidden},
		{"viewer sets the plan's", req{method: "PUT", path: "/v1/plans/pro/throttle", body: set, cookie: viewer, csrf: viewerCSRF}, http.StatusForbidden},
		{"admin sets the plan's", req{method: "PUT", path: "/v1/plans/pro/throttle", body: set, cookie: admin, csrf: adminCSRF}, http.StatusForbidden},
		{"admin lifts", req{method: "DELETE", path: "/v1/orgs/acme/throttle", cookie: admin, csrf: adminCSRF}, http.StatusNoContent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if res := e.do(t, tc.r); res.StatusCode != tc.want {
				t.Fatalf("%d %s, want %d", res.StatusCode, body(t, res), tc.want)
			}
		})
	}
	entries, _, err := e.svc.ListAudit(context.Background(), "acme", tenants.Page{Limit: 2})
	if err != nil || len(entries) != 2 || entries[0].Action != "throttle.delete" || entries[1].Action != "throttle.set" ||
		entries[0].Actor != "console:"+adminEmail || entries[1].Actor != "console:"+adminEmail {
		t.Errorf("audit: %+v %v", entries, err)
	}
	if _, ok, err := e.svc.GetThrottle(context.Background(), tenants.ThrottlePlan, "pro"); ok || err != nil {
		t.Error("the plan was throttled through an org's console")
	}
}
