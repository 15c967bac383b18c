package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// grantReplica is a billingReplica whose tenancy service runs on clock, with the
// resolved-limits cache of an hour's TTL, so only an invalidation or a grant's lapse
// makes it read an org again.
type grantReplica struct {
	*billingReplica
	clock *testenv.Clock
}

func newGrantReplica(t *testing.T) *grantReplica {
	t.Helper()
	clock := testenv.NewClock(time.Now())
	return &grantReplica{billingReplica: newBillingReplicaWith(t, "g", clock), clock: clock}
}

// org creates, through the API, an org on a plan of 100 requests a month (10
// included), a team "free" without limits and keys; it returns the check key and a
// key with the admin and billing scopes.
func (g *grantReplica) org(org string) (checkKey, orgKey string) {
	g.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p-`+org+`","name":"P","fail_mode":"closed",
		"limits":[{"metric":"requests","window":"month","limit":100}],"metered":["tokens"],
		"pricing":{"currency":"EUR","base_price":"10","metrics":[{"metric":"requests","included_units":10,"overage_price":"0.5"}]}}`, 201)
	g.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"`+org+`","name":"O","plan":"p-`+org+`"}`, 201)
	g.mustDo("POST", "/v1/orgs/"+org+"/teams", operatorToken, `{"id":"free","name":"Free"}`, 201)
	var k, a api.ApiKeyCreated
	_ = json.Unmarshal([]byte(g.mustDo("POST", "/v1/orgs/"+org+"/api-keys", operatorToken, `{"name":"c","scopes":["check"]}`, 201)), &k)
	_ = json.Unmarshal([]byte(g.mustDo("POST", "/v1/orgs/"+org+"/api-keys", operatorToken, `{"name":"a","scopes":["admin","billing"]}`, 201)), &a)
	return k.Secret, a.Secret
}

func (g *grantReplica) spend(key, org string, cost int) int {
	g.f.t.Helper()
	out := g.check(key, fmt.Sprintf(`{"org":%q,"team":"free","cost":%d}`, org, cost))
	if out.code != 200 && out.code != 429 {
		g.f.t.Fatalf("check: %d %s", out.code, out.raw)
	}
	return out.code
}

