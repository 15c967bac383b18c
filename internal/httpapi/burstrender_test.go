package httpapi

// An internal test: how a decision with token buckets renders, before the engine
// decides buckets (the rendering functions are unexported).

import (
	"net/http"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

func bucketDecision(retryAfter int64) checks.Decision {
	reset := time.Date(2026, 12, 7, 10, 0, 3, 0, time.UTC)
	return checks.Decision{
		Mode: vocab.Enforce,
		Result: vocab.Result{
			Levels: []vocab.LevelStatus{
				{Level: vocab.LevelOrg, ID: "acme", Window: vocab.Month, Limit: 1000, Used: 40, Remaining: 960, ResetAt: reset.Add(time.Hour)},
				{Level: vocab.LevelUser, ID: "ada", Window: vocab.Second, Limit: 10, Burst: 30, Used: 30, Remaining: 0, ResetAt: reset},
			},
			BlockedAt: &vocab.Blocked{Level: vocab.LevelUser, ID: "ada", Window: vocab.Second},
		},
		RetryAfter: retryAfter,
	}
}

// A bucket's level carries its burst, a sliding window's none.
func TestLevelBurstRendered(t *testing.T) {
	d := bucketDecision(1)
	out := fromDecision(&d)
	if out.Levels[0].Burst != nil {
		t.Errorf("month level burst = %d, want none", *out.Levels[0].Burst)
	}
	if b := out.Levels[1].Burst; b == nil || *b != 30 || out.Levels[1].Limit != 10 || out.Levels[1].Remaining != 0 {
		t.Errorf("bucket level = %+v, want limit 10, burst 30, remaining 0", out.Levels[1])
	}
}

// A denial that can never pass (RetryAfter 0: a cost above a bucket's burst) is a 429
// without Retry-After, in the header and the body; any other denial carries both.
func TestNeverFitsHasNoRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		name  string
		retry int64
		want  string
	}{{"never fits", 0, ""}, {"fits in 3 s", 3, "3"}} {
		t.Run(tc.name, func(t *testing.T) {
			d := bucketDecision(tc.retry)
			h := http.Header{}
			setRetryAfter(h, &d)
			if _, set := h["Retry-After"]; set != (tc.want != "") || h.Get("Retry-After") != tc.want {
				t.Errorf("Retry-After = %q (set %v), want %q", h.Get("Retry-After"), set, tc.want)
			}
			out := fromDecision(&d)
			switch {
			case tc.want == "" && out.RetryAfterSeconds != nil:
				t.Errorf("retry_after_seconds = %d, want none", *out.RetryAfterSeconds)
			case tc.want != "" && (out.RetryAfterSeconds == nil || *out.RetryAfterSeconds != tc.retry):
				t.Errorf("retry_after_seconds = %v, want %d", out.RetryAfterSeconds, tc.retry)
			}
			if out.BlockedAt == nil || out.Allowed {
				t.Errorf("a denial renders allowed %v, blocked_at %v", out.Allowed, out.BlockedAt)
			}
		})
	}
}
