package console_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Grants through a console session: a viewer (and an admin) may read them; neither
// may create or revoke one, which is the operator's alone; nothing refused is written.
func TestConsoleGrantsAreReadOnly(t *testing.T) {
	e := mustEnv(t)
	g, err := e.svc.CreateGrant(context.Background(), tenants.Actor{Name: "test"}, "acme",
		tenants.GrantInput{Metric: "requests", Units: 10, Reason: "seed"})
	if err != nil {
		t.Fatal(err)
	}
	count := func() int {
		var n int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM grants WHERE revoked_at IS NULL`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, who := range []string{viewerEmail, adminEmail} {
		id, csrf := e.mustSignIn(t, who)
		if res := e.do(t, req{method: "GET", path: "/v1/orgs/acme/grants", cookie: id}); res.StatusCode != http.StatusOK {
			t.Errorf("%s lists grants: %d %s", who, res.StatusCode, body(t, res))
		}
		for _, r := range []req{
			{method: "POST", path: "/v1/orgs/acme/grants", body: `{"metric":"requests","units":5,"reason":"x"}`, cookie: id, csrf: csrf},
			{method: "DELETE", path: "/v1/orgs/acme/grants/" + g.ID, cookie: id, csrf: csrf},
		} {
			if res := e.do(t, r); res.StatusCode != http.StatusForbidden {
				t.Errorf("%s: %s %s = %d %s, want 403", who, r.method, r.path, res.StatusCode, body(t, res))
			}
		}
	}
	if n := count(); n != 1 {
		t.Errorf("%d active grants, want the 1 seeded", n)
	}
}
