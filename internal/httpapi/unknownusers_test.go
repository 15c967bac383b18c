package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/httpapi"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// refusedUser is what every refusal of user alcie in team eng says.
const refusedUser = `user \"alcie\" is not registered in team \"eng\", which refuses unknown users`

// usageReport is the org's usage of every metric at every level (org, teams,
// users): equal before and after a refusal when it counted nothing anywhere.
func usageReport(r *resReplica, org string) string {
	r.f.t.Helper()
	b, _ := json.Marshal(r.usage(r.f.t, org, operatorToken).Metrics)
	return string(b)
}

// wantRefused fails unless raw is a 422 problem naming field user and the refusal.
func wantRefused(t *testing.T, what string, code int, raw string) {
	t.Helper()
	var p api.Problem
	_ = json.Unmarshal([]byte(raw), &p)
	if code != 422 || !strings.Contains(raw, refusedUser) || len(p.Errors) != 1 || p.Errors[0].Field != "user" {
		t.Errorf("%s = %d %s, want 422 naming user alcie and team eng", what, code, raw)
	}
}

// A team that refuses unknown users refuses a check, a multi-metric check, a batch
// item and a reservation naming an unregistered user with 422 naming the team and
// the user, counting nothing; a registered user of the team is admitted, and so is
// an unregistered user of a team that allows them.
func TestUnknownUsersRefusedByTeam(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	key, admin := r.setup("acme")
	r.mustDo("PATCH", "/v1/plans/p-acme", operatorToken, `{"metered":["tokens"]}`, 200)
	r.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"ops","name":"Ops"}`, 201)
	r.mustDo("POST", "/v1/orgs/acme/teams/eng/users", operatorToken, `{"id":"alice"}`, 201)
	if got := r.check(key, `{"org":"acme","team":"eng","user":"alcie"}`); got.code != 200 {
		t.Fatalf("unregistered user before the setting = %d %s, want 200 (the default admits it)", got.code, got.raw)
	}

	out := r.mustDo("PATCH", "/v1/orgs/acme/teams/eng", admin, `{"unknown_users":"refuse"}`, 200)
	if !strings.Contains(out, `"unknown_users":"refuse"`) {
		t.Fatalf("patched team = %s", out)
	}
	if out := r.mustDo("GET", "/v1/orgs/acme/teams/ops", admin, "", 200); !strings.Contains(out, `"unknown_users":"org"`) {
		t.Errorf("a team that was not changed = %s, want unknown_users org", out)
	}
	before := usageReport(r, "acme")

	got := r.check(key, `{"org":"acme","team":"eng","user":"alcie"}`)
	wantRefused(t, "check", got.code, got.raw)
	got = r.check(key, `{"org":"acme","team":"eng","user":"alcie","costs":{"requests":1,"tokens":100}}`)
	wantRefused(t, "multi-metric check", got.code, got.raw)
	rec := r.f.do("POST", "/v1/reservations", key, `{"org":"acme","team":"eng","user":"alcie","metric":"tokens","amount":10}`)
	wantRefused(t, "reservation", rec.Code, rec.Body.String())
	rec = r.f.do("POST", "/v1/check/batch", key, `{"checks":[{"org":"acme","team":"eng","user":"alcie"},{"org":"acme","team":"eng","user":"alice","cost":0}]}`)
	var batch struct {
		Results []json.RawMessage `json:"results"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &batch); err != nil || rec.Code != 200 || len(batch.Results) != 2 {
		t.Fatalf("batch = %d %s", rec.Code, rec.Body)
	}
	var item struct {
		Status int `json:"status"`
	}
	_ = json.Unmarshal(batch.Results[0], &item)
	wantRefused(t, "batch item", item.Status, string(batch.Results[0]))
	if !strings.Contains(string(batch.Results[1]), `"allowed":true`) {
		t.Errorf("batch item of alice = %s, want allowed", batch.Results[1])
	}
	if after := usageReport(r, "acme"); after != before {
		t.Errorf("usage changed by refused checks:\nbefore %s\nafter  %s", before, after)
	}

	// The registered user of the team, and unknown users of a team that follows the
	// org (which allows them), are admitted and counted.
	if got := r.check(key, `{"org":"acme","team":"eng","user":"alice"}`); got.code != 200 {
		t.Errorf("registered alice = %d %s, want 200", got.code, got.raw)
	}
	if got := r.check(key, `{"org":"acme","team":"ops","user":"alcie"}`); got.code != 200 {
		t.Errorf("unregistered user of team ops = %d %s, want 200", got.code, got.raw)
	}
	if usageReport(r, "acme") == before {
		t.Error("admitted checks were not counted")
	}

	// The change is in the audit log with what it was and what it became.
	var audit api.AuditList
	_ = json.Unmarshal([]byte(r.mustDo("GET", "/v1/orgs/acme/audit", admin, "", 200)), &audit)
	var found bool
	for _, e := range audit.Items {
		if e.Action == "team.update" && strings.Contains(string(e.Before), `"unknown_users":"org"`) &&
			strings.Contains(string(e.After), `"unknown_users":"refuse"`) {
			found = true
		}
	}
	if !found {
		t.Errorf("no team.update audit entry from org to refuse: %+v", audit.Items)
	}

	// Back to allow: alcie is admitted again.
	r.mustDo("PATCH", "/v1/orgs/acme/teams/eng", admin, `{"unknown_users":"allow"}`, 200)
	if got := r.check(key, `{"org":"acme","team":"eng","user":"alcie"}`); got.code != 200 {
		t.Errorf("after allow = %d %s, want 200", got.code, got.raw)
	}
}