// A grant of 50 on a month limit of 100 admits exactly 150 units, the 151st is
// denied; a team allocation that fits only with the grant is accepted; usage shows
// the raised limit and the granted units, the export the granted units on the org
// total row; creating it is audited with its reason, and revoking it with before and
// after.
func TestGrantRaisesTheCapExactly(t *testing.T) {
	g := newGrantReplica(t)
	org := testenv.ID(t, "acme")
	checkKey, orgKey := g.org(org)
	ops := `{"id":"ops","name":"Ops","limits":[{"metric":"requests","window":"month","limit":150}]}`
	g.mustDo("POST", "/v1/orgs/"+org+"/teams", operatorToken, ops, 422)

	var gr api.Grant
	body := g.mustDo("POST", "/v1/orgs/"+org+"/grants", operatorToken, `{"metric":"requests","units":50,"reason":"launch week"}`, 201)
	if err := json.Unmarshal([]byte(body), &gr); err != nil {
		t.Fatal(err)
	}
	per := vocab.PeriodAt(g.clock.Now(), 1)
	if gr.Org != org || gr.Metric != "requests" || gr.Units != 50 || gr.Reason != "launch week" || !gr.Active ||
		!gr.Until.Equal(per.End) || gr.RevokedAt != nil {
		t.Fatalf("grant = %s, want 50 requests until %s", body, per.End)
	}
	g.mustDo("POST", "/v1/orgs/"+org+"/teams", operatorToken, ops, 201)

	admitted := 0
	for range 150 {
		if g.spend(checkKey, org, 1) == 200 {
			admitted++
		}
	}
	if admitted != 150 {
		t.Fatalf("%d of 150 units admitted under 100 + 50 granted", admitted)
	}
	if code := g.spend(checkKey, org, 1); code != 429 {
		t.Fatalf("the 151st unit: %d, want 429", code)
	}

	var u api.Usage
	if err := json.Unmarshal([]byte(g.mustDo("GET", "/v1/orgs/"+org+"/usage", orgKey, "", 200)), &u); err != nil {
		t.Fatal(err)
	}
	if len(u.Metrics) != 1 || len(u.Metrics[0].Org.Limits) != 1 {
		t.Fatalf("usage: %+v", u.Metrics)
	}
	w := u.Metrics[0].Org.Limits[0]
	if w.Window != "month" || w.Limit != 150 || w.Used != 150 || w.Remaining != 0 || w.Granted == nil || *w.Granted != 50 {
		t.Fatalf("org month window = %+v, want limit 150 with 50 granted, 150 used", w)
	}

	if _, err := g.flusher.FlushOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	csv := g.mustDo("GET", "/v1/orgs/"+org+"/billing/export?format=csv", orgKey, "", 200)
	wantCSV := "period,org,team,user,metric,units,included_units,overage_units,amount,currency,granted_units,spend_amount,spend_currency,rate_price,rate_per\n" +
		per.ID + "," + org + ",free,,requests,150,0,0,0,EUR,0,,,,0\n" +
		per.ID + "," + org + ",,,requests,150,10,140,70,EUR,50,,,,0\n"
	if csv != wantCSV {
		t.Fatalf("csv export:\n%s\nwant:\n%s", csv, wantCSV)
	}
	var rows []api.BillingRow
	if err := json.Unmarshal([]byte(g.mustDo("GET", "/v1/orgs/"+org+"/billing/export", orgKey, "", 200)), &rows); err != nil ||
		len(rows) != 2 || rows[1].GrantedUnits != 50 || rows[0].GrantedUnits != 0 {
		t.Fatalf("json export: %v %+v", err, rows)
	}

	var list api.GrantList
	_ = json.Unmarshal([]byte(g.mustDo("GET", "/v1/orgs/"+org+"/grants", orgKey, "", 200)), &list)
	if len(list.Items) != 1 || list.Items[0].Id != gr.Id || list.NextCursor != nil {
		t.Fatalf("grants: %+v", list)
	}
	g.mustDo("DELETE", "/v1/orgs/"+org+"/grants/"+gr.Id, operatorToken, "", 204)
	list = api.GrantList{}
	_ = json.Unmarshal([]byte(g.mustDo("GET", "/v1/orgs/"+org+"/grants", orgKey, "", 200)), &list)
	if len(list.Items) != 1 || list.Items[0].Active || list.Items[0].RevokedAt == nil {
		t.Fatalf("revoked grant: %+v", list.Items)
	}
	// Revoked, the units it let through still count in the period's export.
	if _, err := g.flusher.FlushOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if csv := g.mustDo("GET", "/v1/orgs/"+org+"/billing/export?format=csv", orgKey, "", 200); !strings.HasSuffix(csv, ",,,requests,150,10,140,70,EUR,50,,,,0\n") {
		t.Fatalf("export after the revocation:\n%s", csv)
	}
	var after api.Usage // not u: decoding into it would keep its granted
	_ = json.Unmarshal([]byte(g.mustDo("GET", "/v1/orgs/"+org+"/usage", orgKey, "", 200)), &after)
	if w := after.Metrics[0].Org.Limits[0]; w.Limit != 100 || w.Granted != nil {
		t.Fatalf("org month window after the revocation = %+v, want limit 100, none granted", w)
	}

	type row struct {
		Actor, Action, Object string
		Before, After         map[string]any
	}
	var audits []row
	rs, err := g.f.pool.Query(context.Background(), `SELECT actor, action, object, before, after FROM audit_log
		WHERE org_id = $1 AND action LIKE 'grant.%' ORDER BY id`, org)
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var r row
		if err := rs.Scan(&r.Actor, &r.Action, &r.Object, &r.Before, &r.After); err != nil {
			t.Fatal(err)
		}
		audits = append(audits, r)
	}
	if len(audits) != 2 || audits[0].Action != "grant.create" || audits[0].Before != nil || audits[0].After["reason"] != "launch week" ||
		audits[0].Actor != "operator" || audits[0].Object != "grant:"+gr.Id ||
		audits[1].Action != "grant.revoke" || audits[1].Before["revoked_at"] != nil || audits[1].After["revoked_at"] == nil {
		t.Fatalf("audit rows: %+v", audits)
	}
}

// A grant lifts at its until with no admin action, although the org stays cached
// (an hour's TTL, no invalidation): 120 units fit under 100 + 50; past until, the
// next unit is denied.
func TestGrantLiftsAtUntil(t *testing.T) {
	g := newGrantReplica(t)
	org := testenv.ID(t, "lift")
	checkKey, _ := g.org(org)
	until := g.clock.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)
	g.mustDo("POST", "/v1/orgs/"+org+"/grants", operatorToken, `{"metric":"requests","units":50,"reason":"trial","until":"`+until+`"}`, 201)
	if code := g.spend(checkKey, org, 120); code != 200 {
		t.Fatalf("120 units under 100 + 50 granted: %d", code)
	}
	if code := g.spend(checkKey, org, 1); code != 200 {
		t.Fatalf("the 121st unit under 150: %d", code)
	}
	g.clock.Add(time.Hour)
	if code := g.spend(checkKey, org, 1); code != 429 {
		t.Fatalf("the 122nd unit once the grant lapsed: %d, want 429", code)
	}
	var list api.GrantList
	_ = json.Unmarshal([]byte(g.mustDo("GET", "/v1/orgs/"+org+"/grants", operatorToken, "", 200)), &list)
	if len(list.Items) != 1 || list.Items[0].Active {
		t.Fatalf("lapsed grant: %+v", list.Items)
	}
}

