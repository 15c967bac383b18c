package httpapi_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	openapi_types "github.com/oapi-codegen/runtime/types"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// The shadow and warn report over HTTP: a shadow org's checks over its limits come
// back as rows per level, id and window, equal to the would_block answers the checks
// got, within about a second (the engine's flush), before any worker flush; the route
// authorizes like usage and refuses bad input with a problem.
func TestWouldBlockReportOverHTTP(t *testing.T) {
	b := newBillingReplica(t)
	org := testenv.ID(t, "shadow")
	b.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p-`+org+`","name":"P","fail_mode":"closed",
		"limits":[{"metric":"requests","window":"month","limit":10}]}`, 201)
	b.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"`+org+`","name":"O","plan":"p-`+org+`","mode":"shadow"}`, 201)
	b.mustDo("POST", "/v1/orgs/"+org+"/teams", operatorToken, `{"id":"eng","name":"Eng",
		"user_limits":[{"metric":"requests","window":"minute","limit":3}]}`, 201)
	b.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"other-`+org+`","name":"O2","plan":"p-`+org+`"}`, 201)
	checkKey, billingKey := b.key(org, `["check"]`), b.key(org, `["billing"]`)
	otherKey := b.key("other-"+org, `["admin","billing"]`)

	type ref struct{ Level, ID, Window string }
	got := map[ref]int64{} // checks per would_block answer
	units := map[ref]int64{}
	for _, c := range []struct {
		user string
		cost int64
	}{{"alice", 1}, {"alice", 1}, {"alice", 1}, {"alice", 1}, {"alice", 1}, {"bob", 20}, {"bob", 2}} {
		body := b.mustDo("POST", "/v1/check", checkKey, fmt.Sprintf(`{"org":%q,"team":"eng","user":%q,"cost":%d}`, org, c.user, c.cost), 200)
		var res api.CheckResult
		if err := json.Unmarshal([]byte(body), &res); err != nil {
			t.Fatal(err)
		}
		if res.WouldBlock != nil {
			r := ref{string(res.WouldBlock.Level), res.WouldBlock.Id, string(res.WouldBlock.Window)}
			got[r]++
			units[r] += c.cost
		}
	}
	if len(got) < 2 {
		t.Fatalf("would_block answers %v: want blocks at the user and at the org", got)
	}
	var total int64
	for _, n := range got {
		total += n
	}
	var rep api.WouldBlockReport
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := json.Unmarshal([]byte(b.mustDo("GET", "/v1/orgs/"+org+"/would-block", billingKey, "", 200)), &rep); err != nil {
			t.Fatal(err)
		}
		if rep.Checks == total || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if rep.Org != org || rep.Mode != "shadow" || rep.Capped || rep.Checks != total {
		t.Fatalf("report: %+v, want %d checks", rep, total)
	}
	today := openapi_types.Date{Time: time.Now().UTC().Truncate(24 * time.Hour)}
	gotRows := map[ref][2]int64{}
	for _, r := range rep.Rows {
		if len(r.Days) != 1 || r.Days[0].Day != today || r.Days[0].Checks != r.Checks {
			t.Errorf("row %+v: days %+v, want today only", r, r.Days)
		}
		gotRows[ref{string(r.Level), *r.Id, string(*r.Window)}] = [2]int64{r.Checks, r.Units}
	}
	wantRows := map[ref][2]int64{}
	for r, n := range got {
		wantRows[r] = [2]int64{n, units[r]}
	}
	if diff := cmp.Diff(wantRows, gotRows); diff != "" {
		t.Errorf("rows (-answers +report):\n%s", diff)
	}
	if len(rep.Days) != 1 || rep.Days[0].Checks != total {
		t.Errorf("days %+v", rep.Days)
	}

	for _, tc := range []struct {
		name, path, token string
		want              int
	}{
		{"no token", "/v1/orgs/" + org + "/would-block", "", 401},
		{"check scope only", "/v1/orgs/" + org + "/would-block", checkKey, 403},
		{"other org's key", "/v1/orgs/" + org + "/would-block", otherKey, 404},
		{"unknown org", "/v1/orgs/nope-" + org + "/would-block", operatorToken, 404},
		{"bad period", "/v1/orgs/" + org + "/would-block?period=2026-13", billingKey, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := b.f.do("GET", tc.path, tc.token, "")
			if rec.Code != tc.want {
				t.Fatalf("%s = %d, want %d: %s", tc.path, rec.Code, tc.want, rec.Body)
			}
			if rec.Header().Get("Content-Type") != "application/problem+json" {
				t.Fatalf("content type %q", rec.Header().Get("Content-Type"))
			}
		})
	}
	// A past period with nothing recorded is empty, not an error.
	var past api.WouldBlockReport
	_ = json.Unmarshal([]byte(b.mustDo("GET", "/v1/orgs/"+org+"/would-block?period=2020-01", operatorToken, "", 200)), &past)
	if past.Checks != 0 || len(past.Rows) != 0 || past.Period != "2020-01" {
		t.Errorf("past period: %+v", past)
	}
}
