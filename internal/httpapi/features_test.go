package httpapi_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// setupFeatures creates, through the API, what replica.setup does with features on
// the plan: sso true, seats 25, tier "gold", beta true. It returns the org's check
// key and admin key.
func (r *replica) setupFeatures(org string) (checkKey, adminKey string) {
	r.f.t.Helper()
	checkKey, adminKey = r.setup(org)
	r.mustDo("PATCH", "/v1/plans/p-"+org, operatorToken, `{"features":{"sso":true,"seats":25,"tier":"gold","beta":true}}`, 200)
	return checkKey, adminKey
}

func (r *replica) entitlements(token, query string) (int, api.Entitlements, string) {
	rec := r.f.do("GET", "/v1/entitlements?"+query, token, "")
	var e api.Entitlements
	_ = json.Unmarshal(rec.Body.Bytes(), &e)
	return rec.Code, e, rec.Body.String()
}

// A plan's features, overridden per org by the operator (set, add, remove), resolve
// to what GET /v1/entitlements answers, with where each comes from; the override is
// audited, and only the operator may set one.
func TestEntitlementsResolvePlanAndOverrides(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	key, admin := r.setupFeatures("acme")
	otherKey, otherAdmin := r.setup("other")
	r.mustDo("POST", "/v1/orgs/acme/teams/eng/users", operatorToken, `{"id":"alice"}`, 201)

	code, e, raw := r.entitlements(key, "org=acme")
	if code != 200 {
		t.Fatalf("GET /v1/entitlements = %d %s", code, raw)
	}
	want := api.Entitlements{Org: "acme", Features: api.Features{"sso": true, "seats": float64(25), "tier": "gold", "beta": true},
		Sources: api.FeatureSources{"sso": "plan", "seats": "plan", "tier": "plan", "beta": "plan"}}
	if d := cmp.Diff(want, e); d != "" {
		t.Errorf("plan's features (-want +got):\n%s", d)
	}

	// Only the operator overrides: the org's admin key 403, another org's 404.
	body := `{"features":{"seats":50,"beta":null,"region":"eu"}}`
	r.mustDo("PUT", "/v1/orgs/acme/features", admin, body, 403)
	r.mustDo("PUT", "/v1/orgs/acme/features", otherAdmin, body, 404)
	var of api.OrgFeatures
	_ = json.Unmarshal([]byte(r.mustDo("PUT", "/v1/orgs/acme/features", operatorToken, body, 200)), &of)
	fifty := any(float64(50))
	eu := any("eu")
	if d := cmp.Diff(api.FeatureOverrides{"seats": &fifty, "beta": nil, "region": &eu}, of.Overrides); d != "" {
		t.Errorf("overrides as set (-want +got):\n%s", d)
	}

	code, e, raw = r.entitlements(key, "org=acme&team=eng&user=alice")
	if code != 200 {
		t.Fatalf("GET /v1/entitlements = %d %s", code, raw)
	}
	eng, alice := "eng", "alice"
	want = api.Entitlements{Org: "acme", Team: &eng, User: &alice,
		Features: api.Features{"sso": true, "seats": float64(50), "tier": "gold", "region": "eu"},
		Sources:  api.FeatureSources{"sso": "plan", "seats": "org", "tier": "plan", "region": "org"}}
	if d := cmp.Diff(want, e); d != "" {
		t.Errorf("resolved features (-want +got):\n%s", d)
	}
	// The registered user's team is found without being named; the admin's read (the
	// console's) agrees with the check path's.
	if code, e, raw := r.entitlements(key, "org=acme&user=alice"); code != 200 || e.Team == nil || *e.Team != "eng" {
		t.Errorf("user alone = %d %s, want her team eng", code, raw)
	}
	_ = json.Unmarshal([]byte(r.mustDo("GET", "/v1/orgs/acme/features", admin, "", 200)), &of)
	if d := cmp.Diff(want.Features, of.Features); d != "" || of.Plan != "p-acme" || of.PlanFeatures["beta"] != true {
		t.Errorf("GET /v1/orgs/acme/features = %+v (features -check path +admin route:\n%s)", of, d)
	}

	// The override is audited with what it was and what it became.
	var audit api.AuditList
	_ = json.Unmarshal([]byte(r.mustDo("GET", "/v1/orgs/acme/audit", admin, "", 200)), &audit)
	if len(audit.Items) == 0 || audit.Items[0].Action != "org.features" || !strings.Contains(string(audit.Items[0].After), `"region":"eu"`) {
		t.Errorf("newest audit entry = %+v, want org.features with the new overrides", audit.Items[:min(1, len(audit.Items))])
	}

	// Another org, a team that does not exist, a key without the check scope.
	for _, c := range []struct {
		name, token, query string
		want               int
	}{
		{"another org's key", otherKey, "org=acme", 404},
		{"another org's admin key", otherAdmin, "org=acme", 404},
		{"no check scope", admin, "org=acme", 403},
		{"unknown team", key, "org=acme&team=nope", 404},
		{"user in another team", key, "org=acme&team=ops&user=alice", 400},
		{"no org", key, "team=eng", 400},
		{"bad org id", key, "org=" + strings.Repeat("a", 200), 400},
		{"no token", "", "org=acme", 401},
		{"unknown org, operator", operatorToken, "org=nobody", 404},
	} {
		if code, _, raw := r.entitlements(c.token, c.query); code != c.want {
			t.Errorf("%s: GET /v1/entitlements?%s = %d, want %d: %s", c.name, c.query, code, c.want, raw)
		}
	}

	// {} clears every override.
	r.mustDo("PUT", "/v1/orgs/acme/features", operatorToken, `{"features":{}}`, 200)
	if _, e, _ := r.entitlements(key, "org=acme"); e.Features["seats"] != float64(25) || e.Features["beta"] != true || e.Features["region"] != nil {
		t.Errorf("after clearing overrides: %+v", e.Features)
	}
}

