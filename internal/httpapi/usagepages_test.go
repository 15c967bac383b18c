package httpapi_test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// scriptsSent reads how many scripts the engines of reg have sent to Redis (the sum
// of their pipelines' sizes: the checks, cost-0 reads and batches an engine runs).
func scriptsSent(t *testing.T, reg *prometheus.Registry) int64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, mf := range mfs {
		if mf.GetName() == "quotaplane_redis_pipeline_size" {
			for _, m := range mf.GetMetric() {
				n += int64(m.GetHistogram().GetSampleSum())
			}
		}
	}
	return n
}

// GET /v1/orgs/{org}/usage answers users a page at a time (limit, cursor,
// next_cursor), the org and its teams on every page, and reads the sliding windows of
// the page's users only: a page of 2 of 250 users costs a few script runs, not one per
// user.
func TestUsagePagesOverUsers(t *testing.T) {
	b := newBillingReplica(t)
	org := testenv.ID(t, "acme")
	b.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p-`+org+`","name":"P","fail_mode":"closed",
		"limits":[{"metric":"requests","window":"month","limit":100000}]}`, 201)
	b.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"`+org+`","name":"O","plan":"p-`+org+`"}`, 201)
	b.mustDo("POST", "/v1/orgs/"+org+"/teams", operatorToken, `{"id":"eng","name":"Eng",
		"user_limits":[{"metric":"requests","window":"minute","limit":50}]}`, 201)
	checkKey, billingKey := b.key(org, `["check"]`), b.key(org, `["billing"]`)
	const users = 250
	for start := 0; start < users; start += 100 {
		var checks []string
		for i := start; i < min(start+100, users); i++ {
			checks = append(checks, fmt.Sprintf(`{"org":"%s","team":"eng","user":"u%03d"}`, org, i))
		}
		b.mustDo("POST", "/v1/check/batch", checkKey, `{"checks":[`+join(checks)+`]}`, 200)
	}
	get := func(query string) api.Usage {
		t.Helper()
		var u api.Usage
		if err := json.Unmarshal([]byte(b.mustDo("GET", "/v1/orgs/"+org+"/usage"+query, billingKey, "", 200)), &u); err != nil || len(u.Metrics) != 1 {
			t.Fatalf("usage%s: %+v, %v", query, u, err)
		}
		return u
	}

	// default pages of 100, in order, each with the org's total
	var seen []string
	cursor := ""
	for pages := 0; ; pages++ {
		q := ""
		if cursor != "" {
			q = "?cursor=" + url.QueryEscape(cursor)
		}
		u := get(q)
		m := u.Metrics[0]
		if m.Org.Used != users || len(m.Teams) != 1 {
			t.Errorf("page %d: org used %d, %d teams; want %d and 1", pages, m.Org.Used, len(m.Teams), users)
		}
		for _, us := range m.Users {
			seen = append(seen, us.Id)
			if len(us.Limits) != 1 || us.Limits[0].Window != "minute" {
				t.Errorf("user %s: limits %+v, want its minute window", us.Id, us.Limits)
			}
		}
		if len(m.Users) > 100 {
			t.Fatalf("page %d has %d users, want at most 100 by default", pages, len(m.Users))
		}
		if u.NextCursor == nil {
			break
		}
		cursor = *u.NextCursor
		if pages > 5 {
			t.Fatal("more pages than users")
		}
	}
	if len(seen) != users {
		t.Fatalf("%d users over the pages, want %d", len(seen), users)
	}
	for i, id := range seen {
		if want := fmt.Sprintf("u%03d", i); id != want {
			t.Fatalf("user %d of the pages is %s, want %s (ordered, each once)", i, id, want)
		}
	}

	// a small page costs a few script runs, not one per user: the scripts this replica's
	// engines sent (their pipelines' sizes), not Redis's command stats, which count
	// every client of the shared Redis (under make test, other packages' tests: CI once
	// saw 164 here)
	before := scriptsSent(t, b.reg)
	u := get("?limit=2")
	runs := scriptsSent(t, b.reg) - before
	if len(u.Metrics[0].Users) != 2 || u.NextCursor == nil {
		t.Errorf("limit=2: %d users, next %v", len(u.Metrics[0].Users), u.NextCursor)
	}
	t.Logf("a page of 2 of %d users: %d scripts", users, runs)
	if runs == 0 {
		t.Error("the page counted no scripts: it reads the windows of its users, so the count is broken")
	}
	if runs > 50 {
		t.Errorf("a page of 2 users ran %d scripts; want a few (not one per user of %d)", runs, users)
	}

	for _, bad := range []string{"?limit=0", "?limit=1001", "?cursor=bm90LWEtY3Vyc29y"} {
		if rec := b.f.do("GET", "/v1/orgs/"+org+"/usage"+bad, billingKey, ""); rec.Code != 400 {
			t.Errorf("usage%s = %d %s, want 400", bad, rec.Code, rec.Body)
		}
	}
}
