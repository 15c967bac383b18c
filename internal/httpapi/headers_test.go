package httpapi_test

import (
	"strconv"
	"testing"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
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
		reset, err := strconv.Atoi(h.Get("RateLimit-Reset"))
		if err != nil || reset < 0 || reset > 60 || h.Get("RateLimit-Limit") != "2" {
			t.Errorf("request %d: RateLimit-Limit %q Reset %q, want 2 and seconds within the minute window", i+1,
				h.Get("RateLimit-Limit"), h.Get("RateLimit-Reset"))
		}
		if i == 2 && (rec.Code != 429 || h.Get("RateLimit-Reset") != h.Get("Retry-After") || h.Get("RateLimit-Remaining") != "0") {
			t.Errorf("over the limit: %d Reset %q Retry-After %q Remaining %q", rec.Code, h.Get("RateLimit-Reset"),
				h.Get("Retry-After"), h.Get("RateLimit-Remaining"))
		}
	}
}
