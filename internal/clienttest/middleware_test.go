package clienttest

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/dunglas/httpsfv"

	"github.com/go-chi/chi/v5"

	"github.com/quotaplane/quotaplane/client"
	"github.com/quotaplane/quotaplane/client/middleware"
)

// get sends GET url with X-User user and returns the answer, its body read.
func get(t *testing.T, url, user string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if user != "" {
		req.Header.Set("X-User", user)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

// The check middleware in front of the standard mux and of chi: allowed requests reach
// the handler with RateLimit-*; the denied one is answered 429 with Retry-After,
// RateLimit-* and a problem document, and never reaches it.
func TestMiddlewareCheck(t *testing.T) {
	e := newEnv(t, "")
	c := e.client()
	byUser := func(r *http.Request) (client.CheckRequest, error) {
		if r.URL.Path == "/healthz" {
			return client.CheckRequest{}, middleware.ErrSkip
		}
		u := r.Header.Get("X-User")
		if u == "" {
			return client.CheckRequest{}, errors.New("no X-User header")
		}
		return client.CheckRequest{Org: e.org, Team: "eng", User: u}, nil
	}
	var served atomic.Int32
	hello := func(w http.ResponseWriter, r *http.Request) { served.Add(1); io.WriteString(w, "hello\n") }

	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", hello)
	mux.HandleFunc("GET /healthz", hello)
	r := chi.NewRouter()
	r.Use(middleware.Check(c, byUser))
	r.Get("/hello", hello)
	for _, srv := range []struct {
		name string
		h    http.Handler
		user string
	}{{"ServeMux", middleware.Check(c, byUser)(mux), "alice"}, {"chi", r, "bob"}} {
		t.Run(srv.name, func(t *testing.T) {
			ts := httptest.NewServer(srv.h)
			defer ts.Close()
			served.Store(0)
			for i := 1; i <= 3; i++ {
				res, body := get(t, ts.URL+"/hello", srv.user)
				if res.StatusCode != 200 || body != "hello\n" || res.Header.Get("RateLimit-Limit") != "3" ||
					res.Header.Get("RateLimit-Remaining") != strconv.Itoa(3-i) || res.Header.Get("RateLimit-Reset") == "" {
					t.Fatalf("request %d: %d %q, headers %v", i, res.StatusCode, body, res.Header)
				}
				policiesPassedOn(t, res.Header)
			}
			res, body := get(t, ts.URL+"/hello", srv.user)
			var p struct {
				Type              string          `json:"type"`
				Title             string          `json:"title"`
				Status            int             `json:"status"`
				Detail            string          `json:"detail"`
				RetryAfterSeconds int64           `json:"retry_after_seconds"`
				BlockedAt         client.LevelRef `json:"blocked_at"`
			}
			if err := json.Unmarshal([]byte(body), &p); err != nil {
				t.Fatalf("429 body %q: %v", body, err)
			}
			retry, _ := strconv.ParseInt(res.Header.Get("Retry-After"), 10, 64)
			if res.StatusCode != 429 || res.Header.Get("Content-Type") != "application/problem+json" || retry < 1 ||
				res.Header.Get("RateLimit-Limit") != "3" || res.Header.Get("RateLimit-Remaining") != "0" ||
				res.Header.Get("RateLimit-Reset") != res.Header.Get("Retry-After") {
				t.Errorf("denied: %d, headers %v", res.StatusCode, res.Header)
			}
			policiesPassedOn(t, res.Header)
			// blocked_at names the metric on a server with multi-metric checks.
			want := client.LevelRef{Level: "user", ID: srv.user, Metric: p.BlockedAt.Metric, Window: "minute"}
			if p.BlockedAt.Metric != "" && p.BlockedAt.Metric != "requests" {
				t.Errorf("blocked_at names metric %q", p.BlockedAt.Metric)
			}
			if p.Type != "https://quotaplane.dev/problems/too-many-requests" || p.Title != "Too Many Requests" || p.Status != 429 ||
				p.RetryAfterSeconds != retry || p.BlockedAt != want || !strings.Contains(p.Detail, `user "`+srv.user+`"`) {
				t.Errorf("denied body: %s", body)
			}
			if served.Load() != 3 {
				t.Errorf("the handler served %d requests, want 3", served.Load())
			}
			res, body = get(t, ts.URL+"/hello", "")
			if res.StatusCode != 400 || res.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(body, "no X-User header") {
				t.Errorf("unmapped request: %d %s", res.StatusCode, body)
			}
		})
	}
	// A skipped path is not checked.
	ts := httptest.NewServer(middleware.Check(c, byUser)(mux))
	defer ts.Close()
	if res, _ := get(t, ts.URL+"/healthz", ""); res.StatusCode != 200 || res.Header.Get("RateLimit-Limit") != "" {
		t.Errorf("skipped path: %d %v", res.StatusCode, res.Header)
	}

	// Quotaplane down under FailClosed: 503, not 429; under FailOpen: served, no headers.
	ln := httptest.NewServer(http.NotFoundHandler())
	dead := ln.URL
	ln.Close()
	for _, tc := range []struct {
		policy client.FailPolicy
		want   int
	}{{client.FailClosed, 503}, {client.FailOpen, 200}} {
		down, _ := client.New(dead, e.key, client.WithRetries(0), client.WithFailPolicy(tc.policy))
		ts := httptest.NewServer(middleware.Check(down, byUser)(mux))
		res, body := get(t, ts.URL+"/hello", "carol")
		ts.Close()
		if res.StatusCode != tc.want || res.Header.Get("RateLimit-Limit") != "" || (tc.want == 503 && !strings.Contains(body, `"status":503`)) {
			t.Errorf("Quotaplane down, want %d: %d %s", tc.want, res.StatusCode, body)
		}
	}
}

// policiesPassedOn: the middleware passes Quotaplane's draft-11 RateLimit-Policy on,
// beside RateLimit and the legacy fields, read with httpsfv: the user's 3 a minute is
// among the policies, and RateLimit names one of them.
func policiesPassedOn(t *testing.T, h http.Header) {
	t.Helper()
	policies, err := httpsfv.UnmarshalList(h.Values("RateLimit-Policy"))
	if err != nil || len(policies) == 0 {
		t.Fatalf("RateLimit-Policy %q: %v", h.Values("RateLimit-Policy"), err)
	}
	names := map[string]bool{}
	for _, m := range policies {
		it := m.(httpsfv.Item)
		name, _ := it.Value.(string)
		names[name] = true
		if name == "user-minute" {
			q, _ := it.Params.Get("q")
			w, _ := it.Params.Get("w")
			if q != int64(3) || w != int64(60) {
				t.Errorf("user-minute: q=%v w=%v, want 3 and 60", q, w)
			}
		}
	}
	if !names["user-minute"] {
		t.Errorf("RateLimit-Policy %q has no user-minute", h.Values("RateLimit-Policy"))
	}
	limit, err := httpsfv.UnmarshalList(h.Values("RateLimit"))
	if err != nil || len(limit) != 1 {
		t.Fatalf("RateLimit %q: %v", h.Values("RateLimit"), err)
	}
	if name, _ := limit[0].(httpsfv.Item).Value.(string); !names[name] {
		t.Errorf("RateLimit names %q, not one of the policies %v", name, names)
	}
}
