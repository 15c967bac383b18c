package httpapi_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
)

// A limit's burst goes in and comes out of every route that takes or returns limits:
// plans, org overrides and effective limits, teams' limits and user defaults, users.
func TestBurstRoundTripsOverHTTP(t *testing.T) {
	f := mustFixture(t)
	op := operatorToken
	want := `{"burst":30,"limit":10,"metric":"requests","window":"second"}`
	has := func(what, body, frag string) {
		t.Helper()
		if !strings.Contains(body, frag) {
			t.Errorf("%s: %s lacks %s", what, body, frag)
		}
	}
	ok := func(method, path, body string, code int) string {
		t.Helper()
		rec := f.do(method, path, op, body)
		if rec.Code != code {
			t.Fatalf("%s %s = %d, want %d: %s", method, path, rec.Code, code, rec.Body)
		}
		return rec.Body.String()
	}
	has("plan create", ok("POST", "/v1/plans", `{"id":"burst","name":"B","fail_mode":"open","limits":[`+want+`,{"metric":"requests","window":"month","limit":1000}]}`, 201), want)
	has("plan get", ok("GET", "/v1/plans/burst", "", 200), want)
	has("plan patch", ok("PATCH", "/v1/plans/pro", `{"limits":[`+want+`,{"metric":"requests","window":"month","limit":1000}]}`, 200), want)
	// acme's effective limits carry the plan's bucket; an override's bucket is its own.
	has("org effective", ok("GET", "/v1/orgs/acme", "", 200), `"effective_limits":[`+want)
	override := `{"burst":2000,"limit":500,"metric":"tokens","window":"hour"}`
	has("org override", ok("PATCH", "/v1/orgs/acme", `{"limits":[`+override+`]}`, 200), `"limits":[`+override+`]`)
	team := `{"burst":20,"limit":8,"metric":"requests","window":"second"}`
	defaults := `{"burst":5,"limit":2,"metric":"requests","window":"second"}`
	body := ok("POST", "/v1/orgs/acme/teams", `{"id":"bk","name":"Bk","limits":[`+team+`],"user_limits":[`+defaults+`]}`, 201)
	has("team create", body, `"limits":[`+team+`]`)
	has("team create", body, `"user_limits":[`+defaults+`]`)
	has("team get", ok("GET", "/v1/orgs/acme/teams/bk", "", 200), `"user_limits":[`+defaults+`]`)
	user := `{"burst":10,"limit":4,"metric":"requests","window":"second"}`
	has("user create", ok("POST", "/v1/orgs/acme/teams/bk/users", `{"id":"ada","limits":[`+user+`]}`, 201), user)
	has("user get", ok("GET", "/v1/orgs/acme/teams/bk/users/ada", "", 200), user)
	// A sliding limit carries no burst on the wire.
	if b := ok("GET", "/v1/plans/free", "", 200); strings.Contains(b, "burst") {
		t.Errorf("a plan without buckets shows a burst: %s", b)
	}
}

// A burst on a month or concurrent window, or below 1, is a 400 naming the field; a
// child's bucket above its parent's burst, or a parent lowering its burst below a
// child's, is a 422 naming the child's field and the parent's burst.
func TestBurstRefusedOverHTTP(t *testing.T) {
	f := mustFixture(t)
	op := operatorToken
	for _, tc := range []struct{ name, path, method, body, field, detail string }{
		{"month", "/v1/plans", "POST", `{"id":"x","name":"X","fail_mode":"open","limits":[{"metric":"requests","window":"month","limit":5,"burst":9}]}`,
			"limits[0].burst", "applies only to second, minute, hour and day windows"},
		{"concurrent", "/v1/orgs/acme", "PATCH", `{"limits":[{"metric":"requests","window":"minute","limit":5},{"metric":"requests","window":"concurrent","limit":5,"burst":9}]}`,
			"limits[1].burst", "applies only to second, minute, hour and day windows"},
		{"zero", "/v1/orgs/acme/teams", "POST", `{"id":"z","name":"Z","user_limits":[{"metric":"requests","window":"second","limit":5,"burst":0}]}`,
			"user_limits[0].burst", ""},
		{"above bound", "/v1/orgs/acme/teams/eng/users", "POST", `{"id":"z","limits":[{"metric":"requests","window":"second","limit":5,"burst":1125899906842625}]}`,
			"limits[0].burst", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantBadRequest(t, f.do(tc.method, tc.path, op, tc.body), tc.field, tc.detail)
		})
	}
	if rec := f.do("GET", "/v1/plans/x", op, ""); rec.Code != 404 {
		t.Errorf("a refused plan was written: %d", rec.Code)
	}

	if rec := f.do("PATCH", "/v1/plans/pro", op, `{"limits":[{"metric":"requests","window":"second","limit":10,"burst":30},{"metric":"requests","window":"month","limit":1000}]}`); rec.Code != 200 {
		t.Fatalf("plan patch = %d %s", rec.Code, rec.Body)
	}
	for _, tc := range []struct{ name, method, path, body, field, detail string }{
		{"team above org", "POST", "/v1/orgs/acme/teams", `{"id":"big","name":"Big","limits":[{"metric":"requests","window":"second","limit":10,"burst":31}]}`,
			"limits[0].burst", `team "big": requests/second burst 31 is above org "acme"'s burst 30`},
	} {
		rec := f.do(tc.method, tc.path, op, tc.body)
		var p api.Problem
		_ = json.Unmarshal(rec.Body.Bytes(), &p)
		if rec.Code != 422 || len(p.Errors) != 1 || p.Errors[0].Field != tc.field || !strings.Contains(p.Errors[0].Message, tc.detail) {
			t.Errorf("%s: %d %s, want a 422 naming %s", tc.name, rec.Code, rec.Body, tc.field)
		}
	}
	if rec := f.do("POST", "/v1/orgs/acme/teams", op, `{"id":"bk","name":"Bk","limits":[{"metric":"requests","window":"second","limit":10,"burst":30}]}`); rec.Code != 201 {
		t.Fatalf("team create = %d %s", rec.Code, rec.Body)
	}
	rec := f.do("PATCH", "/v1/orgs/acme", op, `{"limits":[{"metric":"requests","window":"second","limit":10,"burst":29}]}`)
	var p api.Problem
	_ = json.Unmarshal(rec.Body.Bytes(), &p)
	if rec.Code != 422 || len(p.Errors) != 1 || p.Errors[0].Field != "limits[0].burst" ||
		!strings.Contains(p.Errors[0].Message, `burst 29 is below the burst 30 that team "bk" holds`) {
		t.Errorf("org lowering its burst below a team's: %d %s", rec.Code, rec.Body)
	}
}
