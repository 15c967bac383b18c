package checks

import (
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// A denied multi-metric check is described by the limit that refused it, of its own
// metric: the org's month of tokens, not the org's month of requests before it.
func TestTightestOfADeniedMultiMetricCheck(t *testing.T) {
	now := time.Date(2026, 11, 27, 16, 0, 0, 0, time.UTC)
	month := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	res := vocab.Result{Levels: []vocab.LevelStatus{
		{Metric: "requests", Level: vocab.LevelOrg, ID: "demo", Window: vocab.Month, Limit: 100000, Used: 401, Remaining: 99599, ResetAt: month},
		{Metric: "tokens", Level: vocab.LevelOrg, ID: "demo", Window: vocab.Month, Limit: 5000000, Used: 1234, Remaining: 4998766, ResetAt: month},
	}, BlockedAt: &vocab.Blocked{Metric: "tokens", Level: vocab.LevelOrg, ID: "demo", Window: vocab.Month}, RetryAfter: 90 * time.Second}
	rl, ok := tightest(res, now, "requests")
	if !ok || rl.Level.Metric != "tokens" || rl.Limit != 5000000 || rl.Remaining != 4998766 || rl.Reset != 90 {
		t.Errorf("tightest = %+v, want the tokens' month, reset at the retry", rl)
	}
	if got := LimitField(rl); got != `"tokens-org-month";r=4998766;t=90` {
		t.Errorf("RateLimit %q", got)
	}
}

// A denial that can never pass (RetryAfter 0: a cost above a bucket's burst) resets,
// in the RateLimit fields, when the bucket that refused it is full again.
func TestTightestOfACheckThatCanNeverPass(t *testing.T) {
	now := time.Date(2026, 11, 27, 16, 0, 0, 0, time.UTC)
	res := vocab.Result{Levels: []vocab.LevelStatus{
		{Level: vocab.LevelOrg, ID: "demo", Window: vocab.Month, Limit: 1000, Used: 1, Remaining: 999, ResetAt: now.Add(72 * time.Hour)},
		{Level: vocab.LevelUser, ID: "ada", Window: vocab.Second, Limit: 10, Burst: 30, Used: 5, Remaining: 25, ResetAt: now.Add(500 * time.Millisecond)},
	}, BlockedAt: &vocab.Blocked{Level: vocab.LevelUser, ID: "ada", Window: vocab.Second}}
	rl, ok := tightest(res, now, "requests")
	if !ok || rl.Level.Window != vocab.Second || rl.Limit != 10 || rl.Remaining != 25 || rl.Reset != 1 {
		t.Errorf("tightest = %+v, want the user's bucket: 25 tokens, full in 1 s", rl)
	}
}