// Bad input is refused in the API's terms and writes nothing; a metric the org does
// not know, or knows without a month limit, is a 422 naming the metric.
func TestGrantRefusals(t *testing.T) {
	g := newGrantReplica(t)
	org := testenv.ID(t, "bad")
	_, orgKey := g.org(org)
	past := g.clock.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	far := g.clock.Now().Add(400 * 24 * time.Hour).UTC().Format(time.RFC3339)
	for _, tc := range []struct {
		name, token, body string
		want              int
		field, message    string
	}{
		{"zero units", operatorToken, `{"metric":"requests","units":0,"reason":"x"}`, 400, "units", ""},
		{"units not a number", operatorToken, `{"metric":"requests","units":"5","reason":"x"}`, 400, "units", ""},
		{"no reason", operatorToken, `{"metric":"requests","units":5}`, 400, "reason", ""},
		{"blank reason", operatorToken, `{"metric":"requests","units":5,"reason":"   "}`, 400, "reason", "must say why, in 1 to 500 characters"},
		{"until in the past", operatorToken, `{"metric":"requests","units":5,"reason":"x","until":"` + past + `"}`, 400, "until", "must be in the future"},
		{"until beyond a year", operatorToken, `{"metric":"requests","units":5,"reason":"x","until":"` + far + `"}`, 400, "until", "must be within a year"},
		{"until not a time", operatorToken, `{"metric":"requests","units":5,"reason":"x","until":"next week"}`, 400, "until", ""},
		{"bad metric id", operatorToken, `{"metric":"-x","units":5,"reason":"x"}`, 400, "metric", ""},
		{"unknown field", operatorToken, `{"metric":"requests","units":5,"reason":"x","org":"other"}`, 400, "org", ""},
		{"unknown metric", operatorToken, `{"metric":"nope","units":5,"reason":"x"}`, 422, "metric", ""},
		{"metric without a month limit", operatorToken, `{"metric":"tokens","units":5,"reason":"x"}`, 422, "metric",
			`org "` + org + `" has no month limit of "tokens" to raise: a grant adds to a month limit`},
		{"org key", orgKey, `{"metric":"requests","units":5,"reason":"x"}`, 403, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := g.f.fingerprint()
			rec := g.f.do("POST", "/v1/orgs/"+org+"/grants", tc.token, tc.body)
			p := problemOf(t, rec.Body.String())
			if rec.Code != tc.want || p.Status != tc.want {
				t.Fatalf("%d %s, want %d", rec.Code, rec.Body, tc.want)
			}
			if strings.Contains(rec.Body.String(), "int64") || strings.Contains(rec.Body.String(), "time.Time") ||
				strings.Contains(rec.Body.String(), "api.") {
				t.Errorf("a Go type in the problem: %s", rec.Body)
			}
			if tc.field != "" {
				found := false
				for _, e := range p.Errors {
					if e.Field == tc.field && (tc.message == "" || e.Message == tc.message) {
						found = true
					}
				}
				if !found {
					t.Errorf("errors do not name %q (%q): %s", tc.field, tc.message, rec.Body)
				}
			}
			if g.f.fingerprint() != before {
				t.Error("the refused request changed the database")
			}
		})
	}
}

// A grant made, and revoked, through one replica's API is enforced by another
// replica within a second (Redis pub/sub), though its cache has an hour's TTL.
func TestGrantReachesSecondReplica(t *testing.T) {
	dbURL := testenv.PostgresURL(t)
	prefix := testenv.ID(t, "h")
	a, b := newReplica(t, dbURL, prefix), newReplica(t, dbURL, prefix)
	key, _ := a.setup("acme")
	body := `{"org":"acme","team":"eng","cost":0}`
	orgLimit := func() int64 {
		for _, l := range b.check(key, body).body.Levels {
			if l.Level == "org" && l.Window == "month" {
				return l.Limit
			}
		}
		return -1
	}
	if got := orgLimit(); got != 1000 {
		t.Fatalf("replica b before: org month limit %d", got)
	}
	waitFor := func(want int64) {
		t.Helper()
		start := time.Now()
		for {
			got := orgLimit()
			if got == want {
				t.Logf("replica b enforced %d after %v", want, time.Since(start))
				return
			}
			if time.Since(start) > time.Second {
				t.Fatalf("replica b still enforces %d after 1s, want %d", got, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	var g api.Grant
	_ = json.Unmarshal([]byte(a.mustDo("POST", "/v1/orgs/acme/grants", operatorToken, `{"metric":"requests","units":500,"reason":"launch"}`, 201)), &g)
	waitFor(1500)
	a.mustDo("DELETE", "/v1/orgs/acme/grants/"+g.Id, operatorToken, "", 204)
	waitFor(1000)
}
