package httpapi_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/httpapi"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
)

// On a 429 of a sliding window, RateLimit-Reset and Retry-After agree on when a
// retry can succeed, and RateLimit-* describe the window that refused the check.
func TestDeniedCheckHeadersAgree(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	key, _ := r.setup("acme") // 20 requests a minute, 1000 a month
	body := `{"org":"acme","team":"eng","user":"alice"}`
	for i := range 20 {
		if c := r.check(key, body); c.code != 200 {
			t.Fatalf("check %d = %d %s", i+1, c.code, c.raw)
		}
	}
	c := r.check(key, body)
	if c.code != 429 || c.body.BlockedAt == nil || c.body.BlockedAt.Window != "minute" {
		t.Fatalf("21st check = %d %s, want 429 blocked at the minute window", c.code, c.raw)
	}
	reset, retry := rawHeader(c.header, "RateLimit-Reset"), c.header.Get("Retry-After")
	if reset == "" || reset != retry || retry != strconv.FormatInt(*c.body.RetryAfterSeconds, 10) {
		t.Errorf("RateLimit-Reset %q, Retry-After %q, retry_after_seconds %d: want all three equal", reset, retry, *c.body.RetryAfterSeconds)
	}
	if l, rem := rawHeader(c.header, "RateLimit-Limit"), rawHeader(c.header, "RateLimit-Remaining"); l != "20" || rem != "0" {
		t.Errorf("RateLimit-Limit %q Remaining %q, want those of the minute window: 20 and 0", l, rem)
	}
}

