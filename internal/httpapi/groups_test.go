package httpapi_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
)

// Every operation of the spec is routed, and nothing else under /v1 is.
func TestEveryOperationIsRouted(t *testing.T) {
	f := mustFixture(t)
	routed := map[string]bool{}
	err := chi.Walk(f.h.(chi.Routes), func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		if !strings.HasPrefix(route, "/console") {
			routed[method+" "+route] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range specOps(t) {
		key := o.method + " " + o.path
		if !routed[key] {
			t.Errorf("%s (%s) is in the spec but not routed", key, o.id)
		}
		delete(routed, key)
	}
	for key := range routed {
		t.Errorf("%s is routed but not in the spec", key)
	}
}

// A 405 names the methods the path has in Allow; a path no route has is a 404
// whatever the credentials.
func TestMethodNotAllowedCarriesAllow(t *testing.T) {
	f := mustFixture(t)
	cases := []struct {
		method, path string
		allow        []string
	}{
		{"GET", "/v1/check", []string{"POST"}},
		{"PUT", "/v1/plans", []string{"GET", "POST"}},
		{"POST", "/v1/orgs/acme/teams/eng", []string{"DELETE", "GET", "PATCH"}},
		{"POST", "/healthz", []string{"GET"}},
	}
	for _, tc := range cases {
		rec := f.do(tc.method, tc.path, f.tokens["operator"], "")
		got := strings.Split(strings.ReplaceAll(rec.Header().Get("Allow"), " ", ""), ",")
		slices.Sort(got)
		if rec.Code != 405 || !slices.Equal(got, tc.allow) {
			t.Errorf("%s %s = %d Allow %q, want 405 Allow %v: %s", tc.method, tc.path, rec.Code, rec.Header().Get("Allow"), tc.allow, rec.Body)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("%s %s: Content-Type %q", tc.method, tc.path, ct)
		}
	}
	if rec := f.do("GET", "/v1/nowhere", "", ""); rec.Code != 404 {
		t.Errorf("GET /v1/nowhere without credentials = %d, want 404", rec.Code)
	}
}
