package httpapi_test

import (
	"encoding/base64"
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
)

// A cursor the API did not hand out is the caller's mistake, on every list route: a
// 400 problem naming the cursor, never a 500 from Postgres choking on what it decodes to.
func TestBadCursorOnEveryListRoute(t *testing.T) {
	f := mustFixture(t)
	b64 := base64.RawURLEncoding.EncodeToString
	cursors := map[string]string{
		"not base64":              "!!",
		"base64 of invalid UTF-8": b64([]byte{0xff, 0xfe, 0xfd}),
		"base64 with a NUL byte":  b64([]byte("acme\x00")),
		"base64 of a long key":    b64([]byte(strings.Repeat("z", 600))),
		"huge":                    strings.Repeat("A", 5000),
		"base64 of a spaced key":  b64([]byte(" 12")),
	}
	lists := 0
	for _, o := range specOps(t) {
		hasCursor := false
		for _, p := range o.op.Parameters {
			hasCursor = hasCursor || (p.Value.In == "query" && p.Value.Name == "cursor")
		}
		if !hasCursor {
			continue
		}
		lists++
		path, err := o.url(f, "acme")
		if err != nil {
			t.Fatal(err)
		}
		for name, c := range cursors {
			t.Run(o.id+"/"+name, func(t *testing.T) {
				before := f.fingerprint()
				rec := f.do(o.method, path+"?cursor="+url.QueryEscape(c), f.tokens["operator"], "")
				if rec.Code != 400 {
					t.Fatalf("%s %s = %d, want 400: %s", o.method, path, rec.Code, rec.Body)
				}
				var p api.Problem
				if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
					t.Fatal(err)
				}
				if len(p.Errors) != 1 || p.Errors[0].Field != "cursor" {
					t.Errorf("problem = %s, want one field error naming cursor", rec.Body)
				}
				if f.fingerprint() != before {
					t.Errorf("a refused list changed the database")
				}
			})
		}
	}
	if lists < 8 {
		t.Fatalf("found %d list routes in the spec, want every one of them (at least 8)", lists)
	}
}