// The admin API speaks the checks' convention: RateLimit-* with the reset in seconds,
// no X-RateLimit-*; over the limit, RateLimit-Reset is Retry-After.
func TestAdminRateLimitHeaders(t *testing.T) {
	f := mustRateLimited(t, 2)
	tok := f.tokens["acme-admin"]
	for i := range 3 {
		rec := f.do("GET", "/v1/orgs/acme/teams", tok, "")
		h := rec.Header()
		for name := range h {
			if len(name) > 12 && name[:12] == "X-Ratelimit-" {
				t.Errorf("request %d: %s sent", i+1, name)
			}
		}
		reset, err := strconv.Atoi(rawHeader(h, "RateLimit-Reset"))
		if err != nil || reset < 0 || reset > 60 || rawHeader(h, "RateLimit-Limit") != "2" {
			t.Errorf("request %d: RateLimit-Limit %q Reset %q, want 2 and seconds within the minute window", i+1,
				rawHeader(h, "RateLimit-Limit"), rawHeader(h, "RateLimit-Reset"))
		}
		if i == 2 && (rec.Code != 429 || rawHeader(h, "RateLimit-Reset") != h.Get("Retry-After") || rawHeader(h, "RateLimit-Remaining") != "0") {
			t.Errorf("over the limit: %d Reset %q Retry-After %q Remaining %q", rec.Code, rawHeader(h, "RateLimit-Reset"),
				h.Get("Retry-After"), rawHeader(h, "RateLimit-Remaining"))
		}
		// The draft-11 fields of its one policy, "admin", agree with the legacy ones.
		pl, err1 := httpsfv.UnmarshalList(h["RateLimit-Policy"])
		rl, err2 := httpsfv.UnmarshalList(h["RateLimit"])
		if err1 != nil || err2 != nil || len(pl) != 1 || len(rl) != 1 {
			t.Fatalf("request %d: RateLimit-Policy %q RateLimit %q: %v %v", i+1, h["RateLimit-Policy"], h["RateLimit"], err1, err2)
		}
		p, l := pl[0].(httpsfv.Item), rl[0].(httpsfv.Item)
		q, _ := p.Params.Get("q")
		w, _ := p.Params.Get("w")
		r, _ := l.Params.Get("r")
		tt, _ := l.Params.Get("t")
		if p.Value != "admin" || l.Value != "admin" || q != int64(2) || w != int64(60) ||
			fmt.Sprint(r) != rawHeader(h, "RateLimit-Remaining") || fmt.Sprint(tt) != rawHeader(h, "RateLimit-Reset") {
			t.Errorf("request %d: RateLimit-Policy %q RateLimit %q vs Remaining %q Reset %q", i+1, h["RateLimit-Policy"], h["RateLimit"],
				rawHeader(h, "RateLimit-Remaining"), rawHeader(h, "RateLimit-Reset"))
		}
		if i == 2 {
			var doc struct {
				Type             string   `json:"type"`
				Status           int      `json:"status"`
				ViolatedPolicies []string `json:"violated-policies"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil || doc.Type != "https://quotaplane.dev/problems/too-many-requests" ||
				doc.Status != 429 || !slices.Equal(doc.ViolatedPolicies, []string{"admin"}) {
				t.Errorf("429's problem document: %s", rec.Body)
			}
		}
	}
}

// draftPolicy is a RateLimit-Policy item as httpsfv parses it.
type draftPolicy struct {
	q, w  int64
	hasW  bool
	unit  string
	order int
}

// draftFields parses the RateLimit-Policy and RateLimit fields of h with httpsfv (a
// structured-field library, RFC 9651) and checks the draft-11 shapes: String names,
// integer q (w, r, t), qu a string, one RateLimit item. It returns the policies by name
// and the RateLimit item's name, r and t (t -1 when absent).
func draftFields(t *testing.T, h http.Header) (map[string]draftPolicy, string, int64, int64) {
	t.Helper()
	pl, err := httpsfv.UnmarshalList(h["RateLimit-Policy"])
	if err != nil || len(pl) == 0 {
		t.Fatalf("RateLimit-Policy %q: %v", h["RateLimit-Policy"], err)
	}
	policies := map[string]draftPolicy{}
	for i, m := range pl {
		it, ok := m.(httpsfv.Item)
		name, isString := it.Value.(string)
		if !ok || !isString {
			t.Fatalf("RateLimit-Policy item %d: %#v, want a String name", i, m)
		}
		if _, dup := policies[name]; dup {
			t.Errorf("RateLimit-Policy names %q twice", name)
		}
		p := draftPolicy{order: i}
		q, _ := it.Params.Get("q")
		if p.q, ok = q.(int64); !ok {
			t.Errorf("policy %q: q %#v, want an integer", name, q)
		}
		if w, has := it.Params.Get("w"); has {
			if p.w, ok = w.(int64); !ok || p.w <= 0 {
				t.Errorf("policy %q: w %#v, want a positive integer", name, w)
			}
			p.hasW = true
		}
		if qu, has := it.Params.Get("qu"); has {
			if p.unit, ok = qu.(string); !ok {
				t.Errorf("policy %q: qu %#v, want a string", name, qu)
			}
		}
		if _, has := it.Params.Get("pk"); has {
			t.Errorf("policy %q: a pk, which Quotaplane does not send", name)
		}
		policies[name] = p
	}
	rl, err := httpsfv.UnmarshalList(h["RateLimit"])
	if err != nil || len(rl) != 1 {
		t.Fatalf("RateLimit %q: %v, want one item", h["RateLimit"], err)
	}
	it, ok := rl[0].(httpsfv.Item)
	name, isString := it.Value.(string)
	if !ok || !isString {
		t.Fatalf("RateLimit item: %#v, want a String name", rl[0])
	}
	rv, _ := it.Params.Get("r")
	r, ok := rv.(int64)
	if !ok {
		t.Errorf("RateLimit r %#v, want an integer", rv)
	}
	tt := int64(-1)
	if tv, has := it.Params.Get("t"); has {
		if tt, ok = tv.(int64); !ok {
			t.Errorf("RateLimit t %#v, want an integer", tv)
		}
	}
	return policies, name, r, tt
}

// windowSeconds is the w a window's policy carries; 0: none.
var windowSeconds = map[string]int64{"second": 1, "minute": 60, "hour": 3600, "day": 86400}

// agreeFields checks that the draft-11 fields of an answer agree with its body's
// levels (one policy per level and window, q its limit, w its window), with the legacy
// RateLimit-Limit, -Remaining and -Reset (the RateLimit item is the policy they
// describe) and, on a denial, with Retry-After and the body's violated-policies.
func agreeFields(t *testing.T, what string, h http.Header, levels []api.LevelStatus, denied *api.CheckResult) {
	t.Helper()
	policies, name, r, reset := draftFields(t, h)
	if len(policies) != len(levels) {
		t.Errorf("%s: %d policies for %d levels: %q", what, len(policies), len(levels), h["RateLimit-Policy"])
	}
	for i, l := range levels {
		metric := "requests"
		if l.Metric != nil {
			metric = *l.Metric
		}
		pn := checks.PolicyName(metric, l.Level, l.Window)
		p, ok := policies[pn]
		w, hasW := windowSeconds[string(l.Window)]
		if !ok || p.q != l.Limit || p.hasW != hasW || p.w != w || p.order != i {
			t.Errorf("%s: level %s %s %s (limit %d): policy %q %+v", what, l.Level, l.Id, l.Window, l.Limit, pn, p)
		}
	}
	limit, remaining, legacyReset := rawHeader(h, "RateLimit-Limit"), rawHeader(h, "RateLimit-Remaining"), rawHeader(h, "RateLimit-Reset")
	if fmt.Sprint(policies[name].q) != limit || fmt.Sprint(r) != remaining || fmt.Sprint(reset) != legacyReset {
		t.Errorf("%s: RateLimit %q (q %d) vs RateLimit-Limit %q -Remaining %q -Reset %q", what, h["RateLimit"], policies[name].q, limit, remaining, legacyReset)
	}
	if denied == nil {
		return
	}
	if retry := h.Get("Retry-After"); fmt.Sprint(reset) != retry { // r may be above 0: a cost larger than what is left
		t.Errorf("%s: RateLimit %q, Retry-After %q: want t = Retry-After", what, h["RateLimit"], retry)
	}
	b := denied.BlockedAt
	metric := "requests"
	if b != nil && b.Metric != nil {
		metric = *b.Metric
	}
	if b == nil || denied.ViolatedPolicies == nil || !slices.Equal(*denied.ViolatedPolicies, []string{checks.PolicyName(metric, b.Level, b.Window)}) ||
		(*denied.ViolatedPolicies)[0] != name {
		t.Errorf("%s: violated-policies %v, blocked_at %+v, RateLimit %q: want the blocked limit's policy", what, denied.ViolatedPolicies, b, name)
	}
}

// The draft-11 fields of checks and reservations, parsed with a structured-field
// library, agree with the legacy fields, the levels and Retry-After; a denial's body
// (a check's, a reservation's, a batch item's) names the violated policy.
func TestDraftRateLimitFields(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	key, _ := r.setup("acme") // org: 20 a minute, 1000 a month; eng's users: 500 a month
	body := `{"org":"acme","team":"eng","user":"alice"}`
	c := r.check(key, body)
	if c.code != 200 || len(c.body.Levels) != 3 {
		t.Fatalf("check = %d %s", c.code, c.raw)
	}
	agreeFields(t, "allowed check", c.header, c.body.Levels, nil)
	if got := c.header["RateLimit-Policy"]; len(got) != 1 || got[0] != `"org-minute";q=20;w=60, "org-month";q=1000, "user-month";q=500` {
		t.Errorf("RateLimit-Policy %q", got)
	}
	if name, _ := httpsfv.UnmarshalList(c.header["RateLimit"]); len(name) != 1 || name[0].(httpsfv.Item).Value != "org-minute" {
		t.Errorf("RateLimit %q: want the tightest, the org's minute", c.header["RateLimit"])
	}
	if c.body.ViolatedPolicies != nil {
		t.Errorf("allowed check names violated policies: %s", c.raw)
	}

	// A reservation: held, then refused.
	rec := r.f.do("POST", "/v1/reservations", key, `{"org":"acme","team":"eng","user":"alice","amount":2}`)
	var held api.Reservation
	if err := json.Unmarshal(rec.Body.Bytes(), &held); err != nil || rec.Code != 201 || held.Levels == nil {
		t.Fatalf("reserve = %d %s", rec.Code, rec.Body)
	}
	agreeFields(t, "held reservation", rec.Header(), *held.Levels, nil)
	rec = r.f.do("POST", "/v1/reservations", key, `{"org":"acme","team":"eng","user":"alice","amount":900}`)
	var refused api.CheckResult
	if err := json.Unmarshal(rec.Body.Bytes(), &refused); err != nil || rec.Code != 429 {
		t.Fatalf("reserve over the limits = %d %s", rec.Code, rec.Body)
	}
	agreeFields(t, "refused reservation", rec.Header(), refused.Levels, &refused)

	// Checks until the minute is spent: the denial.
	for range 20 {
		if c = r.check(key, body); c.code == 429 {
			break
		}
	}
	if c.code != 429 {
		t.Fatalf("no denial in 20 checks: %s", c.raw)
	}
	agreeFields(t, "denied check", c.header, c.body.Levels, &c.body)
	if got := c.header["RateLimit"]; len(got) != 1 || got[0] != `"org-minute";r=0;t=`+c.header.Get("Retry-After") {
		t.Errorf("RateLimit %q, Retry-After %q", got, c.header.Get("Retry-After"))
	}

	// A batch's denied item carries violated-policies (the batch's header fields
	// are TestBatchCarriesTheTightestItemsFields's).
	rec = r.f.do("POST", "/v1/check/batch", key, `{"checks":[`+body+`]}`)
	var batch struct {
		Results []api.CheckResult `json:"results"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &batch); err != nil || rec.Code != 200 || len(batch.Results) != 1 {
		t.Fatalf("batch = %d %s", rec.Code, rec.Body)
	}
	if v := batch.Results[0].ViolatedPolicies; batch.Results[0].Allowed || v == nil || !slices.Equal(*v, []string{"org-minute"}) {
		t.Errorf("batch item: %s", rec.Body)
	}
}

// QUOTA_RATELIMIT_HEADERS turns either generation off, or both, on checks and
// reservations, allowed or denied; the body's violated-policies stays.
func TestRateLimitHeadersSetting(t *testing.T) {
	draft := []string{"RateLimit-Policy", "RateLimit"}
	legacy := []string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"}
	for _, tc := range []struct {
		mode       checks.HeaderMode
		sent, none []string
	}{
		{checks.HeadersBoth, append(slices.Clone(draft), legacy...), nil},
		{checks.HeadersDraft, draft, legacy},
		{checks.HeadersLegacy, legacy, draft},
		{checks.HeadersOff, nil, append(slices.Clone(draft), legacy...)},
	} {
		t.Run(fmt.Sprint(tc.mode), func(t *testing.T) {
			prefix := testenv.ID(t, "h")
			r := newReplicaOn(t, testenv.PostgresURL(t), prefix, time.Hour, prometheus.NewRegistry(), quota.Config{KeyPrefix: prefix},
				testenv.RedisURL(t), testenv.Redis(t), func(d *httpapi.Deps) { d.RateLimitHeaders = tc.mode })
			key, _ := r.setup("acme")
			body := `{"org":"acme","team":"eng","user":"alice","cost":20}`
			allowed := r.check(key, body)
			denied := r.check(key, body)
			rec := r.f.do("POST", "/v1/reservations", key, `{"org":"acme","team":"eng","user":"alice","amount":1}`)
			if allowed.code != 200 || denied.code != 429 || rec.Code != 429 {
				t.Fatalf("checks %d %d, reservation %d: %s", allowed.code, denied.code, rec.Code, rec.Body)
			}
			for what, h := range map[string]http.Header{"allowed": allowed.header, "denied": denied.header, "refused reservation": rec.Header()} {
				for _, name := range tc.sent {
					if len(h[name]) != 1 {
						t.Errorf("%s: %s = %q, want it sent", what, name, h[name])
					}
				}
				for _, name := range tc.none {
					if h[name] != nil || h.Values(name) != nil {
						t.Errorf("%s: %s = %q, want none", what, name, h[name])
					}
				}
			}
			if v := denied.body.ViolatedPolicies; v == nil || !slices.Equal(*v, []string{"org-minute"}) || denied.header.Get("Retry-After") == "" {
				t.Errorf("denied: %s, Retry-After %q", denied.raw, denied.header.Get("Retry-After"))
			}
		})
	}
}

// A batch answer carries both generations of RateLimit fields of its tightest item:
// of allowed items the one with the least remaining, and a denied item before any
// allowed one. Before, a batch carried none.
func TestBatchCarriesTheTightestItemsFields(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	key, _ := r.setup("acme") // org: 20 a minute, 1000 a month; eng's users: 500 a month
	batch := func(body string) (http.Header, []api.CheckResult) {
		t.Helper()
		rec := r.f.do("POST", "/v1/check/batch", key, body)
		var out struct {
			Results []api.CheckResult `json:"results"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || rec.Code != 200 {
			t.Fatalf("batch = %d %s", rec.Code, rec.Body)
		}
		return rec.Header(), out.Results
	}
	h, res := batch(`{"checks":[{"org":"acme","team":"eng","user":"alice","cost":2},{"org":"acme","team":"eng","user":"bob","cost":3},{"org":"acme","team":"eng","user":"carol","cost":0}]}`)
	if len(res) != 3 || !res[0].Allowed || !res[1].Allowed || !res[2].Allowed {
		t.Fatalf("batch: %+v", res)
	}
	// bob's check left 15 of the org's minute, carol's (cost 0) 15 too but it came later.
	agreeFields(t, "allowed batch", h, res[1].Levels, nil)
	if rem := rawHeader(h, "RateLimit-Remaining"); rem != "15" {
		t.Errorf("RateLimit-Remaining %q, want 15 (bob's item, the least remaining)", rem)
	}

	h, res = batch(`{"checks":[{"org":"acme","team":"eng","user":"alice"},{"org":"acme","team":"eng","user":"bob","cost":100},{"org":"acme","team":"eng","user":"zed"}]}`)
	if len(res) != 3 || !res[0].Allowed || res[1].Allowed {
		t.Fatalf("batch: %+v", res)
	}
	policies, name, _, reset := draftFields(t, h)
	if len(policies) != len(res[1].Levels) || res[1].ViolatedPolicies == nil || name != (*res[1].ViolatedPolicies)[0] ||
		res[1].RetryAfterSeconds == nil || reset != *res[1].RetryAfterSeconds {
		t.Errorf("batch with a denied item: RateLimit-Policy %q RateLimit %q, want the denied item's (%v, retry after %v)",
			h["RateLimit-Policy"], h["RateLimit"], res[1].ViolatedPolicies, res[1].RetryAfterSeconds)
	}
	if h.Get("Retry-After") != "" {
		t.Errorf("a batch answers 200: Retry-After %q, want none", h.Get("Retry-After"))
	}

	h, _ = batch(`{"checks":[{"org":"acme","team":"eng","user":"zed","metric":"nope"}]}`) // an item error only
	for _, name := range []string{"RateLimit-Policy", "RateLimit", "RateLimit-Limit"} {
		if h[name] != nil {
			t.Errorf("a batch of item errors: %s = %q, want none", name, h[name])
		}
	}
}
