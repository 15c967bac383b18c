package rls

// An internal test: how answer renders a token bucket and a denial that can never
// pass, before the engine decides buckets.

import (
	"testing"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

func TestAnswerOfABucket(t *testing.T) {
	level := vocab.LevelStatus{Metric: "requests", Level: vocab.LevelUser, ID: "ada", Window: vocab.Second, Limit: 10, Burst: 30, Used: 5, Remaining: 25}
	for _, tc := range []struct {
		name      string
		retry     int64
		wantRetry string
	}{{"never fits", 0, ""}, {"fits in 2 s", 2, "2"}} {
		t.Run(tc.name, func(t *testing.T) {
			rl := checks.RateLimit{Level: level, Limit: 10, Remaining: 25, Reset: 1}
			p := checks.Paths{
				Checks:  []checks.PathCheck{{Metric: "requests", RateLimit: rl, HasRateLimit: true}},
				Allowed: false, RateLimit: rl, HasRateLimit: true, RetryAfter: tc.retry,
				Levels: []vocab.LevelStatus{level}, Violated: "user-second",
			}
			out := answer(p, nil, checks.HeadersBoth)
			st := out.GetStatuses()[0]
			if l := st.GetCurrentLimit(); l.GetRequestsPerUnit() != 10 || l.GetUnit().String() != "SECOND" ||
				st.GetLimitRemaining() != 25 || st.GetDurationUntilReset().GetSeconds() != 1 {
				t.Errorf("status = %v, want 10 a second, 25 remaining, full in 1 s", st)
			}
			var retry string
			var n int
			for _, h := range out.GetResponseHeadersToAdd() {
				if h.GetKey() == "Retry-After" {
					retry, n = h.GetValue(), n+1
				}
				if h.GetKey() == "RateLimit" && h.GetValue() != `"user-second";r=25;t=1` {
					t.Errorf("RateLimit = %q", h.GetValue())
				}
			}
			if retry != tc.wantRetry || (tc.wantRetry == "") != (n == 0) {
				t.Errorf("Retry-After %q (%d), want %q", retry, n, tc.wantRetry)
			}
		})
	}
}
