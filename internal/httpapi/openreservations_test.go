package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/ledger"
)

// GET /v1/orgs/{org}/reservations lists exactly the held reservations, soonest to
// expire first, filtered by team and user, paged with a cursor, and is read like
// usage: operator, admin or billing of the org; anyone else is refused.
func TestOpenReservationsOverHTTP(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","limits":[{"metric":"tokens","window":"month","limit":100000}]}`, 201)
	for _, org := range []string{"acme", "other"} {
		r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"`+org+`","name":"O","plan":"p"}`, 201)
		for _, team := range []string{"eng", "ops"} {
			r.mustDo("POST", "/v1/orgs/"+org+"/teams", operatorToken, `{"id":"`+team+`","name":"T"}`, 201)
		}
	}
	key := keyOf(r.replica, "acme", `["check"]`)
	admin, billing := keyOf(r.replica, "acme", `["admin"]`), keyOf(r.replica, "acme", `["billing"]`)
	otherAdmin := keyOf(r.replica, "other", `["admin","billing","check"]`)

	open := func(team, user string, ttl int) api.Reservation {
		t.Helper()
		code, res, raw := r.reserve(key, `{"org":"acme","team":"`+team+`","user":"`+user+`","metric":"tokens","amount":7,"ttl_seconds":`+strconv.Itoa(ttl)+`,"on_expiry":"release"}`)
		if code != 201 {
			t.Fatalf("reserve = %d %s", code, raw)
		}
		return res
	}
	// alice's three, bob's one, made out of expiry order; one of alice's committed.
	a3 := open("eng", "alice", 3000)
	a1 := open("eng", "alice", 1000)
	done := open("eng", "alice", 1500)
	b2 := open("ops", "bob", 2000)
	r.mustDo("POST", "/v1/reservations/"+done.Id+"/commit", key, `{"used":7}`, 200)
	// Another org's reservation is never listed for acme.
	otherCheck := keyOf(r.replica, "other", `["check"]`)
	if code, _, raw := r.reserve(otherCheck, `{"org":"other","team":"eng","user":"alice","metric":"tokens","amount":7}`); code != 201 {
		t.Fatalf("other's reserve = %d %s", code, raw)
	}

	list := func(token, query string) api.ReservationList {
		t.Helper()
		var out api.ReservationList
		body := r.mustDo("GET", "/v1/orgs/acme/reservations"+query, token, "", 200)
		if err := json.Unmarshal([]byte(body), &out); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(body, `"next_cursor":`) || !strings.Contains(body, `"reservations":[`) {
			t.Errorf("%s: %s lacks reservations or next_cursor", query, body)
		}
		return out
	}
	ids := func(l api.ReservationList) []string {
		var out []string
		for _, x := range l.Reservations {
			out = append(out, x.Id)
		}
		return out
	}

	all := list(admin, "")
	if diff := cmp.Diff([]string{a1.Id, b2.Id, a3.Id}, ids(all)); diff != "" {
		t.Errorf("open reservations (-want +got):\n%s", diff)
	}
	if all.NextCursor != nil {
		t.Errorf("next_cursor = %q on the only page", *all.NextCursor)
	}
	for i, x := range all.Reservations {
		want := []api.Reservation{a1, b2, a3}[i]
		if x.State != "held" || x.Amount != 7 || x.Metric != "tokens" || x.OnExpiry != "release" || x.Org != "acme" ||
			!x.ExpiresAt.Equal(want.ExpiresAt) || x.Used != nil || x.Levels != nil || x.Team == nil || x.User == nil {
			t.Errorf("reservation %d = %+v", i, x)
		}
	}
	if x := all.Reservations[1]; *x.Team != "ops" || *x.User != "bob" {
		t.Errorf("bob's = team %q user %q", *x.Team, *x.User)
	}
	if got := ids(list(operatorToken, "")); len(got) != 3 {
		t.Errorf("the operator sees %d, want 3", len(got))
	}
	if got := ids(list(billing, "")); len(got) != 3 {
		t.Errorf("a billing key sees %d, want 3", len(got))
	}

	filters := map[string][]string{
		"?team=eng":            {a1.Id, a3.Id},
		"?team=ops":            {b2.Id},
		"?user=alice":          {a1.Id, a3.Id},
		"?user=bob":            {b2.Id},
		"?team=eng&user=alice": {a1.Id, a3.Id},
		"?team=eng&user=bob":   nil,
		"?user=carol":          nil,
	}
	for q, want := range filters {
		if diff := cmp.Diff(want, ids(list(admin, q))); diff != "" {
			t.Errorf("%s (-want +got):\n%s", q, diff)
		}
	}

	// limit=1 pages through all three, then stops.
	var paged []string
	q := "?limit=1"
	for pages := 0; ; pages++ {
		l := list(admin, q)
		if len(l.Reservations) != 1 {
			t.Fatalf("page %d has %d reservations, want 1", pages, len(l.Reservations))
		}
		paged = append(paged, ids(l)...)
		if l.NextCursor == nil {
			break
		}
		if pages > 3 {
			t.Fatalf("no last page after %d", pages)
		}
		q = "?limit=1&cursor=" + url.QueryEscape(*l.NextCursor)
	}
	if diff := cmp.Diff([]string{a1.Id, b2.Id, a3.Id}, paged); diff != "" {
		t.Errorf("paged (-want +got):\n%s", diff)
	}
	// A filtered page's cursor goes on with the filter.
	first := list(admin, "?team=eng&limit=1")
	if first.NextCursor == nil {
		t.Fatal("team eng's first page of 1 has no next_cursor")
	}
	if diff := cmp.Diff([]string{a3.Id}, ids(list(admin, "?team=eng&limit=1&cursor="+url.QueryEscape(*first.NextCursor)))); diff != "" {
		t.Errorf("team eng's second page (-want +got):\n%s", diff)
	}

	refusals := []struct {
		name, query, token string
		code               int
		field              string
	}{
		{"bad cursor", "?cursor=%ff", admin, 400, "cursor"},
		{"cursor not ours", "?cursor=" + url.QueryEscape("MTIzNDU"), admin, 400, "cursor"}, // "12345"
		{"limit 0", "?limit=0", admin, 400, "limit"},
		{"limit 101", "?limit=101", admin, 400, "limit"},
		{"limit not a number", "?limit=ten", admin, 400, "limit"},
		{"bad team", "?team=" + url.QueryEscape("a b"), admin, 400, "team"},
		{"no token", "", "", 401, ""},
		{"check key", "", key, 403, ""},
		{"another org's key", "", otherAdmin, 404, ""},
	}
	for _, tc := range refusals {
		rec := r.f.do("GET", "/v1/orgs/acme/reservations"+tc.query, tc.token, "")
		var p api.Problem
		if rec.Code != tc.code || json.Unmarshal(rec.Body.Bytes(), &p) != nil || p.Status != tc.code ||
			rec.Header().Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: %d %s, want a %d problem", tc.name, rec.Code, rec.Body, tc.code)
			continue
		}
		if tc.field != "" && (len(p.Errors) != 1 || p.Errors[0].Field != tc.field) {
			t.Errorf("%s: %s, want one field error naming %s", tc.name, rec.Body, tc.field)
		}
		if strings.Contains(rec.Body.String(), "quota.") || strings.Contains(rec.Body.String(), "strconv") {
			t.Errorf("%s: the problem names Go internals: %s", tc.name, rec.Body)
		}
	}
	if rec := r.f.do("GET", "/v1/orgs/nope/reservations", operatorToken, ""); rec.Code != 404 {
		t.Errorf("unknown org for the operator: %d %s, want 404", rec.Code, rec.Body)
	}

	// Released, a reservation leaves the list.
	r.mustDo("DELETE", "/v1/reservations/"+b2.Id, key, "", 200)
	if diff := cmp.Diff([]string{a1.Id, a3.Id}, ids(list(admin, ""))); diff != "" {
		t.Errorf("after bob's release (-want +got):\n%s", diff)
	}
}

// Redis restarted empty: the listing is the first request after the loss and hydrates,
// as a read of one reservation does, so the reservations held at the last flush are
// listed again, in expiry order.
func TestOpenReservationsAfterRedisRestart(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","limits":[{"metric":"tokens","window":"month","limit":1000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"O","plan":"p"}`, 201)
	key, admin := keyOf(r.replica, "acme", `["check"]`), keyOf(r.replica, "acme", `["admin"]`)
	var ids []string
	for _, ttl := range []int{600, 300} {
		code, res, raw := r.reserve(key, `{"org":"acme","metric":"tokens","amount":5,"ttl_seconds":`+strconv.Itoa(ttl)+`}`)
		if code != 201 {
			t.Fatalf("reserve = %d %s", code, raw)
		}
		ids = append(ids, res.Id)
	}
	quiet := slog.New(slog.NewJSONHandler(io.Discard, nil))
	flusher := ledger.NewFlusher(ledger.FlusherConfig{Store: r.store.Ledger(), Tenants: r.f.svc, Counters: ledger.EngineCounters(r.router), Logger: quiet})
	if _, err := flusher.FlushOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	wipePrefix(t, r)

	var l api.ReservationList
	if err := json.Unmarshal([]byte(r.mustDo("GET", "/v1/orgs/acme/reservations", admin, "", 200)), &l); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, x := range l.Reservations {
		got = append(got, x.Id)
	}
	if diff := cmp.Diff([]string{ids[1], ids[0]}, got); diff != "" {
		t.Errorf("listed after the restart (-want +got):\n%s", diff)
	}
}
