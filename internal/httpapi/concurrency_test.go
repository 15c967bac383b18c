package httpapi_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
)

// inFlightOf finds level id's in_flight of metric in a usage answer (-1: absent).
func inFlightOf(u api.Usage, metric, level, id string) int64 {
	for _, m := range u.Metrics {
		if m.Metric != metric {
			continue
		}
		ls := map[string][]api.UsageLevel{"org": {m.Org}, "team": m.Teams, "user": m.Users}[level]
		for _, l := range ls {
			if l.Id == id && l.InFlight != nil {
				return *l.InFlight
			}
		}
	}
	return -1
}

// API.md "Concurrency limits": allocation rules, reservations holding slots, checks
// only testing, usage's in_flight, extend, and a release that frees the slot at once.
func TestConcurrencyLimitsOverHTTP(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","limits":[{"metric":"requests","window":"concurrent","limit":5},{"metric":"requests","window":"month","limit":1000}]}`, 201)
	for _, org := range []string{"acme", "other"} {
		r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"`+org+`","name":"O","plan":"p"}`, 201)
	}
	// Allocation rules: a child's concurrent limit may not exceed its parent's, 422
	// naming the field and the parent's limit, and nothing is written.
	body := r.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"eng","name":"Eng","limits":[{"metric":"requests","window":"concurrent","limit":6}]}`, 422)
	if !strings.Contains(body, "limits[0].limit") || !strings.Contains(body, "concurrent") || !strings.Contains(body, "5") {
		t.Errorf("team over the org's concurrent limit: %s", body)
	}
	r.mustDo("GET", "/v1/orgs/acme/teams/eng", operatorToken, "", 404)
	r.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"eng","name":"Eng","limits":[{"metric":"requests","window":"concurrent","limit":3}],"user_limits":[{"metric":"requests","window":"concurrent","limit":2}]}`, 201)
	body = r.mustDo("POST", "/v1/orgs/acme/teams/eng/users", operatorToken, `{"id":"bob","limits":[{"metric":"requests","window":"concurrent","limit":4}]}`, 422)
	if !strings.Contains(body, "concurrent") {
		t.Errorf("user over the team's concurrent limit: %s", body)
	}
	r.mustDo("PATCH", "/v1/orgs/acme/teams/eng", operatorToken, `{"limits":[{"metric":"requests","window":"concurrent","limit":1}]}`, 422) // below its users' 2
	key, otherKey, admin := keyOf(r.replica, "acme", `["check"]`), keyOf(r.replica, "other", `["check"]`), keyOf(r.replica, "acme", `["admin"]`)

	hold := `{"org":"acme","team":"eng","user":"alice","metric":"requests","amount":1,"ttl_seconds":60}`
	code, a, raw := r.reserve(key, hold)
	if code != 201 {
		t.Fatalf("reserve = %d %s", code, raw)
	}
	if code, _, raw = r.reserve(key, hold); code != 201 {
		t.Fatalf("reserve = %d %s", code, raw)
	}
	// The user's 2 slots are taken: the third is refused at user/concurrent, holding nothing.
	if code, _, raw = r.reserve(key, hold); code != 429 || !strings.Contains(raw, `"blocked_at":{"id":"alice","level":"user","window":"concurrent"}`) {
		t.Fatalf("third slot = %d %s, want 429 at user/concurrent", code, raw)
	}
	// Checks test held + cost and hold nothing.
	if got := r.check(key, `{"org":"acme","team":"eng","user":"alice","metric":"requests","cost":1}`); got.code != 429 {
		t.Errorf("check over the held slots = %d %s", got.code, got.raw)
	}
	got := r.check(key, `{"org":"acme","team":"eng","user":"carol","metric":"requests","cost":1}`)
	if got.code != 200 || !strings.Contains(got.raw, `"id":"eng","level":"team","limit":3,"remaining":1,`) {
		t.Errorf("check of another user = %d %s, want allowed with the team's 2 in flight", got.code, got.raw)
	}
	u := r.usage(t, "acme", admin)
	for _, lv := range [][2]string{{"org", "acme"}, {"team", "eng"}, {"user", "alice"}} {
		if n := inFlightOf(u, "requests", lv[0], lv[1]); n != 2 {
			t.Errorf("usage in_flight of %s %s = %d, want 2 (checks hold nothing)", lv[0], lv[1], n)
		}
	}
	if n := inFlightOf(u, "requests", "user", "carol"); n != 0 {
		t.Errorf("usage in_flight of carol = %d, want 0", n)
	}

	// Extend: the new expires_at; bad ttl 400; another org's 404.
	path := "/v1/reservations/" + a.Id
	var ext api.Reservation
	_ = json.Unmarshal([]byte(r.mustDo("POST", path+"/extend", key, `{"ttl_seconds":600}`, 200)), &ext)
	if d := time.Until(ext.ExpiresAt); ext.State != "held" || d < 590*time.Second || d > 610*time.Second {
		t.Errorf("extend = %+v, want held, expiring 600 s ahead", ext)
	}
	for _, b := range []string{`{"ttl_seconds":0}`, `{"ttl_seconds":3601}`, `{}`, `{"ttl_seconds":5,"x":1}`} {
		if rec := r.f.do("POST", path+"/extend", key, b); rec.Code != 400 {
			t.Errorf("extend %s = %d %s, want 400", b, rec.Code, rec.Body)
		}
	}
	if rec := r.f.do("POST", path+"/extend", otherKey, `{"ttl_seconds":5}`); rec.Code != 404 {
		t.Errorf("another org's extend = %d, want 404", rec.Code)
	}
	if rec := r.f.do("POST", path+"/extend", "", `{"ttl_seconds":5}`); rec.Code != 401 {
		t.Errorf("extend without a key = %d, want 401", rec.Code)
	}
	if rec := r.f.do("POST", path+"/extend", admin, `{"ttl_seconds":5}`); rec.Code != 403 {
		t.Errorf("admin key's extend = %d, want 403", rec.Code)
	}

	// A holder whose request was cancelled releases: the slot is free at once, with no
	// sweep running, and a new holder takes it.
	r.mustDo("DELETE", path, key, "", 200)
	if n := inFlightOf(r.usage(t, "acme", admin), "requests", "user", "alice"); n != 1 {
		t.Errorf("in_flight right after the release = %d, want 1", n)
	}
	if code, _, raw = r.reserve(key, hold); code != 201 {
		t.Errorf("reserve right after the release = %d %s", code, raw)
	}
	if body := r.mustDo("POST", path+"/extend", key, `{"ttl_seconds":5}`, 409); !strings.Contains(body, "released") {
		t.Errorf("extend after release: %s, want 409 naming the state", body)
	}
}

// A streaming holder heartbeating with extend keeps its slot past its ttl; one that
// does not is expired by the sweep and its slot comes back.
func TestExtendKeepsStreamingSlotOverHTTP(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","limits":[{"metric":"requests","window":"concurrent","limit":2}]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"O","plan":"p"}`, 201)
	key, admin := keyOf(r.replica, "acme", `["check"]`), keyOf(r.replica, "acme", `["admin"]`)
	r.sweep(t, 100*time.Millisecond)
	hold := `{"org":"acme","metric":"requests","amount":1,"ttl_seconds":1,"on_expiry":"release"}`
	_, stream, _ := r.reserve(key, hold)
	_, idle, _ := r.reserve(key, hold)
	for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		r.mustDo("POST", "/v1/reservations/"+stream.Id+"/extend", key, `{"ttl_seconds":1}`, 200)
	}
	if body := r.mustDo("GET", "/v1/reservations/"+stream.Id, key, "", 200); !strings.Contains(body, `"state":"held"`) {
		t.Errorf("streaming holder after 2.5 s with a 1 s ttl: %s, want held", body)
	}
	if body := r.mustDo("GET", "/v1/reservations/"+idle.Id, key, "", 200); !strings.Contains(body, `"state":"expired"`) {
		t.Errorf("holder without extend: %s, want expired", body)
	}
	if n := inFlightOf(r.usage(t, "acme", admin), "requests", "org", "acme"); n != 1 {
		t.Errorf("in_flight = %d, want the streaming slot only", n)
	}
	r.mustDo("DELETE", "/v1/reservations/"+stream.Id, key, "", 200)
}