// Bad features are refused with a problem naming the field, and write nothing.
func TestFeaturesValidation(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	r.setupFeatures("acme")
	many := make([]string, 65)
	for i := range many {
		many[i] = fmt.Sprintf(`"f%d":true`, i)
	}
	for _, c := range []struct {
		name, method, path, body, field string
	}{
		{"a fraction", "POST", "/v1/plans", `{"id":"x","name":"X","fail_mode":"open","limits":[],"features":{"seats":2.5}}`, "features.seats"},
		{"an object", "PATCH", "/v1/plans/p-acme", `{"features":{"tier":{"name":"gold"}}}`, "features.tier"},
		{"null on a plan", "PATCH", "/v1/plans/p-acme", `{"features":{"sso":null}}`, "features.sso"},
		{"too large an integer", "PATCH", "/v1/plans/p-acme", `{"features":{"seats":9007199254740992}}`, "features.seats"},
		{"too long a string", "PATCH", "/v1/plans/p-acme", `{"features":{"tier":"` + strings.Repeat("g", 257) + `"}}`, "features.tier"},
		{"a bad name", "PATCH", "/v1/plans/p-acme", `{"features":{"-sso":true}}`, "features"},
		{"too many", "PATCH", "/v1/plans/p-acme", `{"features":{` + strings.Join(many, ",") + `}}`, "features"},
		{"override: a fraction", "PUT", "/v1/orgs/acme/features", `{"features":{"seats":0.5}}`, "features.seats"},
		{"override: a bad name", "PUT", "/v1/orgs/acme/features", `{"features":{"a b":1}}`, "features"},
		{"override: no features", "PUT", "/v1/orgs/acme/features", `{}`, "features"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := r.f.fingerprint()
			rec := r.f.do(c.method, c.path, operatorToken, c.body)
			if rec.Code != 400 {
				t.Fatalf("%s %s = %d, want 400: %s", c.method, c.path, rec.Code, rec.Body)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type = %q", ct)
			}
			p := problemOf(t, rec.Body.String())
			var fields []string
			for _, fe := range p.Errors {
				fields = append(fields, fe.Field)
			}
			found := false
			for _, f := range fields {
				found = found || f == c.field
			}
			if !found {
				t.Errorf("fields %q, want %q: %s", fields, c.field, rec.Body)
			}
			if p.Detail != nil {
				t.Logf("%s", *p.Detail)
			}
			if r.f.fingerprint() != before {
				t.Error("a refused request changed the database")
			}
		})
	}
	// The bounds themselves are accepted.
	r.mustDo("PATCH", "/v1/plans/p-acme", operatorToken, `{"features":{"seats":9007199254740991,"debt":-9007199254740991,"tier":"`+strings.Repeat("g", 256)+`"}}`, 200)
}

