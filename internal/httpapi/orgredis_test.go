package httpapi_test

import (
	"net"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// An org's redis_url is checked when set, so no Redis that never answers is stored
// for the worker to warn about forever: 422 naming the field, in the API's words, with
// nothing stored; "redis_url_check": false stores it anyway (a Redis that comes
// later); a Redis that answers is stored.
func TestOrgRedisURLIsCheckedWhenSet(t *testing.T) {
	f := mustFixture(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "redis://" + ln.Addr().String() + "/0"
	ln.Close()

	create := func(id, extra string) (int, string) {
		rec := f.do("POST", "/v1/orgs", operatorToken, `{"id":"`+id+`","name":"N","plan":"pro"`+extra+`}`)
		return rec.Code, rec.Body.String()
	}
	code, body := create("deadone", `,"redis_url":"`+dead+`"`)
	if code != 422 || !strings.Contains(body, `"field":"redis_url"`) || !strings.Contains(body, "connection refused") ||
		!strings.Contains(body, "redis_url_check") || strings.Contains(body, "dial tcp") {
		t.Errorf("an unreachable redis_url: %d %s; want 422 naming redis_url, why, and the override", code, body)
	}
	if rec := f.do("GET", "/v1/orgs/deadone", operatorToken, ""); rec.Code != 404 {
		t.Errorf("the refused org was stored: %d", rec.Code)
	}
	// A bad URL is still the validation's 400, not a Redis check.
	if code, body := create("badurl", `,"redis_url":"http://x"`); code != 400 {
		t.Errorf("a malformed redis_url: %d %s, want 400", code, body)
	}
	if code, body := create("later", `,"redis_url":"`+dead+`","redis_url_check":false`); code != 201 {
		t.Errorf("with redis_url_check false: %d %s, want 201", code, body)
	}
	if code, body := create("live", `,"redis_url":"`+testenv.RedisURL(t)+`"`); code != 201 {
		t.Errorf("a Redis that answers: %d %s, want 201", code, body)
	}

	// PATCH likewise, and a refused change leaves the org as it was.
	rec := f.do("PATCH", "/v1/orgs/acme", operatorToken, `{"redis_url":"`+dead+`"}`)
	if rec.Code != 422 || !strings.Contains(rec.Body.String(), `"field":"redis_url"`) {
		t.Errorf("PATCH to an unreachable redis_url: %d %s", rec.Code, rec.Body.String())
	}
	if rec := f.do("GET", "/v1/orgs/acme", operatorToken, ""); !strings.Contains(rec.Body.String(), `"redis_url":""`) {
		t.Errorf("the refused PATCH changed the org: %s", rec.Body.String())
	}
	if rec := f.do("PATCH", "/v1/orgs/acme", operatorToken, `{"redis_url":"`+dead+`","redis_url_check":false}`); rec.Code != 200 {
		t.Errorf("PATCH with redis_url_check false: %d %s", rec.Code, rec.Body.String())
	}
	if rec := f.do("PATCH", "/v1/orgs/acme", operatorToken, `{"redis_url":""}`); rec.Code != 200 {
		t.Errorf("clearing redis_url: %d %s", rec.Code, rec.Body.String())
	}
}