// An org's unknown_users is the default of its teams: an org admin may set it, teams
// that follow the org refuse unknown users, and a team's own setting overrides it
// either way.
func TestUnknownUsersOrgDefaultAndTeamOverride(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	key, admin := r.setup("acme")
	r.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"ops","name":"Ops","unknown_users":"allow"}`, 201)
	r.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"lab","name":"Lab","unknown_users":"refuse"}`, 201)
	if out := r.mustDo("GET", "/v1/orgs/acme", admin, "", 200); !strings.Contains(out, `"unknown_users":"allow"`) {
		t.Errorf("a new org = %s, want unknown_users allow", out)
	}
	code := func(team string) int {
		t.Helper()
		return r.check(key, `{"org":"acme","team":"`+team+`","user":"alcie","cost":0}`).code
	}
	for team, want := range map[string]int{"eng": 200, "ops": 200, "lab": 422} {
		if got := code(team); got != want {
			t.Errorf("org allows: team %s = %d, want %d", team, got, want)
		}
	}
	out := r.mustDo("PATCH", "/v1/orgs/acme", admin, `{"unknown_users":"refuse"}`, 200)
	if !strings.Contains(out, `"unknown_users":"refuse"`) {
		t.Fatalf("patched org = %s", out)
	}
	for team, want := range map[string]int{"eng": 422, "ops": 200, "lab": 422} {
		if got := code(team); got != want {
			t.Errorf("org refuses: team %s = %d, want %d", team, got, want)
		}
	}
	// A team set back to follow the org refuses with it.
	r.mustDo("PATCH", "/v1/orgs/acme/teams/ops", admin, `{"unknown_users":"org"}`, 200)
	if got := code("ops"); got != 422 {
		t.Errorf("team ops following a refusing org = %d, want 422", got)
	}
	// An org created refusing.
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"beta","name":"B","plan":"p-acme","unknown_users":"refuse"}`, 201)
	r.mustDo("POST", "/v1/orgs/beta/teams", operatorToken, `{"id":"eng","name":"Eng"}`, 201)
	got := r.check(operatorToken, `{"org":"beta","team":"eng","user":"alcie"}`)
	wantRefused(t, "check of an org created refusing", got.code, got.raw)
}

// A bad unknown_users is a 400 naming the field in plain words and changes nothing.
func TestUnknownUsersBadValue(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	_, admin := r.setup("acme")
	cases := []struct{ method, path, body, want string }{
		{"PATCH", "/v1/orgs/acme", `{"unknown_users":"deny"}`, "must be one of allow, refuse"},
		{"PATCH", "/v1/orgs/acme", `{"unknown_users":"org"}`, "must be one of allow, refuse"},
		{"POST", "/v1/orgs", `{"id":"b","name":"B","plan":"p-acme","unknown_users":"no"}`, "must be one of allow, refuse"},
		{"PATCH", "/v1/orgs/acme/teams/eng", `{"unknown_users":"Refuse"}`, "must be one of org, allow, refuse"},
		{"POST", "/v1/orgs/acme/teams", `{"id":"ops","name":"Ops","unknown_users":""}`, "must be one of org, allow, refuse"},
		{"PATCH", "/v1/orgs/acme/teams/eng", `{"unknown_users":true}`, "must be one of org, allow, refuse"},
	}
	for _, tc := range cases {
		token := admin
		if tc.method == "POST" && tc.path == "/v1/orgs" {
			token = operatorToken
		}
		rec := r.f.do(tc.method, tc.path, token, tc.body)
		var p api.Problem
		_ = json.Unmarshal(rec.Body.Bytes(), &p)
		if rec.Code != 400 || len(p.Errors) != 1 || p.Errors[0].Field != "unknown_users" || !strings.Contains(p.Errors[0].Message, tc.want) ||
			strings.Contains(rec.Body.String(), "^") || strings.Contains(rec.Body.String(), "UnknownUsers") {
			t.Errorf("%s %s %s = %d %s, want 400 naming unknown_users: %s", tc.method, tc.path, tc.body, rec.Code, rec.Body, tc.want)
		}
	}
	if out := r.mustDo("GET", "/v1/orgs/acme/teams/eng", admin, "", 200); !strings.Contains(out, `"unknown_users":"org"`) {
		t.Errorf("team after refused patches = %s", out)
	}
	r.mustDo("GET", "/v1/orgs/b", operatorToken, "", 404)
}

// A change of unknown_users through one replica reaches another replica's cache
// within a second, as a change of limits does.
func TestUnknownUsersReachesSecondReplica(t *testing.T) {
	dbURL := testenv.PostgresURL(t)
	prefix := testenv.ID(t, "h")
	a, b := newReplica(t, dbURL, prefix), newReplica(t, dbURL, prefix)
	key, admin := a.setup("acme")
	body := `{"org":"acme","team":"eng","user":"alcie","cost":0}`
	if got := b.check(key, body); got.code != 200 {
		t.Fatalf("replica b before: %d %s", got.code, got.raw)
	}
	for _, step := range []struct {
		patch, path string
		want        int
	}{
		{`{"unknown_users":"refuse"}`, "/v1/orgs/acme/teams/eng", 422},
		{`{"unknown_users":"allow"}`, "/v1/orgs/acme/teams/eng", 200},
		{`{"unknown_users":"refuse"}`, "/v1/orgs/acme", 200}, // the team allows: its own setting wins
		{`{"unknown_users":"org"}`, "/v1/orgs/acme/teams/eng", 422},
	} {
		a.mustDo("PATCH", step.path, admin, step.patch, 200)
		start := time.Now()
		for {
			got := b.check(key, body)
			if got.code == step.want {
				break
			}
			if time.Since(start) > time.Second {
				t.Fatalf("after %s %s replica b still answers %d, want %d", step.path, step.patch, got.code, step.want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// Refusing unknown users costs the check path no Postgres query: whether a team
// refuses is carried by the cached org, as its limits are, and an unregistered id is
// known without a query. 200 refused ids and a registered user after warm-up: 0
// queries.
func TestUnknownUsersRefusedWithoutAQuery(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	key, _ := r.setup("acme")
	r.mustDo("POST", "/v1/orgs/acme/teams/eng/users", operatorToken, `{"id":"alice"}`, 201)
	r.mustDo("PATCH", "/v1/orgs/acme/teams/eng", operatorToken, `{"unknown_users":"refuse"}`, 200)
	// Warm up until three checks in a row cost no query (the setup's invalidations
	// come back through Redis a moment later), as TestCheckNewUserIDsCostNoPostgresQuery.
	warmUntilNoQuery(t, r.f.pool, "refused checks", func() {
		if c := r.check(key, `{"org":"acme","team":"eng","user":"warm-up","cost":0}`); c.code != 422 {
			t.Fatalf("warm-up check = %d %s, want 422", c.code, c.raw)
		}
	})
	before := r.f.pool.Stat().AcquireCount()
	for i := range 200 {
		if c := r.check(key, fmt.Sprintf(`{"org":"acme","team":"eng","user":"visitor-%d","cost":0}`, i)); c.code != 422 {
			t.Fatalf("check of visitor-%d = %d %s, want 422", i, c.code, c.raw)
		}
	}
	if c := r.check(key, `{"org":"acme","user":"alice","cost":0}`); c.code != 200 {
		t.Fatalf("check of alice = %d %s", c.code, c.raw)
	}
	if n := r.f.pool.Stat().AcquireCount() - before; n != 0 {
		t.Errorf("201 checks after warm-up made %d Postgres queries, want 0", n)
	}
}

// An org resolved without its users (more registered users than the cache carries
// with one org) looks each id up once: an unregistered id under a refusing team is
// refused there too, and a registered one admitted.
func TestUnknownUsersRefusedInALargeOrg(t *testing.T) {
	prefix := testenv.ID(t, "h")
	r := newReplicaOn(t, testenv.PostgresURL(t), prefix, time.Hour, prometheus.NewRegistry(), quota.Config{KeyPrefix: prefix},
		testenv.RedisURL(t), testenv.Redis(t), func(d *httpapi.Deps) {
			// Users 10: an org with more than 1 registered user is resolved without them.
			c := tenants.NewCache(d.Tenants, tenants.CacheOptions{TTL: time.Hour, KeyTTL: time.Hour, Users: 10,
				Channel: tenants.InvalidationChannel + ":" + prefix})
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			c.Listen(ctx, d.Redis)
			d.Cache = c
		})
	key, _ := r.setup("acme")
	for _, u := range []string{"alice", "bob", "carol"} {
		r.mustDo("POST", "/v1/orgs/acme/teams/eng/users", operatorToken, `{"id":"`+u+`"}`, 201)
	}
	r.mustDo("PATCH", "/v1/orgs/acme", operatorToken, `{"unknown_users":"refuse"}`, 200)
	for range 2 { // the second time from the per-user cache
		got := r.check(key, `{"org":"acme","team":"eng","user":"alcie"}`)
		wantRefused(t, "check in a large org", got.code, got.raw)
		if got := r.check(key, `{"org":"acme","team":"eng","user":"alice"}`); got.code != 200 {
			t.Errorf("registered alice in a large org = %d %s", got.code, got.raw)
		}
	}
}
