package middleware_test

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/client"
	"github.com/quotaplane/quotaplane/client/middleware"
)

func TestDeny(t *testing.T) {
	for _, tc := range []struct {
		name       string
		blocked    *client.LevelRef
		retryAfter time.Duration
		rl         client.RateLimit
		wantRetry  string
		want       middleware.Problem
	}{
		{"user's minute", &client.LevelRef{Level: "user", ID: "alice", Window: "minute"}, 1500 * time.Millisecond,
			client.RateLimit{Limit: 60, Remaining: 0, Reset: 1500 * time.Millisecond, Policy: "user-minute"}, "2",
			middleware.Problem{Type: "https://quotaplane.dev/problems/too-many-requests", Title: "Too Many Requests", Status: 429,
				Detail: `over quota at user "alice" (minute window); retry in 2 s`, RetryAfterSeconds: 2,
				BlockedAt: &client.LevelRef{Level: "user", ID: "alice", Window: "minute"}, ViolatedPolicies: []string{"user-minute"}}},
		{"a level, no wait: never fits, no Retry-After", &client.LevelRef{Level: "user", ID: "bob", Window: "second"}, 0,
			client.RateLimit{Limit: 10, Remaining: 3, Reset: 2 * time.Second}, "",
			middleware.Problem{Type: "https://quotaplane.dev/problems/too-many-requests", Title: "Too Many Requests", Status: 429,
				Detail:    `over quota at user "bob" (second window); the cost can never fit`,
				BlockedAt: &client.LevelRef{Level: "user", ID: "bob", Window: "second"}}},
		{"no level, no wait: at least 1 s", nil, 0, client.RateLimit{}, "1",
			middleware.Problem{Type: "https://quotaplane.dev/problems/too-many-requests", Title: "Too Many Requests", Status: 429,
				Detail: "over quota; retry in 1 s", RetryAfterSeconds: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			middleware.Deny(rec, tc.blocked, tc.retryAfter, tc.rl)
			h := rec.Header()
			wantReset := tc.wantRetry // on a denial RateLimit-Reset is Retry-After; without one, the bucket's own
			if wantReset == "" {
				wantReset = fmt.Sprint(int64(tc.rl.Reset / time.Second))
			}
			if rec.Code != 429 || h.Get("Content-Type") != "application/problem+json" || h.Get("Retry-After") != tc.wantRetry ||
				h["RateLimit-Limit"] == nil || h["RateLimit-Reset"][0] != wantReset {
				t.Errorf("%d, headers %v", rec.Code, h)
			}
			// The draft-11 RateLimit field, when the answer named its policy.
			if wantRL := tc.rl.Policy; wantRL != "" && (len(h["RateLimit"]) != 1 || h["RateLimit"][0] != `"`+wantRL+`";r=0;t=`+wantReset) ||
				wantRL == "" && h["RateLimit"] != nil {
				t.Errorf("RateLimit %q", h["RateLimit"])
			}
			var got middleware.Problem
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("problem %+v, want %+v", got, tc.want)
			}
		})
	}
}