// Entitlements cost no Postgres query per call once the org is warm, as checks do
// (TestCheckNewUserIDsCostNoPostgresQuery): measured in pool acquisitions.
func TestEntitlementsCostNoPostgresQuery(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	key, _ := r.setupFeatures("acme")
	r.mustDo("POST", "/v1/orgs/acme/teams/eng/users", operatorToken, `{"id":"alice"}`, 201)
	// Warm up until three calls in a row cost no query: the setup's own invalidations
	// come back through Redis pub/sub a moment later and drop the org once more.
	warmUntilNoQuery(t, r.f.pool, "entitlements", func() {
		if code, _, raw := r.entitlements(key, "org=acme&team=eng&user=warm-up"); code != 200 {
			t.Fatalf("warm-up = %d %s", code, raw)
		}
	})
	before := r.f.pool.Stat().AcquireCount()
	for i := range 300 {
		q := []string{"org=acme", "org=acme&team=eng", "org=acme&user=alice", fmt.Sprintf("org=acme&team=eng&user=visitor-%d", i)}[i%4]
		if code, e, raw := r.entitlements(key, q); code != 200 || e.Features["sso"] != true {
			t.Fatalf("GET /v1/entitlements?%s = %d %s", q, code, raw)
		}
	}
	if n := r.f.pool.Stat().AcquireCount() - before; n != 0 {
		t.Errorf("300 entitlement calls after warm-up made %d Postgres queries, want 0", n)
	}
}

// A change of an org's overrides, or of its plan's features, made through one
// replica is served by another within a second (the org cache's pub/sub
// invalidation).
func TestFeaturesChangeReachesSecondReplica(t *testing.T) {
	dbURL := testenv.PostgresURL(t)
	prefix := testenv.ID(t, "h")
	a, b := newReplica(t, dbURL, prefix), newReplica(t, dbURL, prefix)
	key, _ := a.setupFeatures("acme")
	wait := func(what string, ok func(api.Features) bool) {
		t.Helper()
		start := time.Now()
		for {
			code, e, raw := b.entitlements(key, "org=acme")
			if code != 200 {
				t.Fatalf("replica b: %d %s", code, raw)
			}
			if ok(e.Features) {
				t.Logf("replica b served %s after %v", what, time.Since(start))
				return
			}
			if time.Since(start) > time.Second {
				t.Fatalf("replica b still serves %v a second after %s", e.Features, what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// b caches the org as it is, then a changes it.
	wait("the plan's features", func(f api.Features) bool { return f["seats"] == float64(25) })
	a.mustDo("PUT", "/v1/orgs/acme/features", operatorToken, `{"features":{"seats":50,"sso":null}}`, 200)
	wait("the override", func(f api.Features) bool { return f["seats"] == float64(50) && f["sso"] == nil })
	a.mustDo("PATCH", "/v1/plans/p-acme", operatorToken, `{"features":{"tier":"platinum"}}`, 200)
	wait("the plan's change", func(f api.Features) bool {
		return f["tier"] == "platinum" && f["beta"] == nil && f["seats"] == float64(50)
	})
}
